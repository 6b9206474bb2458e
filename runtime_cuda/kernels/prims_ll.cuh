// LL (low-latency) protocol data path: a slot is an array of 16-byte lines
// {data.lo, flag, data.hi, flag}, written with one 16-byte store, so the
// receiver needs no separate signal: a line is there when both its flags
// equal the slot's sequence number (the connection's running send count + 1,
// unique per slot use, so nothing is ever cleared).
#pragma once
#include "prims_simple.cuh"
#include "sync.cuh"

// Polls one line until it carries `flag`.  False on timeout or abort.
__device__ __forceinline__ bool ll_read(const Plan& P, const Where& w, int peer, int chan,
                                        const uint4* line, unsigned flag, uint2& out) {
  uint4 v = ld_volatile_v4(line);
  if (v.y != flag || v.w != flag) {
    const u64 t0 = global_ns();
    for (unsigned spins = 1;; ++spins) {
      v = ld_volatile_v4(line);
      if (v.y == flag && v.w == flag) break;
      if ((spins & 63) == 0) {
        if (aborted(P)) return false;
        if (global_ns() - t0 > P.timeout_ns) {
          record_failure(P, w, GC3_WAIT_LL, peer, chan, ((u64)v.w << 32) | v.y, flag);
          return false;
        }
      }
    }
  }
  out = make_uint2(v.x, v.z);
  return true;
}

// One chunk-tile of n lanes: acc = received (if any) op sources (if any);
// then to the send lines (if any) and the local sink (if nd), through `epi`
// (if on) for the sink only.  Returns false if this thread gave up waiting.
__device__ __forceinline__ bool reduce_copy_ll(const Plan& P, const Where& w, int peer, int chan, int n,
                                               const uint4* rlines, unsigned rflag, const Sources& s,
                                               uint4* slines, unsigned sflag, const Operand& d, int nd,
                                               const Epi& epi) {
  constexpr int N = Pack<8>::N;
  const int ngran = (n + N - 1) / N;
  for (int g = threadIdx.x; g < ngran; g += blockDim.x) {
    Pack<8> acc;
    if (rlines) {
      if (!ll_read(P, w, peer, chan, rlines + g, rflag, acc.raw)) return false;
      if (s.n > 0) {
        Pack<8> x;
        load_reduce<8>(x, s, g * N);
        reduce_into<8>(acc, x);
      }
    } else {
      load_reduce<8>(acc, s, g * N);
    }
    if (slines) st_volatile_v4(slines + g, make_uint4(acc.raw.x, sflag, acc.raw.y, sflag));
    if (nd) store_gran_epi<8>(d, g * N, acc, epi);
  }
  return true;
}
