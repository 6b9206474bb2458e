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
// Weight bytes one thread of a CUDA-core gemv pass loads before it uses any: the loads are issued
// together, so an SM has threads x this in flight (64 KiB at 512 threads), about what covers the
// memory latency at an SM's share of HBM bandwidth; the compiler's unrolling alone does not keep
// them independent.  Tunable (runtime_cuda/module.py GEMV_TUNABLES).
#ifndef GC3_CMP_INFLIGHT
#define GC3_CMP_INFLIGHT 128
#endif

__device__ __forceinline__ float cmp_f32(elem_t v) { return (float)to_acc(v); }

template <int V>
struct CmpVec {
  elem_t e[V];
};

// 16 bytes of a weight on their way through: not kept in L1, and L2 asked for the whole
// 256-byte sector pair around them, which the next loads of the block use.  A read-only load:
// for a weight nothing in the kernel writes, read after grid_dependency_wait (a prefetch into
// L2 may come before it, which is coherent).
__device__ __forceinline__ uint4 stream_load(const elem_t* p) {
  uint4 u;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}

// The V elements of a 16-byte vector: the loads stay four 32-bit words in flight (an element
// array would hold 16-bit types one a register, twice the registers) until their use.
union Vec16 {
  uint4 u;
  elem_t e[GC3_CMP_VEC];
};

