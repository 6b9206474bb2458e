"""One rank of fused_all_reduce_epilogue's check on a gc3 group (runtime_cuda/torch_dist/ops.py),
every rank in its own process (ranks may share one GPU):

- sizes from 1 element through odd shapes and 16 KiB .. 8 MiB (the small kernels' epilogue build
  up to 2 MiB, the allreduce then the epilogue pass above), bf16, fp16, fp32 and fp32 -> bf16,
  every combination of scale, bias and residual: the fused result's error against an fp32
  reference no larger than the sequential path's, and the same bits on every rank;
- CUDA-graph capture of the fused path (up to 2 MiB), replayed on new input values;
- back-to-back calls of alternating sizes and types with no synchronisation;
- the shifted-peer hook (runtime_cuda.ranks.small_allreduce.SHIFT_PEERS) gives a result the check rejects;
- x is left unchanged.

    python torch_epilogue.py RANK WORLD STORE_PATH

Prints "PASS <name>" per check and "ALL OK rank=R" at the end; any failure raises.
"""
import itertools
import sys

import torch
import torch.distributed as dist

import torch_rank
from runtime_cuda.torch_dist import ops

rank, world, dev, pg = torch_rank.join(sys.argv)
user = torch.cuda.Stream()          # every path must run on the caller's stream, not the default one
torch.cuda.set_stream(user)
MiB = 1 << 20
TERMS = [c for k in (1, 2, 3) for c in itertools.combinations(("scale", "bias", "residual"), k)]
CASTS = [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None), (torch.float32, torch.bfloat16)]

# Count the fused path's runs (first calls and repeats): a call that quietly took the sequential
# path must not pass as fused.
fused_runs = [0]
_real_fused = ops.epilogue_fused


def _counting(*args, **kw):
    out = _real_fused(*args, **kw)
    fused_runs[0] += out[0] is not None
    return out


ops.epilogue_fused = _counting
# A call the group has run before takes the repeat path: one launch, not epilogue_fused.
_real_launch = ops._epilogue_launch


def _counting_launch(*args, **kw):
    fused_runs[0] += 1
    return _real_launch(*args, **kw)


ops._epilogue_launch = _counting_launch


def passed(name):
    print(f"PASS {name} rank={rank}", flush=True)


