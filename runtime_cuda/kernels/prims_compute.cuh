// Compute opcodes of a fused="1" IR (gc3.ir.ComputeSpec): a gemv or ebag step
// evaluates its operator for the current tile of each of its dst chunks and
// stores the result there, where the TB's next step (a send, a reduce) reads it.
// Both operators are memory-bound, so the code is shaped around their loads:
// 16-byte loads of weight / table rows where the row length and the base
// address allow it (one element at a time otherwise), fp32 accumulation, one
// rounding to elem_t per stored element, as gc3/simulator/compute.py models.
// Compiled in only for a fused IR's launch group (-DGC3_COMPUTE, module.py) and
// the float storage types (the host refuses a compute IR of any other type):
// the gemv's accumulators and shared partial sums raise the kernel's register
// and shared-memory use, which plain collectives should not pay for.
#pragma once
#include "common.cuh"
#include "reduce_ops.cuh"

#if defined(GC3_COMPUTE) && \
    (GC3_DTYPE == GC3_DT_FLOAT16 || GC3_DTYPE == GC3_DT_BFLOAT16 || GC3_DTYPE == GC3_DT_FLOAT32)
#define GC3_HAS_COMPUTE 1

// Elements per 16-byte load.
#define GC3_CMP_VEC (16 / (int)sizeof(elem_t))
// fp32 accumulators one thread holds (rows x columns of a gemv pass): more
// would raise the register count, and so lower the co-residency, of the
// whole interpreter.
#define GC3_CMP_ACC 32
// fp32 partial sums of one gemv pass in shared memory (16 KiB).
#define GC3_CMP_SMEM 4096

__device__ __forceinline__ float cmp_f32(elem_t v) { return (float)to_acc(v); }

template <int V>
struct CmpVec {
  elem_t e[V];
};

// V consecutive elements; one 16- or 8-byte load when V fills that many bytes
// (the caller guarantees the alignment), else element by element.
template <int V>
__device__ __forceinline__ CmpVec<V> cmp_load(const elem_t* p) {
  CmpVec<V> r;
  if constexpr (V * sizeof(elem_t) == 16) {
    union {
      uint4 u;
      elem_t e[V];
    } t;
    t.u = __ldg(reinterpret_cast<const uint4*>(p));
#pragma unroll
    for (int c = 0; c < V; ++c) r.e[c] = t.e[c];
  } else if constexpr (V * sizeof(elem_t) == 8) {
    union {
      uint2 u;
      elem_t e[V];
    } t;
    t.u = __ldg(reinterpret_cast<const uint2*>(p));
#pragma unroll
    for (int c = 0; c < V; ++c) r.e[c] = t.e[c];
  } else {
#pragma unroll
    for (int c = 0; c < V; ++c) r.e[c] = p[c];
  }
  return r;
}

// One gemv pass: rows [b0, b0 + nb) of x (nb <= RB) against weight columns
// [c0, c0 + nv*V) (absolute; c0 a multiple of V).  Threads are nv column
// vectors x ks slices of K, consecutive threads on consecutive vectors, so a
// warp's loads of one weight row are contiguous and its x loads broadcast; the
// K-slices meet in `sacc` [nb][nv*V] (shared atomics, once per thread), then
// the lanes of this tile are stored: dst[l] is chunk lane lane0 + l, chunk
// column 0 being y's column `colbase`, pc columns per chunk row.
template <int V, int RB>
__device__ void gemv_pass(const elem_t* __restrict__ x, const elem_t* __restrict__ w, int K, int N, int b0, int nb,
                          i64 c0, int nv, i64 colbase, int pc, elem_t* dst, i64 lane0, int n, float* sacc) {
  const int width = nv * V;
  for (int i = threadIdx.x; i < nb * width; i += blockDim.x) sacc[i] = 0.f;
  __syncthreads();
  const int ks = max(1, (int)blockDim.x / nv);
  for (int item = threadIdx.x; item < nv * ks; item += blockDim.x) {
    const int v = item % nv, kg = item / nv;
    float acc[RB][V];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int c = 0; c < V; ++c) acc[r][c] = 0.f;
    const elem_t* wp = w + (i64)kg * N + c0 + (i64)v * V;
    const elem_t* xp = x + (i64)b0 * K;
    const i64 wstep = (i64)ks * N;
#pragma unroll 4
    for (int k = kg; k < K; k += ks) {
      const CmpVec<V> wv = cmp_load<V>(wp);
      wp += wstep;
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        const float xv = r < nb ? cmp_f32(xp[(i64)r * K + k]) : 0.f;
#pragma unroll
        for (int c = 0; c < V; ++c) acc[r][c] = fmaf(xv, cmp_f32(wv.e[c]), acc[r][c]);
      }
    }
#pragma unroll
    for (int r = 0; r < RB; ++r)
      if (r < nb)
#pragma unroll
        for (int c = 0; c < V; ++c) atomicAdd(&sacc[r * width + v * V + c], acc[r][c]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nb * width; i += blockDim.x) {
    const int r = i / width;
    const i64 col = c0 + (i - r * width) - colbase;   // column within the chunk
    const i64 l = (i64)(b0 + r) * pc + col - lane0;
    if (col >= 0 && col < pc && l >= 0 && l < n) dst[l] = from_acc(sacc[i]);
  }
  __syncthreads();   // sacc is zeroed again by the next pass
}