// V consecutive elements; one 16- or 8-byte load when V fills that many bytes
// (the caller guarantees the alignment), else element by element.
template <int V>
__device__ __forceinline__ CmpVec<V> cmp_load(const elem_t* p) {
  CmpVec<V> r;
  if constexpr (V * sizeof(elem_t) == 16) {
    Vec16 t;
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

// The end of a gemv pass: `sacc` [nb][width] holds y's rows [b0, b0 + nb) x
// absolute columns [c0, c0 + width) once every thread has added its part; the
// lanes of this tile among them are stored: dst[l] is chunk lane lane0 + l,
// chunk column 0 being y's column `colbase`, pc columns per chunk row.
__device__ __forceinline__ void gemv_store(const float* sacc, int b0, int nb, i64 c0, int width, i64 colbase, int pc,
                                           elem_t* dst, i64 lane0, int n) {
  __syncthreads();
  for (int i = threadIdx.x; i < nb * width; i += blockDim.x) {
    const int r = i / width;
    const i64 col = c0 + (i - r * width) - colbase;   // column within the chunk
    const i64 l = (i64)(b0 + r) * pc + col - lane0;
    if (col >= 0 && col < pc && l >= 0 && l < n) dst[l] = from_acc(sacc[i]);
  }
  __syncthreads();   // sacc is zeroed again by the next pass
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
  // Weight vectors a thread loads at once: GC3_CMP_INFLIGHT bytes for batch 1, at most 128 bytes
  // where RB rows of accumulators share the registers (more spills), at most 16 loads.
  constexpr int BYTES = RB == 1 || GC3_CMP_INFLIGHT < 128 ? GC3_CMP_INFLIGHT : 128;
  constexpr int U = BYTES / (V * (int)sizeof(elem_t)) < 16 ? BYTES / (V * (int)sizeof(elem_t)) : 16;
  static_assert(U >= 1, "GC3_CMP_INFLIGHT must hold one weight vector");
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
    for (int k0 = kg; k0 < K; k0 += ks * U) {
      CmpVec<V> wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (k0 + ks * u < K) wv[u] = cmp_load<V>(wp);
        wp += wstep;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + ks * u;
        if (k >= K) break;
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          const float xv = r < nb ? cmp_f32(xp[(i64)r * K + k]) : 0.f;
#pragma unroll
          for (int c = 0; c < V; ++c) acc[r][c] = fmaf(xv, cmp_f32(wv[u].e[c]), acc[r][c]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RB; ++r)
      if (r < nb)
#pragma unroll
        for (int c = 0; c < V; ++c) atomicAdd(&sacc[r * width + v * V + c], acc[r][c]);
  }
  gemv_store(sacc, b0, nb, c0, width, colbase, pc, dst, lane0, n);
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

#if __CUDA_ARCH__ >= 800 && GC3_DTYPE != GC3_DT_FLOAT32
// Batch > 1 of the 16-bit types on tensor cores: the CUDA cores' fp32 FMAs
// alone would be the limit from about 12 batch rows (one FMA per weight
// element and row), long before the weight's bandwidth is.  Weight-stationary:
// each weight element is loaded once per pass of up to 8*NT batch rows and fed
// to NT mma.m16n8k16 (fp32 accumulation) against x, whose fragments are small
// loads that L1 serves.  The mma computes D = A B with A = w^T (16 columns x
// 16 k) and B = x^T (16 k x 8 batch rows).  The columns of an A tile need not
// be consecutive, which lets every thread load 2*MT consecutive columns of w
// in one 4*MT-byte load per k row (coalesced along w's contiguous N axis):
// m-tile q of a warp gives A row g (g = lane / 4) to column 2q and row g + 8
// to column 2q + 1 of the thread's columns, so one byte permute per register
// pairs the two k rows an A register holds.
#define GC3_CMP_MMA 1
#if GC3_DTYPE == GC3_DT_BFLOAT16
#define GC3_CMP_MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#else
#define GC3_CMP_MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#endif
// Weight bytes one thread loads before it uses them (k steps of 16, each 4 rows
// of 4*MT bytes): as GC3_CMP_INFLIGHT for the CUDA-core passes.  Tunable.
#ifndef GC3_CMP_MMA_INFLIGHT
#define GC3_CMP_MMA_INFLIGHT 128
#endif
// 1: passes of 32 rows in warp tiles of 64 columns (4 m-tiles x 4 n-tiles) rather than 32 (2 x 4),
// which halves the x fragments loaded per weight byte, at 64 bytes in flight per thread (the 64
// accumulators leave no registers for more).  Tunable.
#ifndef GC3_CMP_MMA_WIDE
#define GC3_CMP_MMA_WIDE 0
#endif

__device__ __forceinline__ void cmp_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(GC3_CMP_MMA_OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned cmp_pack(elem_t lo, elem_t hi) { return (unsigned)lo | ((unsigned)hi << 16); }

// Columns [c, c + 2*MT) of w's row k as MT words of two elements, 0 past w's
// end.  VEC: one load (the caller guarantees alignment and that the columns
// are all inside or all outside w).  STREAM: 16-byte loads as stream_load's.
template <int MT, bool VEC, bool STREAM = false>
__device__ __forceinline__ void mma_wload(unsigned (&r)[MT], const elem_t* w, int K, int N, int k, i64 c) {
  if constexpr (VEC) {
    if (k < K && c < N) {
      const elem_t* p = w + (i64)k * N + c;
      if constexpr (MT == 4) {
        const uint4 u = STREAM ? stream_load(p) : __ldg(reinterpret_cast<const uint4*>(p));
        r[0] = u.x; r[1] = u.y; r[2] = u.z; r[3] = u.w;
      } else if constexpr (MT == 2) {
        const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
        r[0] = u.x; r[1] = u.y;
      } else {
        r[0] = __ldg(reinterpret_cast<const unsigned*>(p));
      }
      return;
    }
#pragma unroll
    for (int q = 0; q < MT; ++q) r[q] = 0u;
  } else {
    const elem_t* p = w + (i64)k * N;
#pragma unroll
    for (int q = 0; q < MT; ++q) {
      const elem_t lo = k < K && c + 2 * q < N ? p[c + 2 * q] : (elem_t)0;
      const elem_t hi = k < K && c + 2 * q + 1 < N ? p[c + 2 * q + 1] : (elem_t)0;
      r[q] = cmp_pack(lo, hi);
    }
  }
}

// The weight words of one k step of 16 for A registers 0..3: rows k, k + 1, k + 8, k + 9
// (k = the step's first row + 2t), columns [c, c + 2*MT) of each.
template <int MT, bool VEC, bool STREAM = false>
__device__ __forceinline__ void mma_wstep(unsigned (&r)[4][MT], const elem_t* w, int K, int N, int k, i64 c) {
  mma_wload<MT, VEC, STREAM>(r[0], w, K, N, k, c);
  mma_wload<MT, VEC, STREAM>(r[1], w, K, N, k + 1, c);
  mma_wload<MT, VEC, STREAM>(r[2], w, K, N, k + 8, c);
  mma_wload<MT, VEC, STREAM>(r[3], w, K, N, k + 9, c);
}

// A's registers of m-tile q from a step's words: one byte permute pairs the two k rows a
// register holds.
template <int MT>
__device__ __forceinline__ void mma_afrag(unsigned (&a)[4], const unsigned (&r)[4][MT], int q) {
  a[0] = __byte_perm(r[0][q], r[1][q], 0x5410);
  a[1] = __byte_perm(r[0][q], r[1][q], 0x7632);
  a[2] = __byte_perm(r[2][q], r[3][q], 0x5410);
  a[3] = __byte_perm(r[2][q], r[3][q], 0x7632);
}

// x[row][k], x[row][k + 1] as one word, 0 outside x.  VEC: K even and x
// 4-byte aligned (k is even), so the pair is one load.
template <bool VEC>
__device__ __forceinline__ unsigned mma_xload(int K, bool row_ok, const elem_t* xr, int k) {
  if constexpr (VEC) {
    return row_ok && k < K ? __ldg(reinterpret_cast<const unsigned*>(xr + k)) : 0u;
  } else {
    const elem_t lo = row_ok && k < K ? xr[k] : (elem_t)0;
    const elem_t hi = row_ok && k + 1 < K ? xr[k + 1] : (elem_t)0;
    return cmp_pack(lo, hi);
  }
}

// One pass: rows [b0, b0 + nb) (nb <= 8*NT) x absolute columns [c0, c0 + nt*16*MT)
// (c0 a multiple of 2*MT).  Warps are nt column tiles of 16*MT columns x ks
// slices of K (in steps of 16); the slices meet in `sacc` as in gemv_pass.
template <int MT, int NT, bool VEC, int INFLIGHT>
__device__ void gemv_pass_mma(const elem_t* __restrict__ x, const elem_t* __restrict__ w, int K, int N, int b0,
                              int nb, i64 c0, int nt, i64 colbase, int pc, elem_t* dst, i64 lane0, int n,
                              float* sacc) {
  constexpr int WT = 16 * MT, U = INFLIGHT / (16 * MT);
  static_assert(U >= 1, "INFLIGHT must hold one k step of 16 (16*MT bytes)");
  const int width = nt * WT;
  for (int i = threadIdx.x; i < nb * width; i += blockDim.x) sacc[i] = 0.f;
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int nwarps = blockDim.x >> 5;
  const int ks = max(1, nwarps / nt);
  for (int item = threadIdx.x >> 5; item < nt * ks; item += nwarps) {
    const int ct = item % nt, kg = item / nt;
    const i64 c = c0 + (i64)ct * WT + 2 * MT * g;   // this thread's first column
    float d[MT][NT][4];
#pragma unroll
    for (int q = 0; q < MT; ++q)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[q][j][e] = 0.f;
    const elem_t* xr[NT];
    bool xok[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      xok[j] = 8 * j + g < nb;
      xr[j] = x + (i64)(b0 + (xok[j] ? 8 * j + g : 0)) * K;
    }
    for (int k0 = 16 * kg; k0 < K; k0 += 16 * ks * U) {
      unsigned wv[U][4][MT];
#pragma unroll
      for (int u = 0; u < U; ++u) mma_wstep<MT, VEC>(wv[u], w, K, N, k0 + 16 * ks * u + 2 * t, c);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + 16 * ks * u + 2 * t;
        if (k0 + 16 * ks * u >= K) break;   // uniform across the warp
        unsigned b[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          b[j][0] = mma_xload<VEC>(K, xok[j], xr[j], k);
          b[j][1] = mma_xload<VEC>(K, xok[j], xr[j], k + 8);
        }
#pragma unroll
        for (int q = 0; q < MT; ++q) {
          unsigned a[4];
          mma_afrag<MT>(a, wv[u], q);
#pragma unroll
          for (int j = 0; j < NT; ++j) cmp_mma(d[q][j], a, b[j]);
        }
      }
    }
    // D row g of m-tile q is column 2q, row g + 8 column 2q + 1; D column 2t (+1) is batch row 8j + 2t (+1).
    const int col = ct * WT + 2 * MT * g;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = 8 * j + 2 * t;
#pragma unroll
      for (int q = 0; q < MT; ++q) {
        if (r < nb) {
          atomicAdd(&sacc[r * width + col + 2 * q], d[q][j][0]);
          atomicAdd(&sacc[r * width + col + 2 * q + 1], d[q][j][2]);
        }
        if (r + 1 < nb) {
          atomicAdd(&sacc[(r + 1) * width + col + 2 * q], d[q][j][1]);
          atomicAdd(&sacc[(r + 1) * width + col + 2 * q + 1], d[q][j][3]);
        }
      }
    }
  }
  gemv_store(sacc, b0, nb, c0, width, colbase, pc, dst, lane0, n);
}

// Rows [r_lo, r_lo + nr) x absolute columns [lo, hi) in passes of up to 8*NT
// rows and as many column tiles as `sacc` holds for them, INFLIGHT weight bytes per thread at once.
template <int MT, int NT, bool VEC, int INFLIGHT = GC3_CMP_MMA_INFLIGHT>
__device__ void gemv_rows_mma(const elem_t* x, const elem_t* w, int K, int N, int r_lo, int nr, i64 lo, i64 hi,
                              i64 colbase, int pc, elem_t* dst, i64 lane0, int n, float* sacc) {
  constexpr int WT = 16 * MT, RB = 8 * NT;
  constexpr int PT = GC3_CMP_SMEM / (RB * WT);   // column tiles per pass
  static_assert(PT >= 1, "a pass must hold one column tile");
  const i64 c0 = lo - lo % (2 * MT), c1 = min(hi, (i64)N);
  for (int b0 = r_lo; b0 < r_lo + nr; b0 += RB) {
    const int nb = min(RB, r_lo + nr - b0);
    for (i64 t0 = c0; t0 < c1; t0 += (i64)PT * WT)
      gemv_pass_mma<MT, NT, VEC, INFLIGHT>(x, w, K, N, b0, nb, t0, (int)min((i64)PT, (c1 - t0 + WT - 1) / WT),
                                           colbase, pc, dst, lane0, n, sacc);
  }
}

// Up to 8 rows: 4 m-tiles per warp (16-byte weight loads) x 1 n-tile; up to 16: 2 m-tiles x 2
// n-tiles; more: passes of 32 rows, 2 (GC3_CMP_MMA_WIDE: 4) m-tiles x 4 n-tiles, at most 128 (64)
// bytes in flight.  A thread's accumulators (MT*NT*4) and loads in flight then stay within the 128
// registers one block per SM allows.
template <bool VEC>
__device__ void gemv_mma(const elem_t* x, const elem_t* w, int K, int N, int r_lo, int nr, i64 lo, i64 hi,
                         i64 colbase, int pc, elem_t* dst, i64 lane0, int n, float* sacc) {
  if (nr <= 8)
    gemv_rows_mma<4, 1, VEC>(x, w, K, N, r_lo, nr, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else if (nr <= 16)
    gemv_rows_mma<2, 2, VEC>(x, w, K, N, r_lo, nr, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else
#if GC3_CMP_MMA_WIDE
    gemv_rows_mma<4, 4, VEC, 64>(x, w, K, N, r_lo, nr, lo, hi, colbase, pc, dst, lane0, n, sacc);
#else
    gemv_rows_mma<2, 4, VEC, GC3_CMP_MMA_INFLIGHT < 128 ? GC3_CMP_MMA_INFLIGHT : 128>(x, w, K, N, r_lo, nr, lo, hi,
                                                                                    colbase, pc, dst, lane0, n, sacc);
#endif
}
#endif

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
#ifdef GC3_CMP_MMA
  if (r_hi > r_lo) {
    // The mma path's widest weight load is 16 bytes at a multiple of 8 columns: all of it inside w
    // or all outside when N is a multiple of 8.
    if (N % 8 == 0 && ((u64)w & 15) == 0 && K % 2 == 0 && ((u64)x & 3) == 0)
      gemv_mma<true>(x, w, K, N, r_lo, r_hi - r_lo + 1, lo, hi, colbase, pc, dst, lane0, n, sacc);
    else
      gemv_mma<false>(x, w, K, N, r_lo, r_hi - r_lo + 1, lo, hi, colbase, pc, dst, lane0, n, sacc);
    return;
  }
#endif
  if (sizeof(elem_t) == 2 && r_hi - r_lo + 1 > GC3_CMP_ACC / GC3_CMP_VEC && N % V8 == 0 && ((u64)w & 7) == 0)
    gemv_cols<V8>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else if (N % GC3_CMP_VEC == 0 && ((u64)w & 15) == 0)
    gemv_cols<GC3_CMP_VEC>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
  else
    gemv_cols<1>(x, w, K, N, r_lo, r_hi, lo, hi, colbase, pc, dst, lane0, n, sacc);
}

// Where a launch records the first bad index or bag bound it met (`bad`, host
// memory the device reaches by the same address, [set, rank, table, position,
// value]; position is a bag's number and value -1 for bad bounds): `claim`, a
// device word, decides which thread writes it.  The host raises the record.
struct EbagBad {
  int* bad;
  int* claim;
  int rank;
};

__device__ __noinline__ void ebag_record(const EbagBad& e, int t, int pos, int value) {
  if (atomicCAS(e.claim, 0, 1) != 0) return;
  volatile int* r = e.bad;
  r[1] = e.rank;
  r[2] = t;
  r[3] = pos;
  r[4] = value;
  __threadfence_system();
  r[0] = 1;
}

// Lanes [lane0, lane0 + n) of an ebag chunk whose first sample is s0 of the
// global batch: rows of T*dim, table t's pooled vector at t*dim (sum pooling
// over the CSR bag offsets[t, s] .. offsets[t, s + 1] of indices[t], in index
// order with fp32 accumulation, as torch's embedding_bag).  One thread per V
// consecutive lanes of one bag, so the threads of a bag read a table row with
// contiguous loads and store 16 bytes at once where dst allows.  An index
// outside [0, rows) adds nothing and offsets are clamped to [0, nnz]: bad input
// never reads out of bounds, and where `e.bad` is given it is recorded.
template <int V>
__device__ void ebag_lanes(const elem_t* tables, const int* idx, const int* off, int T, int rows, int dim, int nnz,
                           int B, i64 s0, elem_t* dst, i64 lane0, int n, const EbagBad& e) {
  const int row = T * dim;
  const bool vst = V * sizeof(elem_t) == 16 && ((u64)dst & 15) == 0;
  for (int u = threadIdx.x; u * V < n; u += blockDim.x) {
    const i64 l = lane0 + (i64)u * V;
    const i64 s = s0 + l / row;
    const int rem = (int)(l % row), t = rem / dim, d = rem - t * dim;
    float acc[V];
#pragma unroll
    for (int c = 0; c < V; ++c) acc[c] = 0.f;
    if (s < B) {
      const int* o = off + (i64)t * (B + 1) + s;
      int lo = o[0], hi = o[1];
      if (e.bad && d == 0 && (lo < 0 || hi < lo || hi > nnz)) ebag_record(e, t, (int)s, -1);
      lo = max(lo, 0);
      hi = min(hi, nnz);
      const int* ip = idx + (i64)t * nnz;
      const elem_t* tb = tables + (i64)t * rows * dim + d;
#pragma unroll 4
      for (int j = lo; j < hi; ++j) {
        const int r = __ldg(ip + j);
        if ((unsigned)r < (unsigned)rows) {
          const CmpVec<V> v = cmp_load<V>(tb + (i64)r * dim);
#pragma unroll
          for (int c = 0; c < V; ++c) acc[c] += cmp_f32(v.e[c]);
        } else if (e.bad && d == 0) {
          ebag_record(e, t, j, r);
        }
      }
    }
    if (vst && u * V + V <= n) {
      union {
        uint4 u;
        elem_t e[V];
      } w;
#pragma unroll
      for (int c = 0; c < V; ++c) w.e[c] = from_acc(acc[c]);
      *reinterpret_cast<uint4*>(dst + u * V) = w.u;
    } else {
#pragma unroll
      for (int c = 0; c < V; ++c)
        if (u * V + c < n) dst[u * V + c] = from_acc(acc[c]);
    }
  }
}

__device__ void ebag_tile(const elem_t* tables, const int* idx, const int* off, int T, int rows, int dim, int nnz,
                          int B, i64 s0, elem_t* dst, i64 lane0, int n, const EbagBad& e = EbagBad{nullptr, nullptr, 0}) {
  if (n <= 0 || dim <= 0) return;
  // A vector never straddles two bags: dim and the tile's first lane are multiples of V.
  if (dim % GC3_CMP_VEC == 0 && lane0 % GC3_CMP_VEC == 0 && ((u64)tables & 15) == 0)
    ebag_lanes<GC3_CMP_VEC>(tables, idx, off, T, rows, dim, nnz, B, s0, dst, lane0, n, e);
  else
    ebag_lanes<1>(tables, idx, off, T, rows, dim, nnz, B, s0, dst, lane0, n, e);
}

#endif
