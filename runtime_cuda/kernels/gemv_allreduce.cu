// GEMV + AllReduce in one launch (a row-parallel linear layer at decode):
// y = sum over ranks r of x_r [batch, K] @ w_r [K, N], the same bits on every
// rank (runtime_cuda/fused/gemv_kernel.py is the host side).
//
// The weight is the whole cost, so every SM reads a share of it, in one of two
// forms.  Column tiles (large batches): block b owns tiles b, b + grid, ... of
// `tw` columns over all of K and all batch rows, computed with the interpreter's
// gemv passes (prims_compute.cuh).  Split-K (up to GC3_GV_SPLIT_MAX_BATCH rows):
// a tile is cut into `split` slices of K, one block each, whose fp32 partials
// meet in a workspace; the tile's blocks then sum a share of it each (the phases
// are described where they run).  Either way a tile's partial goes into slot `me`
// of every rank's scratch (its own too) on the epoch-tagged LL lines of
// small_allreduce.cu, whose comment says how a call knows its number and flag
// from the per-block counters and why a parity region is never overwritten
// while a peer still reads it (every call reads a line from every peer).  The
// block that put a share then reduces it: every rank sums the n partials of a
// line in rank order 0..n-1 in fp32 and rounds once, so the ranks agree bit for
// bit and the only rounding before the sum is the one each rank's partial gets,
// as a matmul's output does before NCCL sums it.
//
// A block waits only for work every block does before it waits (split-K slices
// of its own rank) and for the lines its namesakes on the other ranks put, after
// putting its own: with the grid resident at once (the host's bound), every wait
// ends.  Nothing is cleared and nothing is synchronised on the host, so the
// launch can sit in a CUDA graph: a replay is a new call.
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
  constexpr int TW = 32 * V * LV;
  // One pass where the host's tile is this bucket's (always, but for the tensor cores' tile
  // of a build without them).
  for (int cc = 0; cc < width; cc += TW) {
    if (((u64)w & (V * sizeof(elem_t) - 1)) == 0)
      splitk_item<V, RB, LV, true>(x, w, batch, K, N, c0 + cc, min(TW, width - cc), k0, k1, part, sred);
    else
      splitk_item<V, RB, LV, false>(x, w, batch, K, N, c0 + cc, min(TW, width - cc), k0, k1, part, sred);
  }
}

// The rows form of a CUDA-core split-K slice (16-bit types up to GC3_GV_SPLIT_FMA_ROWS rows):
// the block sweeps rows [k0, k1) of columns [c0, c0 + width) front to back, thread t owning
// the V columns at t * V (the host's tiles are one pass of the block's vectors wide), with
// GC3_GV_ROWS_INFLIGHT rows of loads in flight.  A slice's weight is then a few runs of
// blockDim.x * 16 bytes a row, read in order.  Measured through the torch operator on 2 and
// 4 H100s (b=1, in graph replays) against the splitk_item tiles, whose runs are 2 KiB a row:
// 3-12 us less a call where the weight does not stay in L2 (56-224 MiB), the same where it
// does.  Two passes a thread at once (16 KiB runs, half the rows in flight) were slower.
// x's values of a row are one load every thread shares.
template <int RB, bool ALIGNED>
__device__ void rows_item(const elem_t* __restrict__ x, const elem_t* __restrict__ w, int batch, int K, int N,
                          int c0, int width, int k0, int k1, float* part) {
  constexpr int V = GC3_CMP_VEC, U = GC3_GV_ROWS_INFLIGHT;
  const int col = threadIdx.x * V;
  const bool on = col < width;
  float acc[RB][V];
#pragma unroll
  for (int r = 0; r < RB; ++r)
#pragma unroll
    for (int c = 0; c < V; ++c) acc[r][c] = 0.f;
  const elem_t* wp = w + (i64)k0 * N + c0 + col;
  // U rows from row k (`rows` of them real: U but for the slice's last rows), loads first.
  auto step = [&](int k, int rows) {
    uint4 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < rows && on) {
        const elem_t* src = wp + (i64)u * N;
        if constexpr (ALIGNED) {
          wv[u] = stream_load(src);
        } else {
          Vec16 t;
#pragma unroll
          for (int c = 0; c < V; ++c) t.e[c] = src[c];
          wv[u] = t.u;
        }
      } else {
        wv[u] = make_uint4(0, 0, 0, 0);   // zero bits: +0.0 in every float type
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= rows) break;
      float xv[RB];
#pragma unroll
      for (int r = 0; r < RB; ++r) xv[r] = r < batch ? cmp_f32(x[(i64)r * K + k + u]) : 0.f;
      Vec16 t;
      t.u = wv[u];
#pragma unroll
      for (int c = 0; c < V; ++c) {
        const float wf = cmp_f32(t.e[c]);
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r][c] = fmaf(xv[r], wf, acc[r][c]);
      }
    }
    wp += (i64)U * N;
  };
  int k = k0;
  for (; k + U <= k1; k += U) step(k, U);
  if (k < k1) step(k, k1 - k);
  if (!on) return;
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    if (r >= batch) break;
#pragma unroll
    for (int c = 0; c < V; ++c) part[(i64)r * N + c0 + col + c] = acc[r][c];
  }
}

