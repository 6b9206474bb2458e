"""Where a tile-store GEMM + all-reduce call's time goes at few rows a rank (dev tooling): per
shape, us per call in CUDA-graph replays (the bench's Timer: medians of rounds, max over ranks) of
the fused call at its K and at K = 64 (the exchange with almost no GEMM), torch.matmul alone, NCCL's
all-reduce of the result alone, the two in a row (seq-nccl), and gc3's own all-reduce of the result.
fused(K) - fused(64) is about the GEMM inside the fused kernel, to hold against matmul; fused(64)
against the all-reduces says how the exchange compares.  Not a result by itself: `gc3 bench
--fused` measures the operators against the user's path.  GC3_FUSED_TILE picks the tile.

    torchrun --nproc-per-node 4 scripts/probe_tile_store_phases.py [M] [CALLS] [N,N,...]
"""
import sys

import torch
import torch.distributed as dist

from gc3 import settings
from runtime_cuda.torch_dist import bench_fused, ops, tile_store

M = int(sys.argv[1]) if len(sys.argv) > 1 else 256
CALLS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
ONLY = {int(n) for n in sys.argv[3].split(",")} if len(sys.argv) > 3 else None
job = bench_fused.start()
G, dev = job.size, job.device
timer = bench_fused.Timer(job, CALLS, 5)
sms = torch.cuda.get_device_properties(dev).multi_processor_count
if job.rank == 0:
    print(f"# {job.hw}, M={M}, graph of {CALLS} calls, us per call (max over ranks)")
    print("| K (full) | N | tile | fused | fused K=64 | matmul | NCCL AR | seq-nccl | gc3 AR |")
    print("|---|---|---|---|---|---|---|---|---|")
for K, N in ((14336, 4096), (28672, 8192), (53248, 16384)):
    if ONLY is not None and N not in ONLY:
        continue
    gen = torch.Generator(device=dev).manual_seed(job.rank)
    a = torch.randn(M, K // G, generator=gen, device=dev).bfloat16()
    b = (torch.randn(K // G, N, generator=gen, device=dev) * (K ** -0.5)).bfloat16()
    a64, b64 = a[:, :64].contiguous(), b[:64].contiguous()
    c = torch.matmul(a, b)
    row = {
        "fused": lambda: ops.fused_matmul_all_reduce(a, b, job.gc3, path="fused"),
        "fused64": lambda: ops.fused_matmul_all_reduce(a64, b64, job.gc3, path="fused"),
        "mm": lambda: torch.matmul(a, b),
        "nccl": (lambda: dist.all_reduce(c, group=job.nccl)) if job.nccl is not None else None,
        "seq": (lambda: dist.all_reduce(torch.matmul(a, b), group=job.nccl)) if job.nccl is not None else None,
        "gc3": lambda: dist.all_reduce(c, group=job.gc3),
    }
    got = {name: timer.graph(fn, name) for name, fn in row.items()}
    tile = tile_store.tile_shape(M, N, G, sms, settings.get("GC3_FUSED_TILE"))
    if job.rank == 0:
        cells = " | ".join("n/a" if v is None else f"{v:.1f}" for v in got.values())
        print(f"| {K} | {N} | {tile[0]}x{tile[1]} | {cells} |", flush=True)
dist.barrier()
dist.destroy_process_group()
