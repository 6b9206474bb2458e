"""Weight streaming for the b=1 split-K GEMV on one GPU (dev tooling): the shipped slices
(gv::splitk_slice) against two pipelines that stage the weight's rows in shared memory, by bulk
copies (TMA 1D, one thread issues a row's copy) or by cp.async (16 bytes a thread), in S stages of
R rows at one or two blocks a multiprocessor, and against cuBLAS (torch.matmul).  us per call in
bursts of 20 launches, median of 15 (weight GB/s).

    python3 scripts/probe_gemv_stream.py
"""
import cupy
import numpy as np
import torch

from bench_gemv_splitk import BENCH, timed   # this folder's: the shipped slices' bench kernel and timer
from runtime_cuda.core import module
from runtime_cuda.fused.gemv_kernel import split_plan
from runtime_cuda.ranks.small_allreduce import THREADS

SRC = r"""
#define TW 1024
typedef unsigned short u16;
__device__ __forceinline__ float bf(u16 v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned ph) {
  unsigned ok;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(sa(b)), "r"(ph) : "memory");
  } while (!ok);
}

// Block b's item: slice s of K (rows k0..k1, nst stages) of the tile at column c0.
struct Item {
  int s, k0, k1, c0, nst;
};
__device__ __forceinline__ Item item_of(int K, int N, int split) {
  const int tiles = N / TW, rows = (K + split - 1) / split;
  Item it;
  it.s = blockIdx.x / tiles;
  it.c0 = blockIdx.x % tiles * TW;
  it.k0 = it.s * rows;
  it.k1 = min(K, it.k0 + rows);
  it.nst = (it.k1 - it.k0 + RPS - 1) / RPS;
  return it;
}

// One stage's nr rows (of RPS) in shared memory into this thread's two columns' sums.
__device__ __forceinline__ void consume(const u16* stage, const u16* x, int kb, int nr, float& a0, float& a1) {
  const unsigned* row = (const unsigned*)stage + threadIdx.x;
#pragma unroll
  for (int r = 0; r < RPS; ++r) {
    if (r < nr) {
      const unsigned v = row[r * TW / 2];
      const float xv = bf(x[kb + r]);
      a0 = fmaf(xv, __uint_as_float(v << 16), a0);
      a1 = fmaf(xv, __uint_as_float(v & 0xffff0000u), a1);
    }
  }
}

extern "C" __global__ void __launch_bounds__(512) tma_gemv(const u16* __restrict__ x, const u16* __restrict__ w,
                                                          int K, int N, int split, float* part) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* bar = (unsigned long long*)smem;
  u16* buf = (u16*)(smem + 128);
  const Item it = item_of(K, N, split);
  const int k0 = it.k0, k1 = it.k1, c0 = it.c0, nst = it.nst;
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(bar + i)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int st = 0; st < min(STAGES, nst); ++st) {
      const int kb = k0 + st * RPS, nr = min(RPS, k1 - kb);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(bar + st)), "r"(nr * TW * 2) : "memory");
      for (int r = 0; r < nr; ++r)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sa(buf + (st * RPS + r) * TW)), "l"(w + (long long)(kb + r) * N + c0), "r"(TW * 2),
                     "r"(sa(bar + st)) : "memory");
    }
  float a0 = 0.f, a1 = 0.f;
  for (int st = 0; st < nst; ++st) {
    const int slot = st % STAGES;
    mbar_wait(bar + slot, (st / STAGES) & 1);
    const int kb = k0 + st * RPS, nr = min(RPS, k1 - kb);
    consume(buf + slot * RPS * TW, x, kb, nr, a0, a1);
    __syncthreads();
    if (threadIdx.x == 0 && st + STAGES < nst) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      const int nx = st + STAGES, kb2 = k0 + nx * RPS, nr2 = min(RPS, k1 - kb2);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(bar + slot)), "r"(nr2 * TW * 2) : "memory");
      for (int r = 0; r < nr2; ++r)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sa(buf + (slot * RPS + r) * TW)), "l"(w + (long long)(kb2 + r) * N + c0), "r"(TW * 2),
                     "r"(sa(bar + slot)) : "memory");
    }
  }
  part[(long long)it.s * N + c0 + 2 * threadIdx.x] = a0;
  part[(long long)it.s * N + c0 + 2 * threadIdx.x + 1] = a1;
}

// cp.async (16 bytes a thread a copy) into STAGES stages of RPS rows.
extern "C" __global__ void __launch_bounds__(512) cpa_gemv(const u16* __restrict__ x, const u16* __restrict__ w,
                                                          int K, int N, int split, float* part) {
  extern __shared__ __align__(128) unsigned char smem[];
  u16* buf = (u16*)(smem + 128);
  const Item it = item_of(K, N, split);
  const int k0 = it.k0, k1 = it.k1, c0 = it.c0, nst = it.nst;
  constexpr int PER = RPS * TW / 8 / 512;   // 16-byte pieces a thread per stage
  auto issue = [&](int st) {
    const int slot = st % STAGES, kb = k0 + st * RPS;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int piece = threadIdx.x + j * 512, r = piece / (TW / 8), c = piece % (TW / 8);
      if (kb + r < k1)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(buf + (slot * RPS + r) * TW + c * 8)),
                     "l"(w + (long long)(kb + r) * N + c0 + c * 8) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int st = 0; st < STAGES - 1; ++st) issue(st);
  float a0 = 0.f, a1 = 0.f;
  for (int st = 0; st < nst; ++st) {
    issue(st + STAGES - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");
    __syncthreads();
    const int slot = st % STAGES, kb = k0 + st * RPS, nr = min(RPS, k1 - kb);
    consume(buf + slot * RPS * TW, x, kb, nr, a0, a1);
    __syncthreads();
  }
  part[(long long)it.s * N + c0 + 2 * threadIdx.x] = a0;
  part[(long long)it.s * N + c0 + 2 * threadIdx.x + 1] = a1;
}
"""