// A rows-form slice of any tile width, one pass of the block's vectors at a time (the host's
// tiles are one pass wide).
template <int RB>
__device__ __forceinline__ void rows_run(const elem_t* x, const elem_t* w, int batch, int K, int N, int c0,
                                         int width, int k0, int k1, float* part) {
  const int span = blockDim.x * GC3_CMP_VEC;
  for (int cc = 0; cc < width; cc += span) {
    if (((u64)w & 15) == 0)
      rows_item<RB, true>(x, w, batch, K, N, c0 + cc, min(span, width - cc), k0, k1, part);
    else
      rows_item<RB, false>(x, w, batch, K, N, c0 + cc, min(span, width - cc), k0, k1, part);
  }
}

#ifdef GC3_CMP_MMA
// A split-K slice of 3 to 8 rows on tensor cores (16-bit types): warp q owns the
// MMA_COLS columns c0 + q * MMA_COLS .. of the tile and every k of the slice, as a
// warp tile of gemv_pass_mma (prims_compute.cuh: A = w^T in 4 m-tiles, B = x^T with
// the batch rows as its 8 columns), U k-steps of 16 loaded before any is used, as
// stream_load's (3.4-4.7 us a call less at batch 4 and 8 where the weight does not stay in
// L2, on 2 and 4 H100s; within 0.5 us where it does: scripts/probe_gemv_phases.py).  x's
// fragments come from shared memory.  A warp's accumulators are the slice's partial of its
// columns, whole: they go to part[r * N + column] with no exchange between warps.  Rows
// k >= k1 read as 0, of w and of x alike.
constexpr int MMA_COLS = GC3_GV_MMA_COLS, MMA_MT = MMA_COLS / 16;

