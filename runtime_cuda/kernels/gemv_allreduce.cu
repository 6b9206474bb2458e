// GEMV + AllReduce in one launch (a row-parallel linear layer at decode):
// y = sum over ranks r of x_r [batch, K] @ w_r [K, N], the same bits on every
// rank (runtime_cuda/fused/gemv_kernel.py is the host side).
//
// The weight is the whole cost, so every SM reads a share of it: block b owns
// column tiles b, b + grid, ... of `tw` columns and all batch rows, computes
// each with the interpreter's gemv passes (prims_compute.cuh: 16-byte weight
// loads, fp32 accumulation, tensor cores from batch 2), and puts the tile's
// partial into slot `me` of every rank's scratch (its own too) on the
// epoch-tagged LL lines of small_allreduce.cu, whose comment says how a call
// knows its number and flag from the per-block counters and why a parity
// region is never overwritten while a peer still reads it (every call reads a
// line from every peer).  The same block then reduces its tiles: every rank
// sums the n partials of a line in rank order 0..n-1 in fp32 and rounds once,
// so the ranks agree bit for bit and the only rounding before the sum is the
// one each rank's partial gets, as a matmul's output does before NCCL sums it.
//
// A block waits only on the lines its namesakes on the other ranks put, after
// putting its own: with the grid resident at once (the host's bound), every
// wait ends.  Nothing is cleared and nothing is synchronised on the host, so
// the launch can sit in a CUDA graph: a replay is a new call.
#include "prims_ll.cuh"
#include "sa_call.cuh"
#include "prims_compute.cuh"

#ifndef GC3_HAS_COMPUTE
#error "gemv_allreduce.cu is built as a compute build (-DGC3_COMPUTE) of a float type"
#endif

