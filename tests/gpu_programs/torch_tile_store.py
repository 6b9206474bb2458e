"""One rank of the tile-store GEMM's check (runtime_cuda/torch_dist/tile_store.py), every
rank in its own process, on GPU 0 (ranks sharing it) or, with --spread, GPU rank % count:

- GEMM + reduce-scatter, + all-reduce, + all-to-all and all-gather + GEMM forced fused at three
  shapes whose K and N are not multiples of the GEMM's tiles (tiles of both sizes), and with even
  ranks a fourth whose tiles span two ranks' rows, each against
  an fp32 reference (error no larger than the sequential path's), the all-reduce bit-identical across ranks, the
  all-gather's A equal to every rank's shard (and not made when return_A is off), and the
  tile-store path shown to have served them;
- five calls of each in a row on new inputs (both parities of the buffers, twice);
- GEMM + reduce-scatter, + all-reduce and + all-to-all with the peers' tiles carried by the copy
  engines (GC3_FUSED_PEER_TILES=copy-engine) at the three shapes, five calls each, bit-identical
  to the GEMM's own stores, the copies replayed as CUDA graphs, then back to back (and on each stream of torch's pool in turn)
  with the GEMM's own stores, alternating, checked only at the end;
- GC3_FUSED_TRACE at one M = 8192 all-gather: at least half of the pushes' time inside tiles;
- CUDA-graph capture of each and two replays on new inputs (spanning tiles too);
- back-to-back calls of alternating operators and shapes, no synchronisation until the end;
- a rank that skips a call: the others' waits for its tiles give up after GC3_FUSED_TIMEOUT and
  their next call raises RuntimeTimeoutError naming it (no hang).

    python torch_tile_store.py RANK WORLD STORE_PATH [--spread]

Prints "PASS <name>" per check and "ALL OK rank=R" at the end; any failure raises.
"""
import os
import sys

import torch
import torch.distributed as dist

import torch_rank
from gc3.errors import RuntimeTimeoutError
from runtime_cuda.torch_dist import ops, overlap, tile_store

rank, world, dev, pg = torch_rank.join(sys.argv)
G = world
user = torch.cuda.Stream()      # the caller's own stream, not the default one
torch.cuda.set_stream(user)
# K: 3 steps of 64 and a part, or 7 and a part; N: tiles and a part.  Tiles (tile_store.tile_shape):
# 64 x 128 at the first two (64 rows a rank, the lower height; 2 blocks of 128 rows, halved for
# the idle SMs), 128 x 256 at the third (104 tiles: more than half of any GPU's SMs), and at the
# fourth (even ranks), 128 x 256 tiles of two ranks' 64 rows each (69 columns of tiles).
SHAPES = ((G * tile_store.MIN_BM, 200, 8 * 37), (2 * G * tile_store.BM, 456, 8 * 45), (1024, 200, 8 * 410))
if G % 2 == 0:
    SHAPES += ((G * tile_store.MIN_BM, 200, 8 * 2200),)
SMS = torch.cuda.get_device_properties(dev).multi_processor_count
TILES = [tile_store.tile_shape(M, N, G, SMS) for M, _, N in SHAPES]
assert TILES[0] == TILES[1] == (64, 128) and TILES[2] == (128, 256), TILES
assert G % 2 or (TILES[3] == (128, 256) and tile_store.span(SHAPES[3][0], G, 128) == 2), (TILES, SMS)


passed, close = torch_rank.passed, torch_rank.close


def inputs(seed, r, shape, scale=1.0):
    return torch_rank.inputs(dev, seed, r, shape, scale=scale)


def operands(op, shape, seed, r=None):
    M, K, N = shape
    r = rank if r is None else r
    b_rank = 0 if op == "gemm_a2a" else r      # all-to-all: one B everywhere (an expert's weight)
    rows = M // G if op == "ag_gemm" else M     # all-gather: this rank's shard of A
    return inputs(seed, r, (rows, K)), inputs(seed + 1, b_rank, (K, N), scale=K ** -0.5)


def gathered(shape, seed):
    return torch.cat([operands("ag_gemm", shape, seed, r)[0] for r in range(world)])


def reference(op, shape, seed):
    M = shape[0]
    m = M // G
    if op == "ag_gemm":
        return gathered(shape, seed).float() @ operands(op, shape, seed)[1].float()
    parts = [operands(op, shape, seed, r) for r in range(world)]
    if op == "gemm_a2a":
        return torch.cat([(a[rank * m:(rank + 1) * m].float() @ b.float()) for a, b in parts])
    full = sum(a.float() @ b.float() for a, b in parts)
    return full[rank * m:(rank + 1) * m] if op == "gemm_rs" else full