template <bool VEC>
__device__ void splitk_item_mma(const elem_t* __restrict__ x, const elem_t* __restrict__ w, int batch, int K, int N,
                                int c0, int k0, int k1, float* part, float* sred) {
  static_assert(GC3_MAX_THREADS / 32 * 8 * MMA_COLS <= SPLIT_SRED, "sred holds every warp's tile");
  constexpr int MT = MMA_MT, U = GC3_CMP_MMA_INFLIGHT / (16 * MT) < 1 ? 1 : GC3_CMP_MMA_INFLIGHT / (16 * MT);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, q = threadIdx.x >> 5;
  const i64 c = c0 + (i64)q * MMA_COLS + 2 * MT * g;   // this thread's first column
  float d[MT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[m][e] = 0.f;
  // x's rows of a stretch of the slice staged in `sred` as words of two k of one row, k-pair
  // major (xs[(k - kc) / 2 * 8 + row]): the 32 lanes' fragment of a step are then 32
  // consecutive words.  Loaded from global memory, a fragment touched 8 rows' lines at every
  // step; staged, batch 4 and 8 took about 1 us a call less on 2 and 4 H100s
  // (scripts/probe_gemv_phases.py).  Every warp stays for the block's barriers, one past w's
  // last column too.
  constexpr int XS_ROWS = SPLIT_SRED / 4;
  unsigned* xs = reinterpret_cast<unsigned*>(sred);
  const bool live = c0 + (i64)q * MMA_COLS < N;
  for (int kc = k0; kc < k1; kc += XS_ROWS) {
    const int kc1 = min(k1, kc + XS_ROWS), words = min(XS_ROWS, (kc1 - kc + 15) / 16 * 16) * 4;
    __syncthreads();   // the stretch before is read
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
      const int r = i & 7;
      xs[i] = mma_xload<VEC>(k1, r < batch, x + (i64)(r < batch ? r : 0) * K, kc + 2 * (i >> 3));
    }
    __syncthreads();
    if (!live) continue;
    for (int kb = kc; kb < kc1; kb += 16 * U) {
      unsigned wv[U][4][MT];
#pragma unroll
      for (int u = 0; u < U; ++u) mma_wstep<MT, VEC, true>(wv[u], w, k1, N, kb + 16 * u + 2 * t, c);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (kb + 16 * u >= kc1) break;   // uniform across the warp
        const int at = (kb + 16 * u - kc) * 4 + 8 * t + g;
        const unsigned b[2] = {xs[at], xs[at + 32]};
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          unsigned a[4];
          mma_afrag<MT>(a, wv[u], m);
          cmp_mma(d[m], a, b);
        }
      }
    }
  }
  __syncthreads();   // every warp's reads of xs, before `sred` takes the warps' tiles
  if (!live) return;
  // D row g of m-tile m is column c + 2m, row g + 8 column c + 2m + 1; D column 2t (+1) is
  // batch row 2t (+1).  Straight from the fragments, a warp's stores would scatter over 4x
  // the sectors they fill; through the warp's MMA_COLS x 8 floats of `sred` (an XOR of the
  // low column bits by row and column half keeps the 32 lanes of each store on 32 banks)
  // they leave as whole rows.
  float* sw = sred + q * 8 * MMA_COLS;
  auto at = [](int r, int cl) { return r * MMA_COLS + (cl ^ (((cl >> 5) & 1) << 2 | ((r >> 1) & 3))); };
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) sw[at(2 * t + (e & 1), 2 * MT * g + 2 * m + (e >> 1))] = d[m][e];
  __syncwarp();
  const i64 cw = c0 + (i64)q * MMA_COLS;
  for (int idx = lane; idx < batch * MMA_COLS; idx += 32) {
    const int r = idx / MMA_COLS, cl = idx - r * MMA_COLS;
    if (cw + cl < N) part[(i64)r * N + cw + cl] = sw[at(r, cl)];
  }
}
#endif

// Rows [k0, k1) of K that slice s of `split` covers (whole 16-row steps but the last).
__device__ __forceinline__ void slice_rows(int K, int split, int s, int& k0, int& k1) {
  const int per = ((K + split - 1) / split + 15) / 16 * 16;
  k0 = min(K, s * per);
  k1 = min(K, k0 + per);
}

// The first rows of the weight this block reads first (item blockIdx.x: a split-K slice, or
// a column tile over all of K), into L2, GC3_GV_PDL_PREFETCH_BYTES over the grid.  Only a
// prefetch may come before grid_dependency_wait: L2 is where a write by the kernel ahead
// lands too, so a weight that kernel changes is still read fresh after the wait.
__device__ __forceinline__ void prefetch_first_item(const elem_t* w, int K, int N, int tw, int split) {
  const int tiles = (N + tw - 1) / tw, i = blockIdx.x;
  if (i >= tiles * (split ? split : 1)) return;
  int c0 = i * tw, k0 = 0, k1 = K;
  if (split) {
    c0 = i / split * tw;
    slice_rows(K, split, i % split, k0, k1);
  }
  const u64 row = (u64)min(tw, N - c0) * sizeof(elem_t);
  const u64 budget = (u64)GC3_GV_PDL_PREFETCH_BYTES / ((u64)gridDim.x * gridDim.y);
  const int lines = (int)((row + 127) / 128) + 1;   // a row need not start on a 128-byte line
  const int rows = (int)min((u64)(k1 - k0), budget / row);
  for (int t = threadIdx.x; t < rows * lines; t += blockDim.x) {
    const int r = t / lines, l = t - r * lines;
    const char* start = (const char*)(w + (i64)(k0 + r) * N + c0);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(start + min((u64)l * 128, row - 1)));
  }
}