// Rows [r_lo, r_hi] x absolute columns [lo, hi) in passes of RB rows and as
// many columns as `sacc` holds for them.
template <int V, int RB>
__device__ void gemv_rows(const elem_t* x, const elem_t* w, int K, int N, int r_lo, int r_hi, i64 lo, i64 hi,
                          i64 colbase, int pc, elem_t* dst, i64 lane0, int n, float* sacc) {
  const i64 c0 = lo - lo % V, c1 = min((hi + V - 1) / V * V, (i64)N);
  constexpr int PV = GC3_CMP_SMEM / (RB * V);   // column vectors per pass
  for (int b0 = r_lo; b0 <= r_hi; b0 += RB) {
    const int nb = min(RB, r_hi + 1 - b0);
    for (i64 v0 = c0; v0 < c1; v0 += (i64)PV * V)
      gemv_pass<V, RB>(x, w, K, N, b0, nb, v0, (int)min((i64)PV, (c1 - v0) / V), colbase, pc, dst, lane0, n, sacc);
  }
}

template <int V>
__device__ void gemv_cols(const elem_t* x, const elem_t* w, int K, int N, int r_lo, int r_hi, i64 lo, i64 hi,
                          i64 colbase, int pc, elem_t* dst, i64 lane0, int n, float* sacc) {
  // Batch 1 (decode) gets a pass of its own; more rows share the widest pass (unused rows are
  // predicated off), which keeps the instantiations, and NVRTC's compile time, down.
  constexpr int RBMAX = GC3_CMP_ACC / V >= 8 ? 8 : GC3_CMP_ACC / V;
  if (r_hi == r_lo)
    gemv_rows<V, 1>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else
    gemv_rows<V, RBMAX>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
}

// Lanes [lane0, lane0 + n) of a gemv chunk: y[:, colbase:colbase + pc] row-major
// (gc3.ir.ComputeSpec), y = x [batch, K] @ w [K, N].  Only the batch rows and
// columns the tile touches are computed; the weight, the dominant traffic, is
// read once per pass of up to RB rows.
__device__ void gemv_tile(const elem_t* x, const elem_t* w, int batch, int K, int N, i64 colbase, int pc,
                          elem_t* dst, i64 lane0, int n) {
  __shared__ float sacc[GC3_CMP_SMEM];
  if (n <= 0 || pc <= 0) return;
  const int r_lo = (int)(lane0 / pc), r_hi = (int)min((lane0 + n - 1) / pc, (i64)batch - 1);
  i64 lo = 0, hi = pc;
  if (r_lo == r_hi) {
    lo = lane0 % pc;
    hi = (lane0 + n - 1) % pc + 1;
  }
  lo += colbase;
  hi += colbase;
  // 16-bit types with more rows than a pass of 16-byte vectors holds: 8-byte vectors and twice the
  // rows per pass, so the weight is read half as often.
  constexpr int V8 = 8 / (int)sizeof(elem_t);
  if (sizeof(elem_t) == 2 && r_hi - r_lo + 1 > GC3_CMP_ACC / GC3_CMP_VEC && N % V8 == 0 && ((u64)w & 7) == 0)
    gemv_cols<V8>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else if (N % GC3_CMP_VEC == 0 && ((u64)w & 15) == 0)
    gemv_cols<GC3_CMP_VEC>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else
    gemv_cols<1>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
}

// Lanes [lane0, lane0 + n) of an ebag chunk whose first sample is s0 of the
// global batch: rows of T*dim, table t's pooled vector at t*dim (sum pooling
// over the CSR bag offsets[t, s] .. offsets[t, s + 1] of indices[t]).  One
// thread per V consecutive lanes of one bag, so the threads of a bag read a
// table row with contiguous loads.  An index outside [0, rows) adds nothing
// and offsets are clamped to [0, nnz]: bad input can be wrong (the host checks
// it when asked) but never reads out of bounds.
template <int V>
__device__ void ebag_lanes(const elem_t* tables, const int* idx, const int* off, int T, int rows, int dim, int nnz,
                           int B, i64 s0, elem_t* dst, i64 lane0, int n) {
  const int row = T * dim;
  for (int u = threadIdx.x; u * V < n; u += blockDim.x) {
    const i64 l = lane0 + (i64)u * V;
    const i64 s = s0 + l / row;
    const int rem = (int)(l % row), t = rem / dim, d = rem - t * dim;
    float acc[V];
#pragma unroll
    for (int c = 0; c < V; ++c) acc[c] = 0.f;
    if (s < B) {
      const int* o = off + (i64)t * (B + 1) + s;
      const int lo = max(o[0], 0), hi = min(o[1], nnz);
      const int* ip = idx + (i64)t * nnz;
      const elem_t* tb = tables + (i64)t * rows * dim + d;
#pragma unroll 4
      for (int j = lo; j < hi; ++j) {
        const int r = __ldg(ip + j);
        if ((unsigned)r < (unsigned)rows) {
          const CmpVec<V> e = cmp_load<V>(tb + (i64)r * dim);
#pragma unroll
          for (int c = 0; c < V; ++c) acc[c] += cmp_f32(e.e[c]);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < V; ++c)
      if (u * V + c < n) dst[u * V + c] = from_acc(acc[c]);
  }
}

__device__ void ebag_tile(const elem_t* tables, const int* idx, const int* off, int T, int rows, int dim, int nnz,
                          int B, i64 s0, elem_t* dst, i64 lane0, int n) {
  if (n <= 0 || dim <= 0) return;
  // A vector never straddles two bags: dim and the tile's first lane are multiples of V.
  if (dim % GC3_CMP_VEC == 0 && lane0 % GC3_CMP_VEC == 0 && ((u64)tables & 15) == 0)
    ebag_lanes<GC3_CMP_VEC>(tables, idx, off, T, rows, dim, nnz, B, s0, dst, lane0, n);
  else
    ebag_lanes<1>(tables, idx, off, T, rows, dim, nnz, B, s0, dst, lane0, n);
}

#endif