CALLS = {
    "gemm_rs": lambda a, b, **kw: ops.fused_matmul_reduce_scatter(a, b, "sum", 0, pg, **kw),
    "gemm_ar": lambda a, b, **kw: ops.fused_matmul_all_reduce(a, b, pg, **kw),
    "gemm_a2a": lambda a, b, **kw: ops.fused_matmul_all_to_all(a, b, pg, **kw),
    "ag_gemm": lambda a, b, **kw: all_gather_matmul(a, b, **kw),
}
last_A = []


def all_gather_matmul(a, b, **kw):
    A, (out,) = ops.fused_all_gather_matmul(a, [b], 0, pg, **kw)
    last_A[:] = [A]
    return out

dist.barrier()
for op, call in CALLS.items():
    for shape in SHAPES:
        for seed in range(1, 6):
            a, b = operands(op, shape, seed)
            got = call(a, b, path="fused")
            close(f"{op} {shape} call {seed}", got, reference(op, shape, seed), call(a, b, path="sequential"))
            if op == "gemm_ar":
                torch_rank.same_on_all_ranks(f"{op} {shape} call {seed}", got)
            if op == "ag_gemm":
                got = call(a, b, path="fused")
                assert torch.equal(last_A[0], gathered(shape, seed)), f"rank {rank}: the gathered A of {shape}"
        assert tile_store.ready(pg, op, a, b), f"rank {rank}: the tile-store path did not serve {op} {shape}"
    passed(f"{op} served by the tile-store GEMM")
# The copy engines carry the peers' tiles (eager calls of the three exchange operators).
EXCHANGES = ("gemm_rs", "gemm_ar", "gemm_a2a")
os.environ["GC3_FUSED_PEER_TILES"] = "copy-engine"
for op in EXCHANGES:
    for shape in SHAPES[:3]:
        for seed in range(50, 55):
            a, b = operands(op, shape, seed)
            got = CALLS[op](a, b, path="fused")
            close(f"{op} copy engines {shape} call {seed}", got, reference(op, shape, seed),
                  CALLS[op](a, b, path="sequential"))
            if op == "gemm_ar":
                torch_rank.same_on_all_ranks(f"{op} copy engines {shape} call {seed}", got)
            os.environ["GC3_FUSED_PEER_TILES"] = "store"
            assert torch.equal(got, CALLS[op](a, b, path="fused")), f"rank {rank}: {op} copy engines and stores differ"
            os.environ["GC3_FUSED_PEER_TILES"] = "copy-engine"
        kept = pg.__dict__["_gc3_tile_store"][tile_store._key(op, a, b, G) + (True,)]
        assert kept.copies is not None, f"rank {rank}: the copy engines did not serve {op} {shape}"
        assert None not in kept.copies.graphs, f"rank {rank}: the copies of {op} {shape} were not captured as graphs"
    # Another K of a shape maps the same buffers, so it replays the same copy plan.
    first = pg.__dict__["_gc3_tile_store"][tile_store._key(op, *operands(op, SHAPES[0], 50), G) + (True,)]
    shape = (SHAPES[0][0], SHAPES[0][1] + 64, SHAPES[0][2])
    a, b = operands(op, shape, 56)
    close(f"{op} copy engines {shape} call 56", CALLS[op](a, b, path="fused"), reference(op, shape, 56),
          CALLS[op](a, b, path="sequential"))
    other = pg.__dict__["_gc3_tile_store"][tile_store._key(op, a, b, G) + (True,)]
    assert other.copies is first.copies, f"rank {rank}: {op} {shape} made a second copy plan for one shape's buffers"