// Item i of a split-K call (slice i % split of K for tile i / split of tw columns)
// into the slice's fp32 partial [batch][N] in `part`.
__device__ __forceinline__ void splitk_slice(const elem_t* x, const elem_t* w, int batch, int K, int N, int tw,
                                             int split, int i, float* part, float* sred) {
  const int j = i / split, s = i - j * split;
  const int c0 = j * tw, width = min(tw, N - c0);
  int k0, k1;
  slice_rows(K, split, s, k0, k1);
  float* mine = part + (i64)s * batch * N;
#ifdef GC3_CMP_MMA
  // The host's tile for these rows: MMA_COLS columns a warp (gemv_kernel.split_plan).
  if (batch > GC3_GV_SPLIT_FMA_ROWS) {
    if (N % 8 == 0 && ((u64)w & 15) == 0 && K % 2 == 0 && ((u64)x & 3) == 0)
      splitk_item_mma<true>(x, w, batch, K, N, c0, k0, k1, mine, sred);
    else
      splitk_item_mma<false>(x, w, batch, K, N, c0, k0, k1, mine, sred);
    return;
  }
#endif
  if constexpr (sizeof(elem_t) == 2) {
    if (batch <= GC3_GV_SPLIT_FMA_ROWS) {   // the host's rows-form plan (gemv_kernel.split_plan)
      if (batch == 1)
        rows_run<1>(x, w, batch, K, N, c0, width, k0, k1, mine);
      else
        rows_run<GC3_GV_SPLIT_FMA_ROWS>(x, w, batch, K, N, c0, width, k0, k1, mine);
      return;
    }
  }
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

// Element (r, column) of a tile summed over `split` slices' partials in slice order (the same
// bits whichever block sums it), AHEAD loads in flight: L2 latency, not bandwidth, is what a
// sum of a few elements a thread costs, so every slice's load should be in one round trip (the
// caller takes 32 where a thread sums more than 16 slices, while 16 costs less where that
// covers them).
template <int AHEAD>
__device__ __forceinline__ float slice_sum(const float* src, i64 pitch, int split) {
  float sum = 0.f;
  for (int q0 = 0; q0 < split; q0 += AHEAD) {
    float v[AHEAD];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      v[u] = q0 + u < split ? __ldcg(src) : 0.f;
      src += pitch;   // one running address, not AHEAD of them live at once
    }
#pragma unroll
    for (int u = 0; u < AHEAD; ++u)
      if (q0 + u < split) sum += v[u];
  }
  return sum;
}

}  // namespace gv

#ifdef GC3_GV_PHASES
// Where a call's time goes (scripts/probe_gemv_phases.py builds with this): thread 0 of each
// block stamps the global timer as the block ends each phase, the latest call's stamps kept.
// Blocks of every local rank: at most one a multiprocessor each (the host's bound).
__device__ unsigned long long gc3_gv_phases[GC3_GV_MAX_LOCAL * 1024][10];
#define GV_STAMP(n)                                                   \
  do {                                                                \
    if (threadIdx.x == 0) {                                           \
      unsigned long long t_;                                          \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));          \
      gc3_gv_phases[blockIdx.y * gridDim.x + blockIdx.x][n] = t_;     \
    }                                                                 \
  } while (0)
#else
#define GV_STAMP(n) \
  do {              \
  } while (0)
#endif

// x, w, out and the split-K workspace of each local rank, by value: a call uploads nothing.
struct GvIO {
  u64 p[4 * GC3_GV_MAX_LOCAL];
};

