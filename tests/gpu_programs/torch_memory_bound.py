"""One rank of the memory-bound operators' check on a gc3 group (runtime_cuda/torch_dist/ops.py:
fused_gemv_all_reduce, fused_embedding_bag_all_to_all, fused_all_reduce_epilogue), every
rank in its own process (ranks may share one GPU):

- each operator, sequential and forced fused, against an fp32 reference: the sequential
  path within a rounding of it, the fused path no worse than the sequential one, and
  bit-identical across ranks where every rank holds the same result;
- the check itself rejects a result whose peers are shifted by one (the result a peer
  index off by one would give, built in torch: a negative control of the check, not a
  hook inside the kernels);
- CUDA-graph capture and replay of the sequential path, on new inputs;
- back-to-back calls of alternating operators with no synchronisation;
- auto: a shape the measured table (GC3_CONFIG's fused section) marks fused runs
  runtime_cuda.fused, a shape it marks sequential and an unmeasured one do not.

    python torch_memory_bound.py RANK WORLD STORE_PATH [TABLE_JSON] [--device cpu]

`--device cpu` runs the sequential paths, the references and the negative controls on
gloo (the CPU half of the gc3 group), where there is no GPU.  Prints "PASS <name>" per
check and "ALL OK rank=R" at the end; any failure raises.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

import torch_rank
from runtime_cuda.torch_dist import ops

rank, world, dev, pg = torch_rank.join(sys.argv)
table_path = sys.argv[4] if len(sys.argv) > 4 and not sys.argv[4].startswith("--") else None
on = dev.type
G = world
# bf16 where the fused programs run; gloo gets fp32.
dt = torch.bfloat16 if on == "cuda" else torch.float32
if on == "cuda":
    # The test's own stream, not the default one: every path must run on the caller's stream.
    user = torch.cuda.Stream()
    torch.cuda.set_stream(user)


def passed(name):
    print(f"PASS {name} rank={rank}", flush=True)


def inputs(seed, r, shape, dtype=dt, scale=1.0):
    g = torch.Generator(device=dev)
    g.manual_seed(seed * 1000 + r)
    return (torch.randn(shape, generator=g, device=dev) * scale).to(dtype)




def error(got, ref):
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def rounding(t):
    """The relative error one rounding to t's dtype may add, per addend, with room for a few."""
    return 2 ** -6 if t.dtype in (torch.bfloat16, torch.float16) else 2 ** -18


def sane(name, seq, ref):
    """The sequential path is right on its own: within a few roundings of the fp32 reference."""
    e = error(seq, ref)
    if not e <= rounding(seq):
        raise AssertionError(f"rank {rank}: {name}: sequential error {e:.3e} against fp32")
    passed(f"{name} sequential")


def close(name, got, ref, seq):
    """got's error against the fp32 reference is no larger than the sequential path's (+ a rounding)."""
    e_got, e_seq = error(got, ref), error(seq, ref)
    if not e_got <= max(1.25 * e_seq, e_seq + rounding(got) / 4):
        raise AssertionError(f"rank {rank}: {name}: error {e_got:.3e} against fp32, sequential path {e_seq:.3e}")
    passed(name)


# --- the operators: each as (operands(seed), call(operands, path), fp32 reference(seed), reduced) -----------------
# `reduced`: every rank holds the same result (an all-reduce), which must then have the same bits.
B_RANK, POOL = 4, 3                  # samples per rank; bags hold 0..3 indices
T, ROWS, DIM = 3, 50, 16
BATCH, KR, N = 3, 96, 3 * 64 + 40    # the GEMV: x [BATCH, KR] per rank, w [KR, N]


def gemv(seed, r=None, shape=(BATCH, KR, N)):
    r = rank if r is None else r
    b, k, n = shape
    return inputs(seed, r, (b, k)), inputs(seed + 1, r, (k, n), scale=k ** -0.5)


def gemv_part(seed, r, shape=(BATCH, KR, N)):
    x, w = gemv(seed, r, shape)
    return x.float() @ w.float()


# Columns that no 16-byte load fits (the kernel's element-wise passes), and a decode layer
# spread over every SM of the GPU (many tiles, batch 1 and the tensor-core batch).
GEMV_ODD, GEMV_WIDE, GEMV_WIDE8 = (5, 40, 3 * 64 + 43), (1, 1024, 8192), (8, 512, 4096)


def gemv_op(shape):
    return (lambda s: gemv(s, shape=shape), lambda a, path: ops.fused_gemv_all_reduce(*a, pg, path=path),
            lambda s: sum(gemv_part(s, r, shape) for r in range(world)), True)