results = []
for i in range(15):
    op, shape = EXCHANGES[i % 3], SHAPES[(i // 3) % 3]
    os.environ["GC3_FUSED_PEER_TILES"] = ("store", "copy-engine")[i % 2]
    a, b = operands(op, shape, 60 + i)
    results.append((op, shape, 60 + i, CALLS[op](a, b, path="fused")))
# On every stream of torch's pool in turn (the copies' streams must never be the caller's).
for i in range(34):
    op, shape = EXCHANGES[i % 3], SHAPES[0]
    s = torch.cuda.Stream()
    s.wait_stream(user)
    torch.cuda.set_stream(s)
    a, b = operands(op, shape, 80 + i)
    results.append((op, shape, 80 + i, CALLS[op](a, b, path="fused")))
    user.wait_stream(s)
    torch.cuda.set_stream(user)
del os.environ["GC3_FUSED_PEER_TILES"]
torch.cuda.synchronize()
for op, shape, seed, got in results:
    a, b = operands(op, shape, seed)
    close(f"{op} copy engines back to back {shape} seed {seed}", got, reference(op, shape, seed),
          CALLS[op](a, b, path="sequential"))
passed("the copy engines carrying the peers' tiles")

a, b = operands("ag_gemm", SHAPES[0], 7)
A, (got,) = ops.fused_all_gather_matmul(a, [b], 0, pg, return_A=False, path="fused")
assert A is None
close("ag_gemm without A", got, reference("ag_gemm", SHAPES[0], 7), all_gather_matmul(a, b, path="sequential"))

# GC3_FUSED_TRACE at one M = 8192 all-gather: the share of the pushes' time during which tiles ran.
os.environ["GC3_FUSED_TRACE"] = "1"
shape = (8192, 4096, 8 * (1792 // G))
a, b = operands("ag_gemm", shape, 8)
# The second of two calls: the first maps the shape's buffers and builds the traced kernel, while
# the GPUs sit idle.  On 4 H100s a first call's push took 0.53 ms, with only 0.26 of it inside
# tiles; gc3 bench --fused times the push alone at this shape at about 0.29 ms.
all_gather_matmul(a, b, path="fused")
overlap.last_trace = None
all_gather_matmul(a, b, path="fused")
trace = overlap.last_trace
share = trace.overlap()
del os.environ["GC3_FUSED_TRACE"]
pushes, tiles = trace.intervals()
bm, bn = tile_store.tile_shape(shape[0], shape[2], G, torch.cuda.get_device_properties(dev).multi_processor_count)
assert len(tiles) == G * (shape[0] // G // bm) * -(-shape[2] // bn), len(tiles)
assert share >= 0.5, f"rank {rank}: {share:.2f} of the pushes' time inside tiles ({pushes} / {tiles[:8]})"
passed(f"ag_gemm trace: {share:.2f} of the pushes' time inside tiles")

# CUDA graph: one captured call of each operator, replayed on new inputs (and of spanning tiles).
for op, call, shape in [(op, call, SHAPES[1]) for op, call in CALLS.items()] + \
        [(op, CALLS[op], SHAPES[3]) for op in ("gemm_rs", "gemm_ar", "gemm_a2a") if len(SHAPES) > 3]:
    a, b = operands(op, shape, 20)
    call(a, b, path="fused")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=user):
        out = call(a, b, path="fused")
    for seed in (21, 22):
        a2, b2 = operands(op, shape, seed)
        a.copy_(a2)
        b.copy_(b2)
        g.replay()
        close(f"{op} cuda graph replay {shape} seed {seed}", out, reference(op, shape, seed), call(a2, b2, path="sequential"))
    del g

# Back to back: alternating operators and shapes, checked only at the end.
results = []
for i in range(12):
    op, shape = list(CALLS)[i % len(CALLS)], SHAPES[(i // len(CALLS) + i) % len(SHAPES)]
    a, b = operands(op, shape, 30 + i)
    results.append((op, shape, 30 + i, CALLS[op](a, b, path="fused")))
torch.cuda.synchronize()
for op, shape, seed, got in results:
    a, b = operands(op, shape, seed)
    close(f"back to back {op} {shape} seed {seed}", got, reference(op, shape, seed),
          CALLS[op](a, b, path="sequential"))

# A rank that never comes: the others give up (GC3_FUSED_TIMEOUT) and raise on their next call.
dist.barrier()
a, b = operands("gemm_rs", SHAPES[0], 40)
if rank != 0:
    CALLS["gemm_rs"](a, b, path="fused")
    torch.cuda.synchronize()           # returns: the waits gave up
    try:
        CALLS["gemm_rs"](a, b, path="fused")
    except RuntimeTimeoutError as exc:
        assert "tile-store wait" in str(exc), exc
        passed("a missing rank is reported, not waited for")
    else:
        raise AssertionError(f"rank {rank}: a call after a wait gave up did not raise")
# Rank 0's buffers stay mapped until every peer is past its last write (a CPU tensor: gloo's half).
dist.all_reduce(torch.zeros(1))
print(f"ALL OK rank={rank}", flush=True)
