"""Host time per call of the fused GEMM operators and their parts, on a gc3 group
(dev tooling; ranks may share one GPU).

    torchrun --nproc-per-node 2 scripts/profile_fused_host.py [M K N]

Rank 0 prints the host time per call (a timer around 20 calls, no
synchronisation, median of 5 rounds) of: torch.mm alone, the collective through
dist on the gc3 group and on an NCCL group, torch.mm then the collective on
either group, the operator's gate and choice alone, the operator's
sequential path and its fused path (4 chunks), then a cProfile of 20 calls of
each path.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import runtime_cuda.torch_dist as gc3_torch
from runtime_cuda.benchmarks.torch_host import host_us as host, profile
from runtime_cuda.torch_dist import ops

M, K, N = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (1024, 3584, 4096)
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local % torch.cuda.device_count())
gc3_torch.register()
dist.init_process_group("cpu:gloo,cuda:gc3", timeout=datetime.timedelta(seconds=120))
pg, rank, G = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
C = A @ B
out = C.new_empty((M // G, N))
nccl = dist.new_group(backend="nccl")


def plain(group):
    D = torch.mm(A, B)
    o = D.new_empty((M // G, N))
    dist.reduce_scatter_tensor(o, D, group=group)


cases = {
    "mm": lambda: torch.mm(A, B),
    "mm_out_cols4": lambda: [torch.mm(A, B[:, i * N // 4:(i + 1) * N // 4]) for i in range(4)],
    "rs_dist": lambda: dist.reduce_scatter_tensor(out, C, group=pg),
    "rs_nccl": lambda: dist.reduce_scatter_tensor(out, C, group=nccl),
    "seq_nccl": lambda: plain(nccl),
    "seq_plain_gc3": lambda: plain(pg),
    "refusal": lambda: ops._gemm_refusal(pg, A, B, True),
    "choose": lambda: ops._choose("gemm_rs", pg, A.dtype, ops._mkn(A, B), None, None, A),
    "event_pair": lambda: torch.cuda.Event().record(),
    "seq_op": lambda: ops.fused_matmul_reduce_scatter(A, B, "sum", 0, pg, path="sequential"),
    "auto_op": lambda: ops.fused_matmul_reduce_scatter(A, B, "sum", 0, pg),
    "fused_op4": lambda: ops.fused_matmul_reduce_scatter(A, B, "sum", 0, pg, path="fused", chunks=4),
    "fused_op2": lambda: ops.fused_matmul_reduce_scatter(A, B, "sum", 0, pg, path="fused", chunks=2),
}
got = {k: host(f) for k, f in cases.items()}
if rank == 0:
    print(f"host us per call, M={M} K={K} N={N} G={G}: " + " ".join(f"{k}={v:.1f}" for k, v in got.items()))
for name in ("auto_op", "fused_op4"):
    profile(cases[name], f"20 calls of {name}", rank == 0)
dist.destroy_process_group()
