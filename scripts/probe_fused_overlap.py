"""Where the fused GEMM pipeline's time goes, one shape at a time (dev tooling).

    torchrun --nproc-per-node G scripts/probe_fused_overlap.py OP M K N [--profile]

Times, on the same inputs: the GEMM alone, the GEMM in column/row chunks, the
sequential path on the NCCL and the gc3 group, the pipeline on each group
(overlap.py's functions take any group whose collectives run on torch's current
stream: the NCCL group goes through dist), and the host time of each; with
--profile, rank 0 prints a cProfile of 20 fused calls on the gc3 group.
"""
import sys

import torch
import torch.distributed as dist

from runtime_cuda.benchmarks.torch_host import profile
from runtime_cuda.torch_dist import bench_fused as bf
from runtime_cuda.torch_dist import overlap

op, M, K, N = sys.argv[1], *map(int, sys.argv[2:5])
job = bf.start()
timer = bf.Timer(job, 10, 3)
case = bf.Case(op, M, K, N, job.size, job.device)
A, B = case.operands(job.rank)
out = {}


fn = {"gemm_rs": overlap.matmul_reduce_scatter, "gemm_ar": overlap.matmul_all_reduce,
      "gemm_a2a": overlap.matmul_all_to_all}.get(op)
for chunks in (1, 2, 4, 8):
    cuts = overlap._pieces(overlap.bounds(N if op in ("gemm_rs", "gemm_a2a") else M, chunks))
    if op in ("gemm_rs", "gemm_a2a"):
        out[f"gemm_cols{chunks}"] = timer.device(lambda: [torch.mm(A, B[:, lo:hi]) for lo, hi in cuts])
    else:
        out[f"gemm_rows{chunks}"] = timer.device(lambda: [torch.mm(A[lo:hi], B) for lo, hi in cuts])
    if fn is not None:
        nccl = bf.DistDriven(job.nccl, job.device)
        out[f"pipe_nccl{chunks}"] = timer.device(lambda: fn(nccl, A, B, chunks, "probe"))
        out[f"pipe_gc3_{chunks}"] = timer.device(lambda: fn(job.gc3, A, B, chunks, "probe"))
        out[f"host_pipe_gc3_{chunks}"] = timer.host(lambda: fn(job.gc3, A, B, chunks, "probe"))
        out[f"host_pipe_nccl{chunks}"] = timer.host(lambda: fn(nccl, A, B, chunks, "probe"))
out["seq_nccl"] = timer.device(bf.seq_call(case, A, B, job.nccl))
out["seq_gc3"] = timer.device(bf.seq_call(case, A, B, job.gc3))
out["host_seq_nccl"] = timer.host(bf.seq_call(case, A, B, job.nccl))
out["host_seq_gc3"] = timer.host(bf.seq_call(case, A, B, job.gc3))
out["comm_nccl"] = timer.device(bf.comm_call(case, A, B, job.nccl))
out["comm_gc3"] = timer.device(bf.comm_call(case, A, B, job.gc3))
out["host_comm_gc3"] = timer.host(bf.comm_call(case, A, B, job.gc3))
out["host_comm_nccl"] = timer.host(bf.comm_call(case, A, B, job.nccl))
if job.rank == 0:
    print(f"probe {op} M={M} K={K} N={N} G={job.size}: " + " ".join(f"{k}={v:.1f}" for k, v in out.items()))
    print("served:", job.gc3.served)


if "--profile" in sys.argv:
    fused, seq = bf.fused_call(case, A, B, job.gc3, "fused", 4), bf.seq_call(case, A, B, job.gc3)
    fused(), seq()   # warm: the profiles are of repeats
    torch.cuda.synchronize()
    profile(fused, "20 fused calls (4 chunks)", job.rank == 0, lines=18)
    profile(seq, "20 sequential calls", job.rank == 0, lines=12)
dist.destroy_process_group()
