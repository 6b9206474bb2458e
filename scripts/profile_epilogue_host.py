"""Host time per call of fused_all_reduce_epilogue and its parts, on a gc3 group (dev tooling;
ranks may share one GPU: the gc3 group runs there without NCCL).

    torchrun --nproc-per-node 2 scripts/profile_epilogue_host.py [KiB ...]

For x of each size (bf16, default 16 KiB, 1 MiB and 8 MiB: the small kernel, its limit, the
allreduce-then-pass path), rank 0 prints the host time per call (a timer around 20 calls, no
synchronisation, median of 5 rounds) of the operator forced fused (its first call keeps the
launch: the rest are repeats), of its sequential path, of the group's all_reduce alone, and of
torch's elementwise epilogue alone; then a cProfile of 20 fused calls at each size.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import runtime_cuda.torch_dist as gc3_torch
from runtime_cuda.benchmarks.torch_host import host_us as host, profile
from runtime_cuda.torch_dist import ops

SIZES_KIB = [int(v) for v in sys.argv[1:]] or [16, 1024, 8192]
COLS = 4096
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local % torch.cuda.device_count())
gc3_torch.register()
dist.init_process_group("cpu:gloo,cuda:gc3", timeout=datetime.timedelta(seconds=120))
pg, rank, G = dist.group.WORLD, dist.get_rank(), dist.get_world_size()


for kib in SIZES_KIB:
    elems = kib * 1024 // 2
    cols = min(COLS, elems)
    x = torch.randn(elems // cols, cols, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    y = x.clone()
    cases = {
        "fused": lambda: ops.fused_all_reduce_epilogue(x, pg, 1.0 / G, bias, res, path="fused"),
        "sequential": lambda: ops.fused_all_reduce_epilogue(x, pg, 1.0 / G, bias, res, path="sequential"),
        "all_reduce": lambda: dist.all_reduce(y, group=pg),
        "torch_epilogue": lambda: ops.epilogue_apply(y, 1.0 / G, bias, res, None),
    }
    got = {k: host(f) for k, f in cases.items()}
    if rank == 0:
        print(f"host us per call, {kib} KiB bf16, G={G}: " + " ".join(f"{k}={v:.1f}" for k, v in got.items()))
    profile(cases["fused"], f"20 fused calls at {kib} KiB", rank == 0, lines=12)
dist.destroy_process_group()
