"""One rank of the GEMM operators' check on a gc3 group (runtime_cuda/torch_dist/ops.py,
overlap.py), run with every rank in its own process (ranks may share one GPU):

- each operator, forced fused at several chunk counts, against an fp32
  reference (error no larger than the sequential path's) and bit-identical
  across ranks where every rank holds the same result;
- CUDA-graph capture and replay of each fused operator, on new inputs;
- back-to-back calls of alternating shapes with no synchronisation;
- auto: a shape the measured table (GC3_CONFIG's fused section) marks fused
  runs the pipeline, a shape it marks sequential and an unmeasured one do not.

    python torch_fused.py RANK WORLD STORE_PATH TABLE_JSON

Prints "PASS <name>" per check and "ALL OK rank=R" at the end; any failure raises.
"""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import runtime_cuda.torch_dist as gc3_torch
import torch_rank
from runtime_cuda.torch_dist import copy_engine, ops, overlap

rank, world, store_path, table_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
gc3_torch.register()
dist.init_process_group("cpu:gloo,cuda:gc3", store=dist.FileStore(store_path, world), rank=rank,
                        world_size=world, timeout=timedelta(seconds=120))
pg = dist.group.WORLD
G = world
# The test's own stream, not the default one: the pipeline must order itself after the caller's stream.
user = torch.cuda.Stream()
torch.cuda.set_stream(user)


passed, close = torch_rank.passed, torch_rank.close


def inputs(seed, r, shape, dtype=torch.bfloat16, scale=1.0):
    return torch_rank.inputs(dev, seed, r, shape, dtype, scale)


# --- the operators, as (name, operands(seed), fused call, sequential call, fp32 reference) --------------------
M, K, N = 8 * 97, 200, 3 * 64 + 40      # odd sizes: chunk bounds fall on and off the 64-row alignment


