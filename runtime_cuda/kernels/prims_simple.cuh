// Simple protocol data path: sources and sinks are plain memory (user
// buffers, scratch, FIFO slots).  The slot is published separately, by
// thread 0 advancing the connection's tail after a block-wide barrier.
#pragma once
#include "reduce_ops.cuh"
#include "epilogue.cuh"

#ifndef GC3_MAX_FANIN
#define GC3_MAX_FANIN 8
#endif

// `valid` lanes from p on are real data; lanes past them read as zero and
// are never written (gc3.ir.layout's rule for short chunks).
struct Operand {
  elem_t* p;
  int valid;
  bool al;   // p is aligned for the granule size in use
};

template <int B>
__device__ __forceinline__ Operand make_operand(elem_t* p, long long valid, int n) {
  Operand o;
  o.p = p;
  o.valid = (int)(valid < 0 ? 0 : (valid > n ? n : valid));
  o.al = ((u64)p & (B - 1)) == 0;
  return o;
}

template <int B>
__device__ __forceinline__ Pack<B> load_gran(const Operand& o, int l) {
  Pack<B> r;
  if (o.al && l + Pack<B>::N <= o.valid) {
    r.raw = *reinterpret_cast<const typename RawOf<B>::type*>(o.p + l);
  } else {
#pragma unroll
    for (int k = 0; k < Pack<B>::N; ++k) r.e[k] = (l + k < o.valid) ? o.p[l + k] : (elem_t)0;
  }
  return r;
}

template <int B>
__device__ __forceinline__ void store_gran(const Operand& o, int l, const Pack<B>& v) {
  if (o.al && l + Pack<B>::N <= o.valid) {
    *reinterpret_cast<typename RawOf<B>::type*>(o.p + l) = v.raw;
  } else {
#pragma unroll
    for (int k = 0; k < Pack<B>::N; ++k)
      if (l + k < o.valid) o.p[l + k] = v.e[k];
  }
}

// store_gran of v through the call's epilogue (when `epi.on`: a step's
// store into its dst; what it sends stays raw), lane by lane in registers, the
// lanes past `valid` untouched (they are not stored, and their output index
// may be past the residual's end).
template <int B>
__device__ __forceinline__ void store_gran_epi(const Operand& o, int l, Pack<B> v, const Epi& epi) {
  if (epi.on) {
    const i64 e0 = epi.at + l;
    int col = epi.bias ? (int)(e0 % epi.cols) : 0;
#pragma unroll
    for (int k = 0; k < Pack<B>::N; ++k) {
      if (l + k < o.valid) v.e[k] = epi_apply(epi, v.e[k], e0 + k, col);
      col = col + 1 == epi.cols ? 0 : col + 1;
    }
  }
  store_gran<B>(o, l, v);
}

// Sources of one chunk-tile: up to two named operands (kept in registers)
// plus, for a fused `re`, up to GC3_MAX_FANIN-1 more in shared memory.
struct Sources {
  Operand a, b;
  int n;                  // 1 or 2 named operands
  const Operand* extra;   // shared memory
  int nextra;
};

template <int B>
__device__ __forceinline__ void load_reduce(Pack<B>& acc, const Sources& s, int l) {
  acc = load_gran<B>(s.a, l);
  if (s.n > 1) reduce_into<B>(acc, load_gran<B>(s.b, l));
  for (int e = 0; e < s.nextra; ++e) reduce_into<B>(acc, load_gran<B>(s.extra[e], l));
}

// d0 (and d1 if nd == 2)[0:n] = a op b op extras..., n lanes; `epi` (if on)
// applies to d0 only.  Each thread keeps U granules in flight per source to
// hide memory latency.
template <int B, int U>
__device__ __forceinline__ void reduce_copy(int n, const Sources& s, const Operand& d0, const Operand& d1, int nd,
                                            const Epi& epi) {
  constexpr int N = Pack<B>::N;
  const int ngran = (n + N - 1) / N;
  const int nt = blockDim.x;
  for (int g0 = threadIdx.x; g0 < ngran; g0 += nt * U) {
    Pack<B> acc[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (g0 + u * nt < ngran) acc[u] = load_gran<B>(s.a, (g0 + u * nt) * N);
    if (s.n > 1) {
      Pack<B> x[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (g0 + u * nt < ngran) x[u] = load_gran<B>(s.b, (g0 + u * nt) * N);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (g0 + u * nt < ngran) reduce_into<B>(acc[u], x[u]);
    }
    for (int e = 0; e < s.nextra; ++e) {
      const Operand o = s.extra[e];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (g0 + u * nt < ngran) reduce_into<B>(acc[u], load_gran<B>(o, (g0 + u * nt) * N));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (g0 + u * nt < ngran) {
        if (nd > 1) store_gran<B>(d1, (g0 + u * nt) * N, acc[u]);
        store_gran_epi<B>(d0, (g0 + u * nt) * N, acc[u], epi);
      }
    }
  }
}