// grid (blocks per rank, local ranks); blockIdx.y = local slot, rank rank0 + slot.
// peers: [nlocal][nranks] scratch bases as this process addresses them.
// io: x, w, out and workspace of each local rank for this call.  tw: columns per
// tile (batch * tw <= GC3_GV_TILE_LANES for the column tiles).  split: 0 for
// column tiles over all of K, else the split-K form with `split` slices of K per
// tile (tw: gemv_kernel.split_plan's, which mirrors the kernel's).
// max_lines, region_lines, grid_max: as gc3_small_allreduce's.
// Two entry points of one body (SPLIT: the split-K form), so that each gets the
// registers its own loops need: the column tiles' mma path needs many more.
template <bool SPLIT>
__device__ __forceinline__ void gemv_allreduce(const Plan* plan, const u64* peers, const GvIO& io, int nranks,
                                               int rank0, int batch, int K, int N, int tw, int split,
                                               long long max_lines, long long region_lines, int grid_max) {
  // Before the wait only what cannot see the kernel ahead's writes stale (sync.cuh): a launch
  // marked for programmatic dependent launch starts while that kernel still runs.
  GV_STAMP(0);
  gv::prefetch_first_item((const elem_t*)io.p[4 * blockIdx.y + 1], K, N, tw, split);
  grid_dependency_wait();
  allow_next_grid();
  GV_STAMP(1);
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
  // Item i's share of a tile's partial (n elements, row-major [batch][width]): lines [g0, g1)
  // of tile j.  A column tile is one item; a split-K tile is split items, one per slice.
  const int parts = SPLIT ? split : 1;
  const int items = tiles * parts;
  auto share = [&](int i, int& j, int& n, u64& g0, u64& g1) {
    j = i / parts;
    n = batch * min(tw, N - j * tw);
    const u64 L = ((u64)n + gv::LANES - 1) / gv::LANES, per = (L + parts - 1) / parts;
    g0 = min(L, (u64)(i - j * parts) * per);
    g1 = min(L, g0 + per);
  };

  // Lines [g0, g1) of tile j's partial (n elements) onto slot `me` of every rank's lines,
  // element e of line g from tile[(g - g0) * LANES + e].
  auto put = [&](int j, int n, u64 g0, u64 g1) {
    const u64 at = (u64)me * max_lines + (u64)j * per_tile;
    for (u64 g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
      Pack<8> v;
      v.raw = make_uint2(0, 0);
#pragma unroll
      for (int e = 0; e < gv::LANES; ++e)
        if (g * gv::LANES + e < (u64)n) v.e[e] = tile[(g - g0) * gv::LANES + e];
      for (int p = 0; p < nranks; ++p) st_volatile_v4(lines_of(p) + at + g, make_uint4(v.raw.x, flag, v.raw.y, flag));
    }
    __syncthreads();   // the next share overwrites `tile`
  };

  bool ok = true;
  if constexpr (!SPLIT) {
    for (int j = blockIdx.x; j < tiles; j += gridDim.x) {
      const int c0 = j * tw, width = min(tw, N - c0);
      // gemv_store's closing barrier publishes the tile.
      gemv_tile(x, w, batch, K, N, c0, width, tile, 0, batch * width);
      put(j, batch * width, 0, ((u64)batch * width + gv::LANES - 1) / gv::LANES);
    }
  } else {
    // Split-K in phases, so that no block waits for work a block has yet to start (each
    // finishes its slices before it waits, and the grid is resident at once):
    //  1. item i computes slice i % split of tile i / split into the workspace, then stores
    //     the call's number in done[i];
    //  2. item i waits for its tile's slices, sums its share of the tile's lines over them in
    //     slice order (the same bits whichever block sums), rounds once and puts the share;
    //  3. item i reduces the same lines over the ranks (below, as a column tile does).
    // All of a tile's blocks share its sum and reduction: one block summing a whole tile
    // waited out every L2 round trip of it alone while the other SMs sat idle.
    __shared__ __align__(16) float sred[gv::SPLIT_SRED];
    u64* done = (u64*)work;
    float* part = (float*)(work + GC3_GV_DONE_BYTES);
    for (int i = blockIdx.x; i < items; i += gridDim.x) {
      gv::splitk_slice(x, w, batch, K, N, tw, split, i, part, sred);
      // The barrier orders every thread's partial before thread 0's release store, which is
      // cumulative: the readers' acquire of done[i] then sees them all.  A fence in every
      // thread as well only waited out each thread's stores again (0.3-0.7 us a call).
      __syncthreads();
      if (threadIdx.x == 0) st_release_gpu(done + i, k);
    }
    GV_STAMP(2);
    for (int i = blockIdx.x; ok && i < items; i += gridDim.x) {
      int j, n;
      u64 g0, g1;
      share(i, j, n, g0, g1);
      for (int q = threadIdx.x; ok && q < split; q += blockDim.x) {
        u64 seen;
        const Where wh{me, (int)blockIdx.x, 7, j, 0};
        ok = wait_geq<false, true>(P, done + j * split + q, k, wh, GC3_WAIT_SLICE, (j * split + q) % gridDim.x, q,
                                   seen);
      }
      ok = __syncthreads_and(ok);
      if (!ok) break;
      GV_STAMP(3);
      const int c0 = j * tw, width = n / batch;
      constexpr u64 CH = GC3_GV_TILE_LANES / gv::LANES;   // lines `tile` holds
      for (u64 h0 = g0; h0 < g1; h0 += CH) {
        const u64 h1 = min(g1, h0 + CH);
        // The share's lines [h0, h1) summed over the tile's slices into `tile`, the slices dealt
        // out to `grp` groups of C threads, thread c of each on elements c, c + C, ..., so that a
        // warp's loads of a slice are 32 consecutive floats.  Each group sums its run of slices
        // in slice order, then thread c adds the groups' sums in group order: the bits are the
        // same on every call.  Several groups where a share has fewer elements than the block
        // has threads, over more slices than one round of loads covers (the rows form's: a slice
        // a block).  Groups of lanes of one warp on one element, every load a sector of its own,
        // took 2.1-3.0 us from a tile's last slice to its sum at 4 H100s, where these take 1.6.
        const int ne = (int)((h1 - h0) * gv::LANES), C = min((int)blockDim.x, (ne + 31) / 32 * 32);
        int grp = 1;
        while (grp < 32 && 2 * grp * C <= (int)blockDim.x && split > 16 * grp) grp *= 2;
        const int per = (split + grp - 1) / grp, g = threadIdx.x / C, c = threadIdx.x % C;
        const int q0 = min(split, g * per), q1 = min(split, q0 + per);
        for (int e0 = 0; e0 < ne; e0 += C) {   // the same rounds in every thread (one where grp > 1)
          const int e = e0 + c, l = (int)(h0 * gv::LANES) + e;
          float sum = 0.f;
          if (g < grp && e < ne && l < n) {
            const int r = l / width;
            const float* src = part + (i64)r * N + c0 + (l - r * width) + (i64)q0 * batch * N;
            sum = per <= 16 ? gv::slice_sum<16>(src, (i64)batch * N, q1 - q0)
                            : gv::slice_sum<32>(src, (i64)batch * N, q1 - q0);
          }
          if (grp > 1) {
            if (g < grp) sred[threadIdx.x] = sum;
            __syncthreads();
            if (g == 0)
              for (int q = 1; q < grp; ++q) sum += sred[q * C + c];
          }
          if (g == 0 && e < ne) tile[e] = from_acc(sum);
        }
        __syncthreads();
        GV_STAMP(7);
        put(j, n, h0, h1);
      }
    }
  }

  GV_STAMP(4);
  // Every rank sums each line of its shares over the ranks in rank order.
  const uint4* mine = lines_of(me);
  for (int i = blockIdx.x; ok && i < items; i += gridDim.x) {
    int j, n;
    u64 g0, g1;
    share(i, j, n, g0, g1);
    const int c0 = j * tw, width = n / batch;
    for (u64 g = g0 + threadIdx.x; ok && g < g1; g += blockDim.x) {
      const u64 line = (u64)j * per_tile + g;
      auto at = [&](int p) -> const uint4* { return mine + (u64)p * max_lines + line; };
      const Where wh{me, (int)blockIdx.x, 5, (int)line, 0};
      float acc[gv::LANES];
      for (int p0 = 0; ok && p0 < nranks; p0 += LL_AHEAD) {
        uint4 v[LL_AHEAD];
        ok = ll_read_ahead(P, wh, 0, v, p0, nranks, at, flag);
        GV_STAMP(8);
#pragma unroll
        for (int a = 0; a < LL_AHEAD; ++a) {
          if (!ok || p0 + a >= nranks) break;
          Pack<8> d;
          d.raw = make_uint2(v[a].x, v[a].z);
#pragma unroll
          for (int e = 0; e < gv::LANES; ++e) acc[e] = p0 + a == 0 ? cmp_f32(d.e[e]) : acc[e] + cmp_f32(d.e[e]);
        }
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
  GV_STAMP(5);
  // Every thread ends here, a failed one too.
  sa_call_end(header, k, grid_max);
  GV_STAMP(6);
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
