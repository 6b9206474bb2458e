"""Does leaving SMs to the exchange make the GEMM pipeline pay? (dev tooling)

    torchrun --nproc-per-node G scripts/probe_sm_carveout.py OP M K N [CARVEOUTS] [CHUNKS]

An SM-driven collective beside a cuBLAS GEMM that fills every SM either waits for
the GEMM's persistent blocks or pushes them into a second wave.  cuBLASLt can be
told to leave c SMs free (torch's SM carveout), and an NCCL communicator to use
at most c CTAs: then both run at once.  For each c in CARVEOUTS (default
0,8,16,24) this times, on the same inputs, the GEMM alone, the exchange alone on
an NCCL group limited to c CTAs, and overlap.py's pipeline in CHUNKS (default 4)
chunks on that group and on the gc3 group, against seq-nccl (matmul then NCCL,
no carveout), in µs, CUDA-event medians, max over ranks.
"""
import sys

import torch
import torch.distributed as dist

from runtime_cuda.torch_dist import bench_fused as bf
from runtime_cuda.torch_dist import overlap

op, M, K, N = sys.argv[1], *map(int, sys.argv[2:5])
carveouts = [int(c) for c in (sys.argv[5] if len(sys.argv) > 5 else "0,8,16,24").split(",")]
chunk_counts = [int(c) for c in (sys.argv[6] if len(sys.argv) > 6 else "4").split(",")]
job = bf.start()
timer = bf.Timer(job, 10, 3)
case = bf.Case(op, M, K, N, job.size, job.device)
A, B = case.operands(job.rank)


def pipeline(pg, chunks):
    if op == "ag_gemm":
        return lambda: overlap.all_gather_matmul(pg, A, [B], chunks, False, "probe")[1][0]
    fn = {"gemm_rs": overlap.matmul_reduce_scatter, "gemm_ar": overlap.matmul_all_reduce,
          "gemm_a2a": overlap.matmul_all_to_all}[op]
    return lambda: fn(pg, A, B, chunks, "probe")


def nccl_group(ctas):
    if not ctas:
        return job.nccl
    opts = dist.ProcessGroupNCCL.Options()
    opts.config.max_ctas = ctas
    opts.is_high_priority_stream = True
    return dist.new_group(backend="nccl", pg_options=opts)


def gemm_alone():
    if op == "ag_gemm":
        full = A.new_empty((A.shape[0] * job.size, A.shape[1]))
        return lambda: full @ B
    return lambda: A @ B


seq = timer.device(bf.seq_call(case, A, B, job.nccl))
comm_full = timer.device(bf.comm_call(case, A, B, job.nccl))
head = f"probe {op} M={M} K={K} N={N} G={job.size} seq_nccl={seq:.1f} comm_nccl={comm_full:.1f}"
if job.rank == 0:
    print(head, flush=True)
for c in carveouts:
    torch.backends.cuda.preferred_blas_library("cublaslt" if c else "cublas")
    torch._C._set_sm_carveout_experimental(c if c else None)
    group = nccl_group(c)
    out = {"gemm": timer.device(gemm_alone()), "comm": timer.device(bf.comm_call(case, A, B, group))}
    for chunks in chunk_counts:
        out[f"pipe_nccl{chunks}"] = timer.device(pipeline(bf.DistDriven(group, job.device), chunks))
        out[f"pipe_gc3_{chunks}"] = timer.device(pipeline(job.gc3, chunks))
    best = min(v for k, v in out.items() if k.startswith("pipe"))
    if job.rank == 0:
        print(f"  carveout={c:3d} " + " ".join(f"{k}={v:.1f}" for k, v in out.items())
              + f"  seq/best={seq / best:.2f}x", flush=True)
torch._C._set_sm_carveout_experimental(None)
torch.backends.cuda.preferred_blas_library("cublas")
dist.destroy_process_group()