SHAPES = [(2048, 8192), (4096, 8192), (7168, 8192), (14336, 8192), (3584, 4096)]
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"# {torch.cuda.get_device_name(0)}, bf16, b=1, us per call in bursts of 20 launches, median of 15 (weight GB/s)")
part = torch.empty((64 << 20) // 4, device="cuda", dtype=torch.float32)
opts = module.options("bfloat16", "sum", "LL", compute=True)
shipped = cupy.RawModule(code=module.source("gemv_allreduce.cu") + BENCH, options=opts).get_function("gc3_bench_splitk")
variants = [(st, rps) for st, rps in ((4, 8), (8, 8), (6, 16), (12, 4), (3, 32))]
mods = {}
for st, rps in variants:
    mods[(st, rps)] = cupy.RawModule(code=SRC, options=("-std=c++17", f"-DSTAGES={st}", f"-DRPS={rps}"))
for K, N in SHAPES:
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    want = (x.float() @ w.float())[0]
    gb = K * N * 2 / 1e3
    cells = [f"cublas {timed(lambda: torch.matmul(x, w)):6.1f}"]
    tw, split = split_plan(1, K, N, 2, sms)
    grid = min(sms, -(-N // tw) * split)
    args = (np.uint64(x.data_ptr()), np.uint64(w.data_ptr()), np.int32(1), np.int32(K), np.int32(N),
            np.int32(tw), np.int32(split), np.uint64(part.data_ptr()))
    us = timed(lambda: shipped((grid,), (THREADS,), args))
    cells.append(f"shipped {us:6.1f} ({gb / us:4.0f})")
    tiles = N // 1024
    for (st, rps), mod in mods.items():
        for name in ("tma_gemv", "cpa_gemv"):
            fn = mod.get_function(name)
            smem = 128 + st * rps * 1024 * 2
            fn.max_dynamic_shared_size_bytes = smem
            for per_sm in (1, 2):
                sp = max(1, (sms * per_sm) // tiles)
                if per_sm == 2 and 2 * smem > 220 * 1024:
                    continue
                a = (np.uint64(x.data_ptr()), np.uint64(w.data_ptr()), np.int32(K), np.int32(N), np.int32(sp),
                     np.uint64(part.data_ptr()))
                try:
                    us = timed(lambda: fn((tiles * sp,), (512,), a, shared_mem=smem))
                except cupy.cuda.driver.CUDADriverError as e:
                    cells.append(f"{name[:3]}{st}x{rps}/{per_sm} failed: {str(e)[:60]}")
                    continue
                got = part[:sp * N].view(sp, N).sum(0)
                err = float((got - want).abs().max() / want.abs().max())
                bad = "" if err < 1e-3 else f" WRONG({err:.0e})"
                cells.append(f"{name[:3]}{st}x{rps}/{per_sm} {us:6.1f} ({gb / us:4.0f}){bad}")
    print(f"K={K:<5} N={N:<5} " + " | ".join(cells), flush=True)
