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

// A reader that takes one line from each of several peers polls LL_AHEAD of
// them at once (ll_read_ahead): their latencies then overlap, where one ll_read
// after another would add them up.
constexpr int LL_AHEAD = 4;

// line(p) for p in [p0, p0 + LL_AHEAD) below n, where line(p) is not null (a
// part the caller has elsewhere), polled together until each carries `flag`,
// into v[p - p0] (the data in .x and .z).  False on timeout or abort; the record
// names the first peer still missing.
template <class Line>
__device__ __forceinline__ bool ll_read_ahead(const Plan& P, const Where& w, int chan, uint4 (&v)[LL_AHEAD], int p0,
                                              int n, Line line, unsigned flag) {
  bool want[LL_AHEAD];
#pragma unroll
  for (int i = 0; i < LL_AHEAD; ++i) {
    want[i] = p0 + i < n && line(p0 + i) != nullptr;
    if (want[i]) v[i] = ld_volatile_v4(line(p0 + i));
  }
  u64 t0 = 0;
  for (unsigned spins = 0;; ++spins) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < LL_AHEAD; ++i) {
      if (want[i] && v[i].y == flag && v[i].w == flag) want[i] = false;
      all = all && !want[i];
    }
    if (all) return true;
    if (spins == 0) {
      t0 = global_ns();
    } else if ((spins & 63) == 0) {
      if (aborted(P)) return false;
      if (global_ns() - t0 > P.timeout_ns) {
        // The first missing line, found with constant indices only: an index into v known
        // only at run time would put all of v in local memory.
        int who = -1;
        uint4 m = v[0];
#pragma unroll
        for (int i = LL_AHEAD - 1; i >= 0; --i)
          if (want[i]) who = p0 + i, m = v[i];
        record_failure(P, w, GC3_WAIT_LL, who, chan, ((u64)m.w << 32) | m.y, flag);
        return false;
      }
    }
#pragma unroll
    for (int i = 0; i < LL_AHEAD; ++i)
      if (want[i]) v[i] = ld_volatile_v4(line(p0 + i));
  }
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
