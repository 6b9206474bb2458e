// LL128 protocol data path.  A slot is an array of 128-byte lines of 16
// 8-byte words: words 0..14 carry data, word 15 the slot's flag -- the
// connection's running send count + 1, all 64 bits, unique per slot use, so
// nothing is ever cleared and any payload bits (-0.0, NaN) pass unchanged.
//
// Eight consecutive threads of a warp own one line, 16 bytes each; the
// eighth ("flag thread") holds data word 14 and the flag.  The group stores
// the line with one warp-wide 16-byte store instruction, which the memory
// system moves as one 128-byte transaction (also over NVLink on sm_80 and
// later, the property NCCL's LL128 relies on; not true over PCIe), so a
// reader whose flag thread sees the flag has the whole line.
//
// Chunk-tiles are whole lines: the host tiles in multiples of 240 bytes
// (gc3.limits.tile_granule_bytes), so a tile of T lanes is T*size/120 lines.
#pragma once
#include "prims_simple.cuh"
#include "sync.cuh"

// gc3.limits.LL128_LINE_BYTES / LL128_LINE_DATA_BYTES (module.py passes them;
// the defaults serve standalone syntax checks).  The thread mapping below is
// built for exactly these values.
#ifndef GC3_LL128_LINE_BYTES
#define GC3_LL128_LINE_BYTES 128
#endif
#ifndef GC3_LL128_LINE_DATA_BYTES
#define GC3_LL128_LINE_DATA_BYTES 120
#endif
static_assert(GC3_LL128_LINE_BYTES == 128 && GC3_LL128_LINE_DATA_BYTES == 120,
              "prims_ll128.cuh maps 8 threads x 16 bytes onto a line of 15 data words + 1 flag word");
#define GC3_LL128_LINE_WORDS 16
#define GC3_LL128_DATA_WORDS 15

__device__ __forceinline__ void ld_volatile_v2u64(const u64* p, u64& a, u64& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ void st_volatile_v2u64(u64* p, u64 a, u64 b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" :: "l"(p), "l"(a), "l"(b) : "memory");
}

// This thread's 16 bytes of a line, once the group's flag thread sees `flag`
// (every thread of the group reloads while any flag is missing, so the data
// words come from a load that saw the line whole).  `gmask`: the 8 lanes of
// the group, which are converged here and decide together.  False on timeout
// or abort (uniform across the group).
__device__ __forceinline__ bool ll128_read(const Plan& P, const Where& w, int peer, int chan, const u64* p,
                                           u64 flag, bool flag_thread, unsigned gmask, u64& a, u64& b) {
  ld_volatile_v2u64(p, a, b);
  if (__any_sync(gmask, flag_thread && b != flag)) {
    const u64 t0 = global_ns();
    for (unsigned spins = 1;; ++spins) {
      ld_volatile_v2u64(p, a, b);
      if (!__any_sync(gmask, flag_thread && b != flag)) break;
      if ((spins & 63) == 0) {
        int stop = 0;
        if (flag_thread) {
          if (aborted(P)) {
            stop = 1;
          } else if (global_ns() - t0 > P.timeout_ns) {
            record_failure(P, w, GC3_WAIT_LL, peer, chan, b, flag);
            stop = 1;
          }
        }
        if (__any_sync(gmask, stop)) return false;
      }
    }
  }
  // Read again after the flag was seen, as NCCL does: the polling load may
  // have been served in pieces fetched at different times; this one is
  // ordered after the flag's arrival (same address, same thread) and the
  // sender cannot reuse the slot before this block returns its credit.
  ld_volatile_v2u64(p, a, b);
  return true;
}

__device__ __forceinline__ Pack<8> pack_of(u64 x) {
  Pack<8> r;
  r.raw = make_uint2((unsigned)x, (unsigned)(x >> 32));
  return r;
}
__device__ __forceinline__ u64 word_of(const Pack<8>& v) { return ((u64)v.raw.y << 32) | v.raw.x; }

// One chunk-tile of n lanes, as reduce_copy_ll: acc = received line words (if
// any) op sources (if any); then to the send lines (if any) and the local
// sink (if nd), through `epi` (if on) for the sink only.  Returns false if
// this thread's group gave up waiting.
__device__ __forceinline__ bool reduce_copy_ll128(const Plan& P, const Where& w, int peer, int chan, int n,
                                                  const u64* rlines, u64 rflag, const Sources& s,
                                                  u64* slines, u64 sflag, const Operand& d, int nd,
                                                  const Epi& epi) {
  constexpr int N = Pack<8>::N;   // elements per 8-byte word
  const int nwords = (n + N - 1) / N;
  const int nlines = (nwords + GC3_LL128_DATA_WORDS - 1) / GC3_LL128_DATA_WORDS;
  const int j = threadIdx.x & 7;              // this thread's 16 bytes within the line
  const bool flag_thread = j == 7;
  const unsigned gmask = 0xffu << (threadIdx.x & 24);
  const int ngroups = blockDim.x >> 3;
  for (int line = threadIdx.x >> 3; line < nlines; line += ngroups) {
    const int w0 = line * GC3_LL128_DATA_WORDS + 2 * j;   // data word index of this thread's first word
    const int nmine = flag_thread ? 1 : 2;                // the flag thread's second word is the flag
    const i64 at = (i64)line * GC3_LL128_LINE_WORDS + 2 * j;
    Pack<8> v[2];
    if (rlines) {
      u64 a, b;
      if (!ll128_read(P, w, peer, chan, rlines + at, rflag, flag_thread, gmask, a, b)) return false;
      v[0] = pack_of(a);
      v[1] = pack_of(b);
      if (s.n > 0) {
        for (int u = 0; u < nmine; ++u) {
          Pack<8> x;
          load_reduce<8>(x, s, (w0 + u) * N);
          reduce_into<8>(v[u], x);
        }
      }
    } else {
      v[1] = pack_of(0);
      for (int u = 0; u < nmine; ++u) load_reduce<8>(v[u], s, (w0 + u) * N);
    }
    if (slines) {
      // The group's 8 stores must issue as one instruction (one transaction).
      __syncwarp(gmask);
      st_volatile_v2u64(slines + at, word_of(v[0]), flag_thread ? sflag : word_of(v[1]));
    }
    if (nd)
      for (int u = 0; u < nmine; ++u) store_gran_epi<8>(d, (w0 + u) * N, v[u], epi);
  }
  return true;
}