def ag(seed):
    return inputs(seed, rank, (M // G, K)), inputs(seed + 1, 0, (K, N), scale=K ** -0.5)


def ag_ref(seed):
    A = torch.cat([inputs(seed, r, (M // G, K)) for r in range(world)]).float()
    return A @ inputs(seed + 1, 0, (K, N), scale=K ** -0.5).float()


def rs(seed):
    return inputs(seed, rank, (M, K)), inputs(seed + 1, rank, (K, N), scale=K ** -0.5)


def rs_sum(seed):
    return sum(inputs(seed, r, (M, K)).float() @ inputs(seed + 1, r, (K, N), scale=K ** -0.5).float()
               for r in range(world))


def a2a_ref(seed):
    m = M // G
    B = inputs(seed + 1, 0, (K, N), scale=K ** -0.5).float()
    return torch.cat([inputs(seed, q, (M, K))[rank * m:(rank + 1) * m].float() @ B for q in range(world)])


def a2a(seed):
    return inputs(seed, rank, (M, K)), inputs(seed + 1, 0, (K, N), scale=K ** -0.5)


OPS = {
    "ag_gemm": (ag, lambda a, b, **kw: ops.fused_all_gather_matmul(a, [b], 0, pg, **kw)[1][0], ag_ref),
    "gemm_rs": (rs, lambda a, b, **kw: ops.fused_matmul_reduce_scatter(a, b, "sum", 0, pg, **kw),
                lambda s: rs_sum(s)[rank * (M // G):(rank + 1) * (M // G)]),
    "gemm_ar": (rs, lambda a, b, **kw: ops.fused_matmul_all_reduce(a, b, pg, **kw), rs_sum),
    "gemm_a2a": (a2a, lambda a, b, **kw: ops.fused_matmul_all_to_all(a, b, pg, **kw), a2a_ref),
}

dist.barrier()
for name, (operands, call, reference) in OPS.items():
    a, b = operands(1)
    ref = reference(1)
    seq = call(a, b, path="sequential")
    for chunks in (1, 3, 4):
        got = call(a, b, path="fused", chunks=chunks)
        close(f"{name} fused chunks={chunks}", got, ref, seq)
        if name in ("gemm_ar", "ag_gemm"):
            torch_rank.same_on_all_ranks(f"{name} chunks={chunks}", got)
    if name == "ag_gemm":     # the gathered A comes back too, exactly
        A, _ = ops.fused_all_gather_matmul(a, [b], 0, pg, path="fused", chunks=3)
        want = torch.cat([inputs(1, r, (M // G, K)) for r in range(world)])
        assert torch.equal(A, want), f"rank {rank}: ag_gemm returned A differs"
        passed("ag_gemm returned A")

# CUDA graph: capture each fused operator on static inputs, refill them, replay.
for name, (operands, call, reference) in OPS.items():
    a, b = operands(2)
    call(a, b, path="fused", chunks=3)          # warm: the communicator's set-up runs outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=user):
        out = call(a, b, path="fused", chunks=3)
    a2, b2 = operands(3)
    a.copy_(a2)
    b.copy_(b2)
    g.replay()
    g.replay()
    seq = call(a2, b2, path="sequential")
    close(f"{name} cuda graph replay", out, reference(3), seq)
    del g

# Back to back: alternating operators and shapes, no synchronisation until the end.
results, wanted = [], []
for i in range(6):
    name = ("gemm_rs", "ag_gemm", "gemm_ar", "gemm_a2a")[i % 4]
    operands, call, reference = OPS[name]
    a, b = operands(10 + i)
    results.append((name, call(a, b, path="fused", chunks=2 + i % 3), call(a, b, path="sequential"), 10 + i))
torch.cuda.synchronize()
for name, got, seq, seed in results:
    close(f"back to back {name} seed {seed}", got, OPS[name][2](seed), seq)

# The exchange under test (GC3_FUSED_EXCHANGE): overlap.py's collectives or copy_engine.py's copies.
copies = os.environ.get("GC3_FUSED_EXCHANGE", "collective") == "copy-engine"
pipeline = copy_engine if copies else overlap
if copies:
    assert "_gc3_copy_engine" in pg.__dict__, "GC3_FUSED_EXCHANGE=copy-engine: the copy-engine pipeline never ran"
    passed("copy-engine pipeline served")
else:
    # GC3_FUSED_TRACE: timing events around every GEMM chunk and every collective of the call (the
    # copy-engine pipeline's own stamps are tests/test_fused_gemm_gpu.py's).
    os.environ["GC3_FUSED_TRACE"] = "1"
    a, b = rs(20)
    ops.fused_matmul_reduce_scatter(a, b, "sum", 0, pg, path="fused", chunks=3)
    trace = overlap.last_trace
    assert trace is not None and len(trace.gemm) == 3 and len(trace.comm) == 3, trace
    share = trace.overlap()
    assert 0.0 <= share <= 1.0 and all(b >= a >= 0 for a, b in trace.intervals(trace.gemm + trace.comm)), share
    del os.environ["GC3_FUSED_TRACE"]
    passed(f"trace overlap {share:.2f}")

# auto: the measured table decides; counted through the pipeline's entry points.
calls = {"n": 0}
real = pipeline.matmul_reduce_scatter


def counted(*args, **kw):
    calls["n"] += 1
    return real(*args, **kw)


pipeline.matmul_reduce_scatter = counted
table = json.loads(open(table_path).read())
measured = {e["shape"]["M"]: e["path"] for e in table["fused"]["entries"] if e["op"] == "gemm_rs"}
assert os.environ.get("GC3_CONFIG") == table_path
for m_rows, expect in sorted(measured.items()) + [(M * 8, "sequential")]:   # M * 8: nothing within 2x
    a = inputs(5, rank, (m_rows, K))
    b = inputs(6, rank, (K, N), scale=K ** -0.5)
    before = calls["n"]
    ops.fused_matmul_reduce_scatter(a, b, "sum", 0, pg)
    took = "fused" if calls["n"] > before else "sequential"
    if took != expect:
        raise AssertionError(f"rank {rank}: auto took {took} at M={m_rows}, the table says {expect}")
    passed(f"auto M={m_rows} {took}")
pipeline.matmul_reduce_scatter = real

torch.cuda.synchronize()
torch_rank.finish(rank)