def bags(seed, r=None, garbage=False):
    """Rank r's tables, indices [T, B*POOL] and offsets [T, B+1]: bags of 0..3 indices, so
    positions past a table's last bag are no bag's (garbage: filled with -1 there)."""
    r = rank if r is None else r
    g = torch.Generator().manual_seed(seed * 1000 + r)
    B = B_RANK * G
    tables = torch.randn(T, ROWS, DIM, generator=g).to(dt)
    counts = torch.randint(0, POOL + 1, (T, B), generator=g)
    offsets = torch.cat([torch.zeros(T, 1, dtype=torch.long), counts.cumsum(1)], 1)
    indices = torch.randint(0, ROWS, (T, B * POOL), generator=g)
    if garbage:
        indices[torch.arange(B * POOL) >= offsets[:, -1:]] = -1
    return tables.to(dev), indices.to(dev, torch.int32), offsets.to(dev, torch.int32)


def pooled(seed, r, garbage=False):
    """[B, T*DIM] fp32: rank r's tables pooled for the global batch, bag by bag."""
    tables, indices, offsets = (a.cpu() for a in bags(seed, r, garbage))
    rows = [torch.cat([tables[t].float()[indices[t, offsets[t, s]:offsets[t, s + 1]].long()].sum(0)
                       for t in range(T)]) for s in range(B_RANK * G)]
    return torch.stack(rows).to(dev)


def ebag_ref(seed, garbage=False):
    return torch.stack([pooled(seed, q, garbage)[rank * B_RANK:(rank + 1) * B_RANK] for q in range(world)])


EPI_ROWS, EPI_COLS = 37, 64          # 4.7 KB of bf16; "ring" (a name kept from an older fused path): 150 KB


def epi(seed, r=None, rows=EPI_ROWS, dtype=dt):
    r = rank if r is None else r
    return {"x": inputs(seed, r, (rows, EPI_COLS), dtype), "scale": 1.0 / G,
            "bias": inputs(seed + 1, 0, (EPI_COLS,), dtype), "residual": inputs(seed + 2, 0, (rows, EPI_COLS), dtype)}


def epi_ref(seed, rows=EPI_ROWS, dtype=dt):
    args = epi(seed, 0, rows, dtype)
    total = sum(epi(seed, r, rows, dtype)["x"].float() for r in range(world))
    return total * args["scale"] + args["bias"].float() + args["residual"].float()


def epilogue_call(a, path, out_dtype=None):
    return ops.fused_all_reduce_epilogue(a["x"], pg, a["scale"], a["bias"], a["residual"], out_dtype, path=path)


OPS = {
    "gemv_ar": (gemv, lambda a, path: ops.fused_gemv_all_reduce(*a, pg, path=path),
                lambda s: sum(gemv_part(s, r) for r in range(world)), True),
    "gemv_ar vector": (lambda s: (gemv(s)[0][0], gemv(s)[1]),
                       lambda a, path: ops.fused_gemv_all_reduce(*a, pg, path=path),
                       lambda s: sum(gemv_part(s, r)[0] for r in range(world)), True),
    "gemv_ar odd columns": gemv_op(GEMV_ODD),
    "gemv_ar decode wide": gemv_op(GEMV_WIDE),
    "gemv_ar batch 8 wide": gemv_op(GEMV_WIDE8),
    "ebag_a2a": (bags, lambda a, path: ops.fused_embedding_bag_all_to_all(*a, pg, path=path), ebag_ref, False),
    "ar_epilogue": (epi, epilogue_call, epi_ref, True),
    "ar_epilogue ring": (lambda s: epi(s, rows=1200), epilogue_call, lambda s: epi_ref(s, rows=1200), True),
    "ar_epilogue fp32 cast bf16": (lambda s: epi(s, dtype=torch.float32),
                                   lambda a, path: epilogue_call(a, path, torch.bfloat16),
                                   lambda s: epi_ref(s, dtype=torch.float32), True),
}
PATHS = ("sequential", "fused") if on == "cuda" else ("sequential",)

dist.barrier()
results = {}
for name, (operands, call, reference, reduced) in OPS.items():
    a, ref = operands(1), reference(1)
    seq = call(a, "sequential")
    sane(name, seq, ref)
    results[name] = seq
    if on == "cuda":
        got = call(a, "fused")
        close(f"{name} fused", got, ref, seq)
        results[name] = got
    # Both fused kernels reduce in rank order 0..n-1 on every rank: the ranks must agree.
    if reduced:
        for path in PATHS:
            torch_rank.same_on_all_ranks(f"{name} {path}", call(a, path))
        passed(f"{name} same bits on every rank")

# Positions that are no bag's may hold anything, -1 included: the sequential path never
# reads them as indices.
a = bags(4, garbage=True)
sane("ebag_a2a garbage past the bags", ops.fused_embedding_bag_all_to_all(*a, pg, path="sequential"),
     ebag_ref(4, garbage=True))