def shapes(itemsize):
    out = [(1,), (7,), (13, 79), (1021, 515)]
    return out + [(nbytes // itemsize // 256, 256) for nbytes in (16 << 10, 256 << 10, MiB, 2 * MiB, 8 * MiB)]


def tensor(seed, shape, dtype):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return torch.randn(shape, generator=g, device=dev).to(dtype)


def operands(seed, shape, dtype, terms, r=None):
    """Rank r's x, and the scale, bias and residual every rank shares (None where not in terms)."""
    r = rank if r is None else r
    return {"x": tensor(seed * 1000 + r, shape, dtype), "scale": 1.0 / world if "scale" in terms else None,
            "bias": tensor(seed * 1000 + 997, shape[-1:], dtype) if "bias" in terms else None,
            "residual": tensor(seed * 1000 + 998, shape, dtype) if "residual" in terms else None}


def reference(seed, shape, dtype, terms):
    a = operands(seed, shape, dtype, terms)
    y = sum(operands(seed, shape, dtype, (), r)["x"].float() for r in range(world))
    y = y * (1.0 if a["scale"] is None else a["scale"])
    return y + sum(a[k].float() for k in ("bias", "residual") if a[k] is not None)


def run(a, out_dtype, path):
    return ops.fused_all_reduce_epilogue(a["x"], pg, a["scale"], a["bias"], a["residual"], out_dtype, path=path)


def error(got, ref):
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def rounding(t):
    return 2 ** -6 if t.dtype in (torch.bfloat16, torch.float16) else 2 ** -18


def close(name, got, ref, seq):
    e_got, e_seq = error(got, ref), error(seq, ref)
    if not e_got <= max(1.25 * e_seq, e_seq + rounding(got) / 4):
        raise AssertionError(f"rank {rank}: {name}: error {e_got:.3e} against fp32, sequential path {e_seq:.3e}")




def fused(a, out_dtype, name):
    before = fused_runs[0]
    got = run(a, out_dtype, "fused")
    if fused_runs[0] != before + 1:
        raise AssertionError(f"rank {rank}: {name}: the fused path did not run")
    return got


dist.barrier()
seed = 0
for dtype, out_dtype in CASTS:
    odt = out_dtype or dtype
    for i, shape in enumerate(shapes(torch.tensor([], dtype=dtype).element_size())):
        for terms in (TERMS if i in (2, 8) else [("scale", "bias", "residual")]):
            seed += 1
            name = f"{dtype}->{odt} {shape} {'+'.join(terms)}"
            a, ref = operands(seed, shape, dtype, terms), reference(seed, shape, dtype, terms)
            x0 = a["x"].clone()
            seq = run(a, out_dtype, "sequential")
            got = fused(a, out_dtype, name)
            if got.dtype != odt or got.shape != a["x"].shape:
                raise AssertionError(f"rank {rank}: {name}: got {got.dtype} {tuple(got.shape)}")
            close(name, got, ref, seq)
            torch_rank.same_on_all_ranks(name, got)
            if not torch.equal(a["x"], x0):
                raise AssertionError(f"rank {rank}: {name}: the epilogue modified x")
    passed(f"sizes terms {dtype}->{odt}")

# CUDA graph: capture the fused call on static inputs, refill x, replay.
for dtype, out_dtype in ((torch.bfloat16, None), (torch.float32, torch.bfloat16)):
    for shape in ((7,), (33, 257), (2 * MiB // torch.tensor([], dtype=dtype).element_size() // 512, 512)):
        terms = TERMS[-1]
        a = operands(50, shape, dtype, terms)
        fused(a, out_dtype, "graph warm-up")           # set-up (group, build, launch) outside the capture
        torch.cuda.synchronize()
        before = fused_runs[0]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=user):
            out = run(a, out_dtype, "fused")
        if fused_runs[0] != before + 1:
            raise AssertionError(f"rank {rank}: the captured call of {shape} did not take the fused path")
        for rep in range(3):
            a["x"].copy_(operands(60 + rep, shape, dtype, terms)["x"])
            g.replay()
            seq = run(a, out_dtype, "sequential")
            close(f"graph replay {rep} {shape}", out, reference(60 + rep, shape, dtype, terms), seq)
            torch_rank.same_on_all_ranks(f"graph replay {rep} {shape}", out)
        del g
    passed(f"cuda graph replay {dtype}->{out_dtype or dtype}")

# Back to back: alternating sizes (one-shot, two-shot at 4 ranks, the pass) and types, no synchronisation.
queued = []
sizes = [(5, 64), (700, 512), (3000, 1024), (1, 3), (2048, 256)]
for i in range(15):
    dtype, out_dtype = CASTS[i % len(CASTS)]
    shape, terms = sizes[i % len(sizes)], TERMS[i % len(TERMS)]
    a = operands(100 + i, shape, dtype, terms)
    queued.append((f"back to back {i} {shape}", fused(a, out_dtype, "back to back"), run(a, out_dtype, "sequential"),
                   100 + i, shape, dtype, terms, a))
torch.cuda.synchronize()
for name, got, seq, s, shape, dtype, terms, _ in queued:
    close(name, got, reference(s, shape, dtype, terms), seq)
    torch_rank.same_on_all_ranks(name, got)
passed("back to back alternating sizes")

# Repeats: the same operands refilled in place (the repeat path: one kept launch, and above the
# kernels' limit the allreduce into a buffer kept per stream), on two streams, no synchronisation.
other = torch.cuda.Stream(device=dev)
for dtype, out_dtype in ((torch.bfloat16, None), (torch.float32, torch.bfloat16)):
    for shape in ((33, 257), (8 * MiB // torch.tensor([], dtype=dtype).element_size() // 256, 256)):
        a = operands(300, shape, dtype, TERMS[-1])
        queued = []
        for rep in range(4):
            stream = user if rep % 2 == 0 else other
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fresh = operands(310 + rep, shape, dtype, TERMS[-1])
                for k in ("x", "bias", "residual"):      # in place: the addresses the key holds
                    a[k].copy_(fresh[k])
                got = fused(a, out_dtype, f"repeat {rep} {shape}")
                queued.append((rep, got, run(a, out_dtype, "sequential")))
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for rep, got, seq in queued:
            close(f"repeat {rep} {shape} {dtype}", got, reference(310 + rep, shape, dtype, TERMS[-1]), seq)
            torch_rank.same_on_all_ranks(f"repeat {rep} {shape}", got)
passed("repeats on two streams")

# Negative control: the kernels' shifted-peer hook must fail the same check (a shape no earlier
# call used, so its launch is prepared, and built, with the hook on).
from runtime_cuda.ranks import small_allreduce  # noqa: E402
for shape in ((3, 333), (1000, 333)):
    a, ref = operands(200, shape, torch.bfloat16, TERMS[-1]), reference(200, shape, torch.bfloat16, TERMS[-1])
    seq = run(a, None, "sequential")
    small_allreduce.SHIFT_PEERS = True
    try:
        got = fused(a, None, "shifted")
        torch.cuda.synchronize()
    finally:
        small_allreduce.SHIFT_PEERS = False
    try:
        close(f"shifted peer {shape}", got, ref, seq)
    except AssertionError:
        passed(f"shifted peer {shape} fails the check")
        continue
    raise AssertionError(f"rank {rank}: a result with its peers shifted by one passed the check ({shape})")

torch.cuda.synchronize()
torch_rank.finish(rank)
