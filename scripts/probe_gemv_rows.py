"""Weight streaming for the b=1 split-K GEMV on one GPU (dev tooling): a block sweeping whole rows
of the weight (a thread a 16-byte vector of each row, U rows of loads in flight) against cuBLAS
(torch.matmul), per call in CUDA-graph replays of 20, median of 9.  The variants: U = 4, 8 or 16;
each block a contiguous stretch of rows (c) or U-row items dealt round-robin over the blocks (i);
plain loads or ones that bypass L1 and ask L2 for 256-byte sectors (h).  Its output
(measured/gemv_rows_probe_1xH100_2026-11-28.txt) is what the rows form of
kernels/gemv_allreduce.cu (rows_item) was built from.

    python3 scripts/probe_gemv_rows.py
"""
import sys, statistics, cupy as cp, numpy as np, torch

SRC = r'''
__device__ __forceinline__ float bf(unsigned short u) { return __uint_as_float(((unsigned)u) << 16); }
__device__ __forceinline__ void acc8(float* a, uint4 v, float x) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) { a[2*i] = fmaf(x, bf(w[i] & 0xffff), a[2*i]); a[2*i+1] = fmaf(x, bf(w[i] >> 16), a[2*i+1]); }
}
// rows layout: thread t owns cols t*8 + 4096*h (h < H).  IL: items of U rows dealt round-robin
// over the blocks (neighbouring blocks read neighbouring rows at once), else a contiguous stretch per block.
template <bool HINT>
__device__ __forceinline__ uint4 ldw(const unsigned short* p) {
  if constexpr (HINT) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
  } else {
    return __ldg((const uint4*)p);
  }
}
template <int U, int H, bool IL, bool HINT>
__device__ void rows_body(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w, int K, int N, float* part) {
  int k0, k1, step;
  if (IL) { k0 = blockIdx.x * U; k1 = K; step = gridDim.x * U; }
  else { const int per = (K + gridDim.x - 1) / gridDim.x; k0 = blockIdx.x * per; k1 = min(K, k0 + per); step = U; }
  const int c0 = threadIdx.x * 8;
  float a[H][8];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int c = 0; c < 8; ++c) a[h][c] = 0.f;
  for (int k = k0; k < k1; k += step) {
    uint4 v[U][H];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < H; ++h)
        v[u][h] = (k + u < k1) ? ldw<HINT>(w + (long long)(k + u) * N + c0 + 4096 * h) : make_uint4(0,0,0,0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float xv = (k + u < k1) ? bf(x[k + u]) : 0.f;
#pragma unroll
      for (int h = 0; h < H; ++h) acc8(a[h], v[u][h], xv);
    }
  }
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int c = 0; c < 8; ++c) part[(long long)blockIdx.x * N + c0 + 4096 * h + c] = a[h][c];
}
extern "C" __global__ void __launch_bounds__(512) rows_u4_il0_hint0_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 1, false, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il0_hint0_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 2, false, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il0_hint1_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 1, false, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il0_hint1_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 2, false, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il1_hint0_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 1, true, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il1_hint0_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 2, true, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il1_hint1_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 1, true, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u4_il1_hint1_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<4, 2, true, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il0_hint0_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 1, false, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il0_hint0_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 2, false, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il0_hint1_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 1, false, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il0_hint1_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 2, false, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il1_hint0_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 1, true, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il1_hint0_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 2, true, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il1_hint1_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 1, true, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u8_il1_hint1_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<8, 2, true, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il0_hint0_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 1, false, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il0_hint0_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 2, false, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il0_hint1_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 1, false, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il0_hint1_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 2, false, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il1_hint0_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 1, true, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il1_hint0_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 2, true, false>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il1_hint1_h1(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 1, true, true>(x, w, K, N, part); }
extern "C" __global__ void __launch_bounds__(512) rows_u16_il1_hint1_h2(const unsigned short* x, const unsigned short* w, int K, int N, float* part) { rows_body<16, 2, true, true>(x, w, K, N, part); }
'''
mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=None)
print(torch.cuda.get_device_name(), file=sys.stderr)
s = cp.cuda.Stream(non_blocking=True)

def graph_us(fn, reps=20, rounds=9):
    with s:
        fn(); s.synchronize()
        s.begin_capture()
        for _ in range(reps): fn()
        g = s.end_capture()
        g.launch(s); s.synchronize()
        out = []
        for _ in range(rounds):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s); g.launch(s); e1.record(s); e1.synchronize()
            out.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / reps)
    return statistics.median(out)

for K, N in [(2048, 8192), (4096, 8192), (7168, 4096), (3584, 4096), (7168, 8192), (14336, 8192)]:
    tw = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    tx = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    w = cp.asarray(tw.view(torch.int16)).view(cp.uint16)
    x = cp.asarray(tx.view(torch.int16)).view(cp.uint16)
    ref = (tx.float() @ tw.float())[0].cpu().numpy()
    MB = K * N * 2 / 2**20
    row = [f"K={K:5d} N={N} {MB:5.0f} MiB"]
    ts = torch.cuda.Stream()
    # cuBLAS in a torch graph
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(ts):
        torch.matmul(tx, tw); ts.synchronize()
        with torch.cuda.graph(g, stream=ts):
            for _ in range(20): torch.matmul(tx, tw)
        g.replay(); ts.synchronize()
        outs = []
        for _ in range(9):
            e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
            e0.record(ts); g.replay(); e1.record(ts); e1.synchronize(); outs.append(e0.elapsed_time(e1) * 1000 / 20)
    t = statistics.median(outs); row.append(f"cublas {t:6.1f} ({K*N*2/t/1e3:4.0f})")
    H = N // 4096
    for U in (4, 8, 16):
        for IL in (0, 1):
            for HINT in (0, 1):
                grid = 132
                part = cp.zeros((grid, N), cp.float32)
                f = mod.get_function(f"rows_u{U}_il{IL}_hint{HINT}_h{H}")
                fn = lambda: f((grid,), (512,), (x, w, np.int32(K), np.int32(N), part), stream=s)
                t = graph_us(fn)
                ok = np.allclose(cp.asnumpy(part.sum(0)), ref, rtol=2e-2, atol=2e-1)
                row.append(f"u{U}{'i' if IL else 'c'}{'h' if HINT else ''} {t:5.1f}{'' if ok else '!'}")
    print(" | ".join(row), flush=True)
    del tw, w