namespace gv {

constexpr int LANES = 8 / (int)sizeof(elem_t);   // elements of one LL line's 8 data bytes

// LL lines of one tile's slot: tiles sit at fixed offsets (the widest tile's lines).
__device__ __forceinline__ u64 tile_lines(int batch, int tw) { return ((u64)batch * tw + LANES - 1) / LANES; }

// Split-K tiles: lane l of every warp owns LV vectors of V columns, at l*V,
// (32 + l)*V, ... of the tile, so a warp's loads of one row are LV runs of
// 32 * V contiguous elements.  An RB-row batch bucket (1, 2, 4, 8) gives a
// thread RB * V * LV fp32 accumulators, at most GC3_GV_SPLIT_ACC: wider tiles
// (LV up to 4) where the batch is small, 8-byte vectors where 16-byte ones
// would not fit a row of 8 (the host mirrors this in gemv_kernel.split_vec).
__device__ __forceinline__ int splitk_rows(int batch) { return batch <= 1 ? 1 : batch <= 2 ? 2 : batch <= 4 ? 4 : 8; }
__device__ __forceinline__ int splitk_vec(int batch) {
  return splitk_rows(batch) * GC3_CMP_VEC <= GC3_GV_SPLIT_ACC ? GC3_CMP_VEC : GC3_CMP_VEC / 2;
}

// Floats of the warps' partial sums a split-K block holds in shared memory: half the
// warps' tiles of the widest tile (LV at most 4).  The tree needs a power-of-two warp count.
constexpr int SPLIT_SRED = GC3_MAX_THREADS / 64 * 32 * GC3_CMP_VEC * 4;
static_assert((GC3_MAX_THREADS / 32 & (GC3_MAX_THREADS / 32 - 1)) == 0, "split-K blocks: a power-of-two warp count");

// RB fp32 values from shared memory, in 16-byte reads where RB allows (the rows of one k).
template <int RB>
__device__ __forceinline__ void xs_load(const float* p, float (&v)[RB]) {
  if constexpr (RB % 4 == 0) {
#pragma unroll
    for (int r = 0; r < RB; r += 4) {
      const float4 f = *(const float4*)(p + r);
      v[r] = f.x, v[r + 1] = f.y, v[r + 2] = f.z, v[r + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int r = 0; r < RB; ++r) v[r] = p[r];
  }
}

// One slice: columns [c0, c0 + width) of rows [k0, k1) of w (width a multiple of
// V, at most 32 * V * LV).  Warp q takes rows k0 + q, k0 + q + WARPS, ..., the
// block a contiguous stretch of w, and every thread has U rows of loads in
// flight (GC3_GV_SPLIT_INFLIGHT bytes) before it uses one.  x's rows of the
// slice wait in shared memory as fp32, the batch's values of one k side by
// side (in chunks, in `sred`, free until the warps' sums): one or two 16-byte
// reads a row of w instead of a load per batch row, which would outnumber the
// weight's loads from 2 rows on.  The warps' sums meet in `sred` in warp order
// (the same bits every run) and go to part[r * N + column] in fp32.
template <int V, int RB, int LV, bool ALIGNED>
__device__ void splitk_item(const elem_t* __restrict__ x, const elem_t* __restrict__ w, int batch, int K, int N,
                            int c0, int width, int k0, int k1, float* part, float* sred) {
  constexpr int ROW = V * LV * (int)sizeof(elem_t);   // bytes a thread loads per row
  // Half as many bytes in flight where more than 32 accumulators share the registers.
  constexpr int BYTES = RB * V * LV > 32 ? GC3_GV_SPLIT_INFLIGHT / 2 : GC3_GV_SPLIT_INFLIGHT;
  constexpr int U = BYTES / ROW < 1 ? 1 : BYTES / ROW > 8 ? 8 : BYTES / ROW;
  constexpr int TW = 32 * V * LV;
  constexpr int XR = SPLIT_SRED / RB;   // rows of x a chunk holds
  static_assert(XR % (GC3_MAX_THREADS / 32 * 8) == 0, "a chunk of x: whole rounds of every warp's rows");
  const int lane = threadIdx.x & 31, q = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* xs = sred;
  float acc[RB][LV][V];
#pragma unroll
  for (int r = 0; r < RB; ++r)
#pragma unroll
    for (int j = 0; j < LV; ++j)
#pragma unroll
      for (int c = 0; c < V; ++c) acc[r][j][c] = 0.f;
  const i64 step = (i64)nw * N;
  for (int kc = k0; kc < k1; kc += XR) {
    const int kn = min(k1 - kc, XR), kend = kc + kn;
    __syncthreads();   // the previous chunk's (or item's) readers of sred are done
    for (int i = threadIdx.x; i < kn * RB; i += blockDim.x) {
      const int r = i / kn, kk = i - r * kn;
      xs[kk * RB + r] = r < batch ? cmp_f32(x[(i64)r * K + kc + kk]) : 0.f;
    }
    __syncthreads();
    const elem_t* wp = w + (i64)(kc + q) * N + c0 + lane * V;
    for (int k = kc + q; k < kend; k += nw * U) {
#if GC3_GV_SPLIT_PREFETCH > 0
      // The rows GC3_GV_SPLIT_PREFETCH iterations ahead into L2, one lane per 128-byte line:
      // more of the weight in flight than the registers hold.
      if ((lane * V * (int)sizeof(elem_t)) % 128 == 0)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ahead = k + nw * (U * GC3_GV_SPLIT_PREFETCH + u);
          if (ahead < k1)
#pragma unroll
            for (int j = 0; j < LV; ++j)
              if ((lane + 32 * j) * V < width)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wp + (i64)(U * GC3_GV_SPLIT_PREFETCH + u) * step +
                                                              32 * j * V));
        }
#endif
      CmpVec<V> wv[U][LV];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < LV; ++j) {
          if ((lane + 32 * j) * V < width && k + nw * u < kend) {
            const elem_t* src = wp + u * step + 32 * j * V;
            if constexpr (ALIGNED) {
              wv[u][j] = cmp_load<V>(src);
            } else {
#pragma unroll
              for (int c = 0; c < V; ++c) wv[u][j].e[c] = src[c];
            }
          } else {
#pragma unroll
            for (int c = 0; c < V; ++c) wv[u][j].e[c] = from_acc(0.f);
          }
        }
      wp += U * step;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k + nw * u;
        if (kk >= kend) break;
        float xv[RB];
        xs_load<RB>(xs + (kk - kc) * RB, xv);
#pragma unroll
        for (int j = 0; j < LV; ++j)
#pragma unroll
          for (int c = 0; c < V; ++c) {
            const float wf = cmp_f32(wv[u][j].e[c]);
#pragma unroll
            for (int r = 0; r < RB; ++r) acc[r][j][c] = fmaf(xv[r], wf, acc[r][j][c]);
          }
      }
    }
  }
  __syncthreads();   // x's readers are done before the sums reuse sred
  // The warps' sums, in a fixed tree (the upper half of the warps adds into the lower
  // half, until warp 0 holds the block's), so the bits do not vary from run to run.
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    if (r >= batch) break;
    for (int h = nw / 2; h >= 1; h /= 2) {
      if (q >= h && q < 2 * h)
#pragma unroll
        for (int j = 0; j < LV; ++j)
#pragma unroll
          for (int c = 0; c < V; ++c) sred[(q - h) * TW + (lane + 32 * j) * V + c] = acc[r][j][c];
      __syncthreads();
      if (q < h)
#pragma unroll
        for (int j = 0; j < LV; ++j)
#pragma unroll
          for (int c = 0; c < V; ++c) acc[r][j][c] += sred[q * TW + (lane + 32 * j) * V + c];
      __syncthreads();
    }
    if (q == 0)