# The epilogue's terms may come in out_dtype (the fused path then steps aside).
a = epi(5, dtype=torch.float32)
a["bias"], a["residual"] = a["bias"].to(dt), a["residual"].to(dt)
sane("ar_epilogue terms in out_dtype", epilogue_call(a, None, dt), epi_ref(5, dtype=torch.float32))
assert torch.equal(a["x"], epi(5, dtype=torch.float32)["x"]), f"rank {rank}: the epilogue modified x"
passed("ar_epilogue leaves x unchanged")

# Negative control: what a peer index off by one would give must fail the same checks.
bad = {
    # rank r adds rank r+1's partial where its own belongs (r+1's twice for two ranks)
    "gemv_ar": results["gemv_ar"].float() - gemv_part(1, rank) + gemv_part(1, (rank + 1) % world),
    # block q came from rank q+1
    "ebag_a2a": torch.roll(results["ebag_a2a"].float(), -1, dims=0),
    "ar_epilogue": epi_ref(1) - epi(1)["x"].float() / G + epi(1, (rank + 1) % world)["x"].float() / G,
}
for name, wrong in bad.items():
    operands, call, reference, _ = OPS[name]
    try:
        close(f"{name} shifted peer", wrong, reference(1), results[name])
    except AssertionError:
        passed(f"{name} shifted peer fails the check")
        continue
    raise AssertionError(f"rank {rank}: {name}: a result with its peers shifted by one passed the check")

def tensors(a):
    return [t for t in (a.values() if isinstance(a, dict) else a) if isinstance(t, torch.Tensor)]


if on == "cuda":
    # CUDA graph: capture the sequential path (and the GEMV's and the embedding bag's fused
    # kernels) on static inputs, refill them, replay.
    for name, (operands, call, reference, _) in OPS.items():
        for path in ("sequential", "fused") if name.startswith(("gemv", "ebag")) else ("sequential",):
            a = operands(2)
            seq = call(a, "sequential")
            call(a, path)                     # warm: the set-up runs outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=user):
                out = call(a, path)
            for old, new in zip(tensors(a), tensors(operands(3))):
                old.copy_(new)
            g.replay()
            g.replay()
            if path == "sequential":
                sane(f"{name} cuda graph replay", out, reference(3))
            else:
                close(f"{name} fused cuda graph replay", out, reference(3), call(a, "sequential"))
            del g

    # Back to back: alternating operators and paths, no synchronisation until the end.
    queued = []
    names = list(OPS)
    for i in range(8):
        name = names[i % len(names)]
        operands, call, reference, _ = OPS[name]
        a = operands(10 + i)
        queued.append((name, call(a, PATHS[i % 2]), call(a, "sequential"), 10 + i))
    torch.cuda.synchronize()
    for name, got, seq, seed in queued:
        close(f"back to back {name} seed {seed}", got, OPS[name][2](seed), seq)

    # auto: the measured table decides; counted where ops launches each fused kernel.
    counted = {}
    for fn in ("_gemv_fused", "_ebag_fused", "epilogue_fused"):
        real = getattr(ops, fn)

        def counting(*args, _real=real, _fn=fn, **kw):
            counted[_fn] = counted.get(_fn, 0) + 1
            return _real(*args, **kw)
        setattr(ops, fn, counting)
    entries = json.loads(open(table_path).read())["fused"]["entries"] if table_path else []
    assert table_path is None or os.environ.get("GC3_CONFIG") == table_path
    entry_point = {"gemv_ar": "_gemv_fused", "ebag_a2a": "_ebag_fused", "ar_epilogue": "epilogue_fused"}
    for e in entries + [dict(entries[0], shape=dict(entries[0]["shape"], N=N + 64), path="sequential")]:
        op, shape = e["op"], e["shape"]
        if op == "gemv_ar":
            x = inputs(7, rank, (shape["b"], shape["K"]))
            ops.fused_gemv_all_reduce(x, inputs(8, rank, (shape["K"], shape["N"]), scale=KR ** -0.5), pg)
        elif op == "ebag_a2a":
            tables, indices, offsets = bags(7)
            ops.fused_embedding_bag_all_to_all(tables, indices, offsets, pg)
        else:
            x = inputs(7, rank, (shape["bytes"] // 2 // EPI_COLS, EPI_COLS))
            ops.fused_all_reduce_epilogue(x, pg, scale=0.5)
        fn = entry_point[op]
        took = "fused" if counted.pop(fn, 0) else "sequential"
        if took != e["path"]:
            raise AssertionError(f"rank {rank}: auto took {took} for {op} {shape}, the table says {e['path']}")
        passed(f"auto {op} {took}")
    torch.cuda.synchronize()

torch_rank.finish(rank)
