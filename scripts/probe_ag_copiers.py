"""Forced fused all-gather + GEMM (the tile-store kernel) at several copier counts against
seq-nccl (all_gather_into_tensor then matmul on an NCCL group) and PyTorch's symm_mem op, in one
job: how many programs should push the shard (GC3_FUSED_GATHER_COPIERS).  Per copier count it
prints the time, seq's time over it, the push alone (a B of 8 columns: the same bytes move, the
GEMM is almost empty) and the largest difference from seq's result.

    COPIERS=8,16,32 torchrun --nproc-per-node G scripts/probe_ag_copiers.py [MxKxN ...]

Shapes are the full layer's (M rows gathered, N split over the ranks); the default is M in
{2048, 8192, 16384} at each all-gather grid (K, N) of `gc3 bench --fused`."""
import os
import sys

import torch
import torch.distributed as dist

from runtime_cuda.torch_dist import bench_fused as bf

job = bf.start()
G = job.size
timer = bf.Timer(job, 20, 3)
shapes = [(M, K, N) for K, N in bf.AG_KN for M in (2048, 8192, 16384)] if len(sys.argv) < 2 else \
    [tuple(int(x) for x in s.split("x")) for s in sys.argv[1:]]
cop = [int(x) for x in os.environ.get("COPIERS", "8,16,32").split(",")]
if job.rank == 0:
    print(f"# {job.hw} G={G} copiers={cop}", flush=True)
for M, K, N in shapes:
    case = bf.Case("ag_gemm", M, K, N, G, job.device)
    A, B = case.operands(job.rank)
    seq = bf.seq_call(case, A, B, job.nccl)
    full = torch.cat([A] * G)
    row = {"seq": timer.device(seq), "gemm": timer.device(lambda: full @ B)}
    ref = seq()
    for c in cop:
        os.environ["GC3_FUSED_GATHER_COPIERS"] = str(c)
        job.gc3.__dict__.pop("_gc3_tile_store", None)
        f = bf.fused_call(case, A, B, job.gc3, "fused")
        got = f()
        err = float((got.float() - ref.float()).abs().max())
        row[f"c{c}"] = timer.device(f)
        row[f"e{c}"] = err
        row[f"x{c}"] = timer.device(bf.comm_call(case, A, B, job.gc3, fused=True))
    sy = bf.symm_call(case, A, B, job.nccl)
    row["symm"] = timer.device(sy) if sy else None
    row["comm_nccl"] = timer.device(bf.comm_call(case, A, B, job.nccl))
    if job.rank == 0:
        s = row["seq"]
        cells = " ".join(f"c{c}={row[f'c{c}']:.0f}({s / row[f'c{c}']:.2f}x,x{row[f'x{c}']:.0f},err{row[f'e{c}']:.2g})" for c in cop)
        print(f"M={M} K={K} N={N} seq={s:.0f} gemm={row['gemm']:.0f} symm={row['symm'] or 0:.0f} "
              f"comm_nccl={row['comm_nccl']:.0f} {cells}", flush=True)
dist.barrier()
dist.destroy_process_group()