#pragma unroll
      for (int j = 0; j < LV; ++j)
        if ((lane + 32 * j) * V < width)
#pragma unroll
          for (int c = 0; c < V; ++c) part[(i64)r * N + c0 + (lane + 32 * j) * V + c] = acc[r][j][c];
  }
}

template <int V, int RB>
__device__ __forceinline__ void splitk_run(const elem_t* x, const elem_t* w, int batch, int K, int N, int c0,
                                           int width, int k0, int k1, float* part, float* sred) {
  constexpr int FIT = GC3_GV_SPLIT_ACC / (RB * V);
  constexpr int LV = FIT < 1 ? 1 : FIT > 4 ? 4 : FIT;
  if (((u64)w & (V * sizeof(elem_t) - 1)) == 0)
    splitk_item<V, RB, LV, true>(x, w, batch, K, N, c0, width, k0, k1, part, sred);
  else
    splitk_item<V, RB, LV, false>(x, w, batch, K, N, c0, width, k0, k1, part, sred);
}

// Item i of a split-K call (slice i % split of K for tile i / split of tw columns)
// into the slice's fp32 partial [batch][N] in `part`.
__device__ __forceinline__ void splitk_slice(const elem_t* x, const elem_t* w, int batch, int K, int N, int tw,
                                             int split, int i, float* part, float* sred) {
  const int j = i / split, s = i - j * split;
  const int c0 = j * tw, width = min(tw, N - c0);
  const int per = ((K + split - 1) / split + 15) / 16 * 16;
  const int k0 = min(K, s * per), k1 = min(K, k0 + per);
  float* mine = part + (i64)s * batch * N;
  if (splitk_vec(batch) != GC3_CMP_VEC)
    splitk_run<GC3_CMP_VEC / 2, 8>(x, w, batch, K, N, c0, width, k0, k1, mine, sred);
  else if (batch == 1)
    splitk_run<GC3_CMP_VEC, 1>(x, w, batch, K, N, c0, width, k0, k1, mine, sred);
  else if (batch == 2)
    splitk_run<GC3_CMP_VEC, 2>(x, w, batch, K, N, c0, width, k0, k1, mine, sred);
  else if (batch <= 4)
    splitk_run<GC3_CMP_VEC, 4>(x, w, batch, K, N, c0, width, k0, k1, mine, sred);
  else
    splitk_run<GC3_CMP_VEC, 8>(x, w, batch, K, N, c0, width, k0, k1, mine, sred);
}

}  // namespace gv

// x, w, out and the split-K workspace of each local rank, by value: a call uploads nothing.
struct GvIO {
  u64 p[4 * GC3_GV_MAX_LOCAL];
};

