"""The split-K GEMV's compute alone against cuBLAS (torch.matmul), on one GPU (dev tooling):
for each variant of the kernel's tunables (accumulators a thread, bytes in flight) and each
shape, the time per call in bursts of back-to-back launches (the GPU's steady state, as in a
CUDA graph) and the weight's bandwidth, beside torch.matmul's.

    python3 scripts/bench_gemv_splitk.py [ACC:INFLIGHT[:PREFETCH] ...]      (default 64:128 64:128:1 64:128:2)
"""
import statistics
import sys

import cupy
import numpy as np
import torch

from runtime_cuda.core import module
from runtime_cuda.fused.gemv_kernel import split_plan
from runtime_cuda.ranks.small_allreduce import THREADS

BENCH = r"""
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)
gc3_bench_splitk(const elem_t* x, const elem_t* w, int batch, int K, int N, int tw, int split, float* part) {
  __shared__ __align__(16) float sred[gv::SPLIT_SRED];
  const int tiles = (N + tw - 1) / tw;
  for (int i = blockIdx.x; i < tiles * split; i += gridDim.x)
    gv::splitk_slice(x, w, batch, K, N, tw, split, i, part, sred);
}
"""
# The decode layers' shards on 4 and 2 GPUs, b = 1, 4, 8 (split-K up to 8 rows here, whatever
# the kernel's limit for 16-bit types).
SHAPES = [(b, k, n) for k, n in ((2048, 8192), (3584, 4096), (7168, 8192), (4096, 8192), (7168, 4096), (14336, 8192))
          for b in (1, 4, 8)]


def timed(fn, reps=15, burst=20):
    """us per call: the median over `reps` bursts of `burst` back-to-back launches between two
    events, so that what is timed is the GPU's steady state (as in a CUDA graph's replay), not
    one launch's latency, which the kernels here are short enough to show."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(burst):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / burst)
    return statistics.median(times)


def main(argv):
    variants = [tuple(int(v) for v in (a + ":0").split(":")[:3]) for a in argv] or [(64, 128, 0), (64, 128, 1),
                                                                                   (64, 128, 2)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name(0)}, bf16, us per call in bursts of 20 launches, median of 15 (weight GB/s)")
    data = {s: (torch.randn(s[0], s[1], device="cuda", dtype=torch.bfloat16),
                torch.randn(s[1], s[2], device="cuda", dtype=torch.bfloat16)) for s in SHAPES}
    part = torch.empty((8 << 20) // 4, device="cuda", dtype=torch.float32)
    rows = {s: [f"cublas {timed(lambda: torch.matmul(*data[s])):7.1f}"] for s in SHAPES}
    for acc, inflight, ahead in variants:
        opts = module.options("bfloat16", "sum", "LL", compute=True) + (
            f"-DGC3_GV_SPLIT_ACC={acc}", f"-DGC3_GV_SPLIT_INFLIGHT={inflight}", f"-DGC3_GV_SPLIT_PREFETCH={ahead}")
        fn = cupy.RawModule(code=module.source("gemv_allreduce.cu") + BENCH, options=opts).get_function(
            "gc3_bench_splitk")
        for s in SHAPES:
            b, k, n = s
            plan = split_plan(b, k, n, 2, sms, acc=acc, max_batch=8)
            if plan is None:
                rows[s].append(f"{acc}:{inflight}:{ahead} n/a")
                continue
            tw, split = plan
            grid = min(sms, -(-n // tw) * split)
            x, w = data[s]
            args = (np.uint64(x.data_ptr()), np.uint64(w.data_ptr()), np.int32(b), np.int32(k), np.int32(n),
                    np.int32(tw), np.int32(split), np.uint64(part.data_ptr()))
            us = timed(lambda: fn((grid,), (THREADS,), args))
            got = part[:split * b * n].view(split, b, n).sum(0)
            want = x.float() @ w.float()
            err = float((got - want).abs().max() / want.abs().max())
            ok = "" if err < 1e-3 else f" WRONG({err:.1e})"
            rows[s].append(f"{acc}:{inflight}:{ahead} {us:7.1f} ({k * n * 2 / us / 1e3:5.0f}){ok}")
    for s in SHAPES:
        print(f"b={s[0]:<2} K={s[1]:<5} N={s[2]:<5} " + " | ".join(rows[s]))


if __name__ == "__main__":
    main(sys.argv[1:])