// grid (blocks per rank, local ranks); blockIdx.y = local slot, rank rank0 + slot.
// peers: [nlocal][nranks] scratch bases as this process addresses them.
// io: x, w, out and workspace of each local rank for this call.  tw: columns per
// tile (batch * tw <= GC3_GV_TILE_LANES).  split: 0 for column tiles over all of
// K, else the split-K form with `split` slices of K per tile of 32 * splitk_vec
// columns (tw).  max_lines, region_lines, grid_max: as gc3_small_allreduce's.
// Two entry points of one body (SPLIT: the split-K form), so that each gets the
// registers its own loops need: the column tiles' mma path needs many more.
template <bool SPLIT>
__device__ __forceinline__ void gemv_allreduce(const Plan* plan, const u64* peers, const GvIO& io, int nranks,
                                               int rank0, int batch, int K, int N, int tw, int split,
                                               long long max_lines, long long region_lines, int grid_max) {
  const Plan P = *plan;
  const int slot = blockIdx.y;
  const int me = rank0 + slot;
  const u64* base = peers + (u64)slot * nranks;
  u64* header = (u64*)base[me];
  const elem_t* x = (const elem_t*)io.p[4 * slot];
  const elem_t* w = (const elem_t*)io.p[4 * slot + 1];
  elem_t* out = (elem_t*)io.p[4 * slot + 2];
  char* work = (char*)io.p[4 * slot + 3];

  __shared__ __align__(16) elem_t tile[GC3_GV_TILE_LANES];
  const SaCall call = sa_call_begin(header, region_lines);
  const u64 k = call.k;
  const unsigned flag = call.flag;
  const u64 region = call.region;
  auto lines_of = [&](int r) { return (uint4*)(base[r] + region); };
  const int tiles = (N + tw - 1) / tw;
  const u64 per_tile = gv::tile_lines(batch, tw);

  // The tile's partial, row-major [batch][width] in `tile`, onto slot `me` of every rank's lines.
  auto put = [&](int j, int n) {
    const u64 L = ((u64)n + gv::LANES - 1) / gv::LANES;
    const u64 at = (u64)me * max_lines + (u64)j * per_tile;
    for (u64 g = threadIdx.x; g < L; g += blockDim.x) {
      Pack<8> v;
      v.raw = make_uint2(0, 0);
#pragma unroll
      for (int e = 0; e < gv::LANES; ++e)
        if (g * gv::LANES + e < (u64)n) v.e[e] = tile[g * gv::LANES + e];
      for (int p = 0; p < nranks; ++p) st_volatile_v4(lines_of(p) + at + g, make_uint4(v.raw.x, flag, v.raw.y, flag));
    }
    __syncthreads();   // the next tile overwrites `tile`
  };

  if constexpr (!SPLIT) {
    for (int j = blockIdx.x; j < tiles; j += gridDim.x) {
      const int c0 = j * tw, width = min(tw, N - c0);
      // gemv_store's closing barrier publishes the tile.
      gemv_tile(x, w, batch, K, N, c0, width, tile, 0, batch * width);
      put(j, batch * width);
    }
  } else {
    // Split-K: item i is slice i % split of K for tile i / split.  Every slice's fp32
    // partial goes to the workspace; the block that finishes a tile's last slice (its
    // arrival counter says so) sums the slices in slice order, rounds once and puts
    // the tile, so the sum's bits do not depend on which block came last.  That block
    // also sets the counter back to 0 for the next call (all slices have arrived).
    __shared__ __align__(16) float sred[gv::SPLIT_SRED];
    __shared__ int s_last;
    int* arrived = (int*)work;
    float* part = (float*)(work + GC3_GV_COUNTER_BYTES);
    for (int i = blockIdx.x; i < tiles * split; i += gridDim.x) {
      const int j = i / split;
      const int c0 = j * tw, width = min(tw, N - c0);
      gv::splitk_slice(x, w, batch, K, N, tw, split, i, part, sred);
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        s_last = atomicAdd(arrived + j, 1) == split - 1;
        if (s_last) atomicExch(arrived + j, 0);
      }
      __syncthreads();
      if (!s_last) continue;
      __threadfence();
      const int n = batch * width;
      for (int l = threadIdx.x; l < n; l += blockDim.x) {
        const int r = l / width;
        const float* src = part + (i64)r * N + c0 + (l - r * width);
        float sum = 0.f;
        for (int q = 0; q < split; ++q) sum += __ldcg(src + (i64)q * batch * N);
        tile[l] = from_acc(sum);
      }
      __syncthreads();
      put(j, n);
    }
  }

  const uint4* mine = lines_of(me);
  bool ok = true;
  for (int j = blockIdx.x; ok && j < tiles; j += gridDim.x) {
    const int c0 = j * tw, width = min(tw, N - c0);
    const int n = batch * width;
    const u64 L = ((u64)n + gv::LANES - 1) / gv::LANES;
    for (u64 g = threadIdx.x; ok && g < L; g += blockDim.x) {
      float acc[gv::LANES];
      const u64 line = (u64)j * per_tile + g;
      for (int p = 0; p < nranks; ++p) {
        Pack<8> v;
        const Where wh{me, (int)blockIdx.x, 5, (int)line, 0};
        if (!ll_read(P, wh, p, 0, mine + (u64)p * max_lines + line, flag, v.raw)) {
          ok = false;
          break;
        }
#pragma unroll
        for (int e = 0; e < gv::LANES; ++e) acc[e] = p == 0 ? cmp_f32(v.e[e]) : acc[e] + cmp_f32(v.e[e]);
      }
      if (!ok) break;
#pragma unroll
      for (int e = 0; e < gv::LANES; ++e) {
        const int l = (int)(g * gv::LANES) + e;
        if (l < n) {
          const int r = l / width;
          out[(i64)r * N + c0 + (l - r * width)] = from_acc(acc[e]);
        }
      }
    }
  }
  // Every thread ends here, a failed one too.
  sa_call_end(header, k, grid_max);
}

#define GC3_GV_ENTRY(name, split_form)                                                                         \
  extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)                                               \
      name(const Plan* plan, const u64* peers, const GvIO io, int nranks, int rank0, int batch, int K, int N, \
           int tw, int split, long long max_lines, long long region_lines, int grid_max) {                    \
    gemv_allreduce<split_form>(plan, peers, io, nranks, rank0, batch, K, N, tw, split, max_lines, region_lines, \
                               grid_max);                                                                      \
  }
GC3_GV_ENTRY(gc3_gemv_allreduce, false)
GC3_GV_ENTRY(gc3_gemv_allreduce_splitk, true)
