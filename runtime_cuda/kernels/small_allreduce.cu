// One-shot and two-shot allreduce for small messages on epoch-tagged LL lines,
// and the one-shot allgather and reducescatter on the same lines and scratch
// (runtime_cuda/small_allreduce.py is the host side).
//
// Every rank's scratch (one allocation, mapped by its peers once) holds a
// header (common.cuh, GC3_SA_*) and two parity regions of 16-byte lines
// {data.lo, flag, data.hi, flag}, written with one 16-byte store each as in
// prims_ll.cuh.  A reader waits until both flags of a line equal the call's
// flag: the data travels with its own ready signal, so nothing is cleared and
// no value is reserved (-0.0 and every NaN payload pass through unchanged).
//
// Which call this is comes from the device, never from the arguments: block b
// of every rank keeps its own count of the calls it has run (header word
// GC3_SA_COUNTERS + b, read at entry, stored +1 at exit by that block alone),
// so a launch captured in a CUDA graph advances the count on every replay.
// Every rank launches the same grid for every call, so block b's count is the
// same on every rank and every block of one call derives the same k.
// Per-block counters need no agreement between blocks (a single counter bumped
// by block 0 could be bumped before another block of the same launch has read it).
// A call launches as many blocks as its size needs (one line per thread), at
// most grid_max; block 0 also stores k into the counters of the blocks this
// launch left out, which no block of this launch reads, so all grid_max counters
// hold the same count between calls and a larger grid next time agrees on k.
//
// Call k uses parity region k & 1 with flag 1 + k mod (2^32 - 1): never 0 (the
// zeroed scratch), and different from the flag of call k - 2, the last one
// that wrote that region (2^32 - 1 is odd, so k and k - 2 never share it; an
// equal flag needs 2^32 - 1 calls with no write to one line in between).
//
// Why a rank can never write region k & 1 while a peer still reads it for
// call k - 2: rank r starts call k only after its call k - 1 finished (stream
// order; the communicator orders its calls across streams).  Call k - 1 on r
// read a line that every other rank wrote in call k - 1 (one-shot: every
// rank's contribution; two-shot: a reduced segment from an owner that itself
// read every rank's phase-1 lines; at least one segment is non-empty), so
// every rank had started call k - 1, hence finished call k - 2 and all of its
// reads.  Two calls ahead would need call k - 1 to finish without them.
//
// Allgather and reducescatter read a line from every peer in every call too
// (a rank's block, or its segment of every peer's input), so the same holds.
//
// Elements are reduced in rank order 0..n-1 by one rank (the owner, two-shot)
// or identically by all (one-shot), so every rank gets the same bits.
//
// The epilogue build (-DGC3_EPILOGUE, allreduce sum only; runtime_cuda/fused/epilogue.py)
// applies y * scale + bias[col] + residual[i] (epilogue.cuh's Epi, one GC3_CMP_PTRS
// group of GC3_EPW_* words per rank slot at `epw`) where a rank stores its result,
// and stores out_t (-DGC3_OUT_DTYPE: fp32 partial sums delivered as bf16).  It sums
// the n contributions in acc_t and rounds once, at that store (one-shot); two-shot's
// owner rounds its segment to the input type once, since that is what travels to the
// peers, and every rank (the owner too) applies its own epilogue to those bits.  What
// a rank sends is never the epilogue's: each rank's bias and residual are its own.
// A null `epw` is the plain collective; the plain build ignores it.
// A thread handles the same line indices in every phase (same start and
// stride), so it has read a line of the input before it writes that line of
// the output: in-place calls need no extra copy.
#include "prims_ll.cuh"
#include "prims_ll128.cuh"
#include "sa_call.cuh"

namespace sa {

constexpr int N = Pack<8>::N;   // elements per line

// Line g of a buffer of `count` elements: a vector load where the line is
// whole and 8-byte aligned, else element by element (tail lines, offset
// buffers); missing elements read as zero and are never stored.
__device__ __forceinline__ uint2 load_line(const elem_t* p, long long g, long long count) {
  Pack<8> v;
  const long long e0 = g * N;
  if (e0 + N <= count && ((u64)(p + e0) & 7) == 0) {
    v.raw = *(const uint2*)(p + e0);
  } else {
    v.raw = make_uint2(0, 0);
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (e0 + k < count) v.e[k] = p[e0 + k];
  }
  return v.raw;
}

__device__ __forceinline__ void store_line(elem_t* p, long long g, long long count, uint2 raw) {
  Pack<8> v;
  v.raw = raw;
  const long long e0 = g * N;
  if (e0 + N <= count && ((u64)(p + e0) & 7) == 0) {
    *(uint2*)(p + e0) = v.raw;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (e0 + k < count) p[e0 + k] = v.e[k];
  }
}

__device__ __forceinline__ void put(uint4* line, uint2 d, unsigned flag) {
  st_volatile_v4(line, make_uint4(d.x, flag, d.y, flag));
}

__device__ __forceinline__ void reduce_raw(uint2& acc, uint2 x) {
  Pack<8> a, b;
  a.raw = acc;
  b.raw = x;
  reduce_into<8>(a, b);
  acc = a.raw;
}

// A line's reduction so far.  RawAcc: in the line's own type, rounded at every
// step as all of the runtime's plain reductions are; WideAcc: one acc_t per
// element, rounded once where the result is stored (the epilogue build).
struct RawAcc {
  uint2 v;
  __device__ __forceinline__ static RawAcc of(uint2 x) {
    RawAcc a;
    a.v = x;
    return a;
  }
  __device__ __forceinline__ void add(uint2 x) { reduce_raw(v, x); }
  __device__ __forceinline__ uint2 raw() const { return v; }
};

struct WideAcc {
  acc_t e[N];
  __device__ __forceinline__ static WideAcc of(uint2 x) {
    Pack<8> p;
    p.raw = x;
    WideAcc a;
#pragma unroll
    for (int k = 0; k < N; ++k) a.e[k] = to_acc(p.e[k]);
    return a;
  }
  __device__ __forceinline__ void add(uint2 x) {
    Pack<8> p;
    p.raw = x;
#pragma unroll
    for (int k = 0; k < N; ++k) e[k] = red(e[k], to_acc(p.e[k]));
  }
  __device__ __forceinline__ uint2 raw() const {
    Pack<8> p;
#pragma unroll
    for (int k = 0; k < N; ++k) p.e[k] = from_acc(e[k]);
    return p.raw;
  }
};

#ifdef GC3_EPILOGUE
typedef WideAcc LineAcc;

union OutLine {
  typename RawOf<N * (int)sizeof(out_t)>::type raw;
  out_t e[N];
};

// The epilogue build: line g through E (if on) in acc_t, each element rounded once to
// out_t; col = (g * N) % cols, from the caller (it knows a cheaper way than a modulo
// per line where it can).  Elements past `count` are neither computed (their residual
// is past its end) nor stored.
__device__ __forceinline__ void finish(out_t* out, long long g, long long count, const WideAcc& a, const Epi& E,
                                       int col) {
  OutLine o;
  const long long e0 = g * N;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    acc_t y = a.e[k];
    if (E.on && e0 + k < count) y = epi_acc(E, y, e0 + k, col);
    o.e[k] = to_out(y);
    col = col + 1 == E.cols ? 0 : col + 1;
  }
  if (e0 + N <= count && ((u64)(out + e0) & (sizeof(o.raw) - 1)) == 0) {
    *(decltype(o.raw)*)(out + e0) = o.raw;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (e0 + k < count) out[e0 + k] = o.e[k];
  }
}

// The allreduce's result line g into `out` through the epilogue at `ew` (null: none).  The
// words are read here, at each store (the same few addresses for every thread: cache hits),
// not held in registers across the waits, which made the kernel spill.  32 bits do for
// (g * N) % cols: the kernels serve at most 2 MiB.
__device__ __forceinline__ void store_result(out_t* out, long long g, long long count, const WideAcc& a,
                                             const u64* ew) {
  const Epi E = ew ? load_epi(ew) : no_epi();
  const int col = E.on && E.cols > 0 ? (int)((unsigned)(g * N) % (unsigned)E.cols) : 0;
  finish(out, g, count, a, E, col);
}
#else
typedef RawAcc LineAcc;

// The allreduce's result line g into `out`: the plain build stores it as it is.
__device__ __forceinline__ void store_result(elem_t* out, long long g, long long count, const RawAcc& a,
                                             const u64*) {
  store_line(out, g, count, a.v);
}
#endif

// The first line index >= lo that this thread handles (start t, stride s).
__device__ __forceinline__ long long first_at(long long t, long long s, long long lo) {
  return lo <= t ? t : t + (lo - t + s - 1) / s * s;
}

// Whose contribution a reader takes where rank p's belongs: p's own.
__device__ __forceinline__ int peer_of(int p, int me, int nranks) {
#ifdef GC3_SA_SHIFT_PEERS
  // Test hook (small_allreduce.SHIFT_PEERS): peer p + 1's contribution where p's belongs,
  // the result a peer index off by one gives, which the tests' checks must reject.
  return p == me ? me : (p + 1) % nranks;
#else
  return p;
#endif
}

// Line g reduced over ranks 0..n-1 in that order, so every rank that reduces a
// line gets the same bits: this rank's part from `in`, peer p's from the line
// at slots + p * pitch once it carries `flag`.  False if a wait gave up.
template <class A>
__device__ __forceinline__ bool reduce_ranks(const Plan& P, const Where& w, int me, int nranks, int chan,
                                             const elem_t* in, long long g, long long count,
                                             const uint4* slots, u64 pitch, unsigned flag, A& acc) {
  for (int p = 0; p < nranks; ++p) {
    const int q = peer_of(p, me, nranks);
    uint2 x;
    if (q == me) {
      x = load_line(in, g, count);
    } else if (!ll_read(P, w, q, chan, slots + (u64)q * pitch, flag, x)) {
      return false;
    }
    if (p == 0) acc = A::of(x); else acc.add(x);
  }
  return true;
}

__device__ __forceinline__ u64 word(uint2 x) { return ((u64)x.y << 32) | x.x; }

// The LL128 kernels (the one-shot and two-shot allreduce, the one-shot allgather and
// reducescatter on LL128 lines: prims_ll128.cuh, 8 threads a 128-byte line of 15 data words and
// a flag word, one transaction over NVLink): 1/15 of what
// travels is flag, where an LL line carries as many flag bytes as data.  Their lines live in an
// area of their own after the two LL regions: an LL reader checks two 32-bit words of each 16
// bytes, which an LL128 line's data could hold by chance, so no LL line may ever sit where LL128
// data was written.  Its flag repeats the call's LL flag in both halves, so it differs from the
// flag of call k - 2 (the last to write the parity) and from the zeroed scratch.
//
// A parity of the area holds the larger of one-shot's n slots of every line and two-shot's two
// halves of n segment slots (small_allreduce.py's scratch_shape sizes it alike): lines of a
// one-shot slot, of a two-shot segment slot, of a parity, and call k's parity's byte offset.
__device__ __forceinline__ u64 ll128_slot_lines(long long max_lines) {
  return (u64)((max_lines + GC3_LL128_DATA_WORDS - 1) / GC3_LL128_DATA_WORDS);
}
__device__ __forceinline__ u64 ll128_seg_lines(long long max_lines, int nranks) {
  return (ll128_slot_lines(max_lines) + nranks - 1) / nranks;
}
__device__ __forceinline__ u64 ll128_area(long long region_lines, int nranks, long long max_lines, u64 k) {
  const u64 one = (u64)nranks * ll128_slot_lines(max_lines), two = 2 * (u64)nranks * ll128_seg_lines(max_lines, nranks);
  return GC3_SA_HEADER_BYTES + 2 * (u64)region_lines * 16 + (k & 1) * (one > two ? one : two) * GC3_LL128_LINE_BYTES;
}

// One thread's place in an LL128 call: its 16 bytes of a line (j of 8), the flag thread (the
// group's last: data word 14 and the flag), the group's lanes, the call's flag.
struct Ll128 {
  int j;
  bool ft;
  unsigned gmask;
  u64 flag;
  __device__ __forceinline__ Ll128(unsigned f)
      : j(threadIdx.x & 7), ft((threadIdx.x & 7) == 7), gmask(0xffu << (threadIdx.x & 24)),
        flag(((u64)f << 32) | f) {}
  // The first data word of this thread's 16 bytes of line l, and u64 word `at` of line l.
  __device__ __forceinline__ long long w0(long long l) const { return l * GC3_LL128_DATA_WORDS + 2 * j; }
  __device__ __forceinline__ u64 at(u64 l) const { return l * GC3_LL128_LINE_WORDS + 2 * j; }
  // This thread's data words of line l of `in` (the flag thread's second: none, zero).
  __device__ __forceinline__ void load(const elem_t* in, long long l, long long count, uint2 (&x)[2]) const {
    x[0] = load_line(in, w0(l), count);
    x[1] = ft ? make_uint2(0, 0) : load_line(in, w0(l) + 1, count);
  }
  // Words x as this thread's 16 bytes of the line at `dst` (u64 words), with the flag.
  __device__ __forceinline__ void put(u64* dst, const uint2 (&x)[2]) const {
    __syncwarp(gmask);   // the group's 8 stores issue as one instruction (one transaction)
    st_volatile_v2u64(dst, word(x[0]), ft ? flag : word(x[1]));
  }
  // This thread's words of the line at `src` once it carries the flag; false if the wait gave up.
  __device__ __forceinline__ bool get(const Plan& P, const Where& w, int peer, int chan, const u64* src,
                                      uint2 (&x)[2]) const {
    u64 a, b;
    if (!ll128_read(P, w, peer, chan, src, flag, ft, gmask, a, b)) return false;
    x[0] = make_uint2((unsigned)a, (unsigned)(a >> 32));
    x[1] = make_uint2((unsigned)b, (unsigned)(b >> 32));
    return true;
  }
  // Words x of line l into `out` as they are.
  __device__ __forceinline__ void store_words(elem_t* out, long long l, long long count, const uint2 (&x)[2]) const {
    store_line(out, w0(l), count, x[0]);
    if (!ft) store_line(out, w0(l) + 1, count, x[1]);
  }
  // The result words of line l into `out`.
  template <class A, class O>
  __device__ __forceinline__ void store(O* out, long long l, long long count, const A (&acc)[2], const u64* ew) const {
    store_result(out, w0(l), count, acc[0], ew);
    if (!ft) store_result(out, w0(l) + 1, count, acc[1], ew);
  }
};

// Line l reduced over ranks 0..n-1 in that order (as reduce_ranks): this rank's words from
// `in`, peer p's from slots + p * pitch (u64 words) + at(l) once they carry the flag.
template <class A>
__device__ __forceinline__ bool ll128_reduce_ranks(const Plan& P, const Where& w, const Ll128& G, int me, int nranks,
                                                   int chan, const elem_t* in, long long l, long long count,
                                                   const u64* slots, u64 pitch, u64 at, A (&acc)[2]) {
  for (int p = 0; p < nranks; ++p) {
    const int q = peer_of(p, me, nranks);
    uint2 x[2];
    if (q == me) {
      G.load(in, l, count, x);
    } else if (!G.get(P, w, q, chan, slots + (u64)q * pitch + at, x)) {
      return false;
    }
    for (int u = 0; u < 2; ++u) {
      if (p == 0) acc[u] = A::of(x[u]); else acc[u].add(x[u]);
    }
  }
  return true;
}

}  // namespace sa

// grid (blocks per rank, local ranks); blockIdx.y = local slot, rank rank0 + slot.
// peers: [nlocal][nranks] scratch bases as this process addresses them.
// io: [nlocal][2] input and output addresses of this call.
// count: elements of a rank's input (allreduce), of its block (allgather: its
// input; reducescatter: its output, one segment of its input).
// max_lines: lines of the largest count the scratch holds;
// region_lines: lines of one parity region; grid_max: the group's most blocks per rank.
// epw: [nlocal][GC3_CMP_PTRS] epilogue words (the epilogue build), or null.
// done: the host's stream-order counter (runtime_cuda.core.streams.StreamOrder.counter), which
// each block bumps once it has stored everything, or null (a captured launch: its replays are
// no call the host counted).
// One body, two entries: the LL128 kernels are an entry of their own, so that their registers
// (a group's two words per line, the epilogue's accumulators) do not become the LL kernels'.
template <bool LL128>
__device__ __forceinline__ void small_allreduce(const Plan* plan, const u64* peers, const u64* io, int nranks,
                                                int rank0, long long count, int kind, long long max_lines,
                                                long long region_lines, int grid_max, const u64* epw,
                                                unsigned* done) {
  // First, before the plan or any buffer: the host may launch this kernel marked
  // for programmatic dependent launch (the opening comment's stream-order argument
  // holds from here on).
  grid_dependency_wait();
  allow_next_grid();
  const Plan P = *plan;
  const int slot = blockIdx.y;
  const int me = rank0 + slot;
  const u64* base = peers + (u64)slot * nranks;
  u64* header = (u64*)base[me];
  const elem_t* in = (const elem_t*)io[2 * slot];
  elem_t* out = (elem_t*)io[2 * slot + 1];
#ifdef GC3_EPILOGUE
  const u64* const ew = epw ? epw + (u64)slot * GC3_CMP_PTRS : nullptr;
  out_t* const dst = (out_t*)out;
#else
  const u64* const ew = nullptr;
  elem_t* const dst = out;
#endif

  const SaCall call = sa_call_begin(header, region_lines);
  const u64 k = call.k;
  const unsigned flag = call.flag;
  const u64 region = call.region;
  auto lines_of = [&](int r) { return (uint4*)(base[r] + region); };

  const long long L = (count + sa::N - 1) / sa::N;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  bool ok = true;

  if constexpr (LL128) {
    // The kernels on LL128 lines (sa::Ll128 above), in the same slots as their LL forms,
    // counted in lines of 15 words; a group of 8 threads a line.
    const sa::Ll128 G(flag);
    const u64 off = sa::ll128_area(region_lines, nranks, max_lines, k);
    auto slots_of = [&](int r) { return (u64*)(base[r] + off); };
    const long long nl = (L + GC3_LL128_DATA_WORDS - 1) / GC3_LL128_DATA_WORDS;
    const long long grp = t >> 3, gstride = stride >> 3;
    const u64* mine = slots_of(me);
    // The one-shot forms' slot r of every rank's area: rank r's block.
    const u64 pitch1 = sa::ll128_slot_lines(max_lines) * GC3_LL128_LINE_WORDS;
    if (kind == GC3_SA_ALLGATHER128) {
      // Rank r's block lands at out + r * count.
      for (long long l = grp; l < nl; l += gstride) {
        uint2 x[2];
        G.load(in, l, count, x);
        for (int p = 0; p < nranks; ++p)
          if (p != me) G.put(slots_of(p) + (u64)me * pitch1 + G.at(l), x);
        G.store_words(out + (long long)me * count, l, count, x);
      }
      for (long long l = grp; ok && l < nl; l += gstride) {
        for (int p = 0; ok && p < nranks; ++p) {
          if (p == me) continue;
          uint2 x[2];
          const Where w{me, (int)blockIdx.x, 10, (int)l, 0};
          ok = G.get(P, w, p, 0, mine + (u64)p * pitch1 + G.at(l), x);
          if (ok) G.store_words(out + (long long)p * count, l, count, x);
        }
      }
    } else if (kind == GC3_SA_REDUCESCATTER128) {
      // Segment s of a rank's input (count elements from in + s * count) goes to slot `me` of
      // rank s; a rank reduces its own segment over ranks 0..n-1.
      for (long long l = grp; l < nl; l += gstride) {
        for (int s = 0; s < nranks; ++s) {
          if (s == me) continue;
          uint2 x[2];
          G.load(in + (long long)s * count, l, count, x);
          G.put(slots_of(s) + (u64)me * pitch1 + G.at(l), x);
        }
      }
      const elem_t* own = in + (long long)me * count;
      for (long long l = grp; ok && l < nl; l += gstride) {
        sa::RawAcc acc[2];
        const Where w{me, (int)blockIdx.x, 11, (int)l, 0};
        ok = sa::ll128_reduce_ranks(P, w, G, me, nranks, 0, own, l, count, mine, pitch1, G.at(l), acc);
        if (ok) {
          const uint2 r[2] = {acc[0].v, acc[1].v};
          G.store_words(out, l, count, r);
        }
      }
    } else if (kind == GC3_SA_ONESHOT128) {
      // Slot r of every rank's area holds rank r's whole input.
      const u64 pitch = pitch1;
      for (long long l = grp; l < nl; l += gstride) {
        uint2 x[2];
        G.load(in, l, count, x);
        for (int p = 0; p < nranks; ++p)
          if (p != me) G.put(slots_of(p) + (u64)me * pitch + G.at(l), x);
      }
      for (long long l = grp; ok && l < nl; l += gstride) {
        sa::LineAcc acc[2];
        const Where w{me, (int)blockIdx.x, 7, (int)l, 0};
        ok = sa::ll128_reduce_ranks(P, w, G, me, nranks, 0, in, l, count, mine, pitch, G.at(l), acc);
        if (ok) G.store(dst, l, count, acc, ew);
      }
    } else {
      // As the LL two-shot: segment s (lines [s*Ls, ...)) belongs to rank s; phase 1 puts a
      // rank's lines of it in slot r of the owner's first half, phase 2 every rank's second
      // half gets it reduced, in slot s.
      const long long Ls = (nl + nranks - 1) / nranks;
      const u64 S = sa::ll128_seg_lines(max_lines, nranks);
      const u64 pitch = S * GC3_LL128_LINE_WORDS, half = (u64)nranks * pitch;
      for (long long l = grp; l < nl; l += gstride) {
        const int s = (int)(l / Ls);
        if (s == me) continue;
        uint2 x[2];
        G.load(in, l, count, x);
        G.put(slots_of(s) + (u64)me * pitch + G.at(l - s * Ls), x);
      }
      const long long lo = (long long)me * Ls, hi = lo + Ls < nl ? lo + Ls : nl;
      for (long long l = sa::first_at(grp, gstride, lo); ok && l < hi; l += gstride) {
        sa::LineAcc acc[2];
        const Where w{me, (int)blockIdx.x, 8, (int)l, 0};
        ok = sa::ll128_reduce_ranks(P, w, G, me, nranks, 1, in, l, count, mine, pitch, G.at(l - lo), acc);
        if (!ok) break;
        const uint2 r[2] = {acc[0].raw(), acc[1].raw()};   // the bits every rank gets, the owner too
        for (int p = 0; p < nranks; ++p)
          if (p != me) G.put(slots_of(p) + half + (u64)me * pitch + G.at(l - lo), r);
        const sa::LineAcc res[2] = {sa::LineAcc::of(r[0]), sa::LineAcc::of(r[1])};
        G.store(dst, l, count, res, ew);
      }
      for (long long l = grp; ok && l < nl; l += gstride) {
        const int s = (int)(l / Ls);
        if (s == me) continue;
        uint2 x[2];
        const Where w{me, (int)blockIdx.x, 9, (int)l, 0};
        ok = G.get(P, w, s, 2, mine + half + (u64)s * pitch + G.at(l - s * Ls), x);
        if (!ok) break;
        const sa::LineAcc res[2] = {sa::LineAcc::of(x[0]), sa::LineAcc::of(x[1])};
        G.store(dst, l, count, res, ew);
      }
    }
  } else if (kind == GC3_SA_ALLGATHER) {
    // Slot r of every rank's region holds rank r's block, which lands at out + r * count.
    for (long long g = t; g < L; g += stride) {
      const uint2 d = sa::load_line(in, g, count);
      for (int p = 0; p < nranks; ++p)
        if (p != me) sa::put(lines_of(p) + (u64)me * max_lines + g, d, flag);
      sa::store_line(out + (long long)me * count, g, count, d);
    }
    const uint4* mine = lines_of(me);
    for (long long g = t; ok && g < L; g += stride) {
      for (int p = 0; ok && p < nranks; ++p) {
        if (p == me) continue;
        uint2 x;
        const Where w{me, (int)blockIdx.x, 3, (int)g, 0};
        ok = ll_read(P, w, p, 0, mine + (u64)p * max_lines + g, flag, x);
        if (ok) sa::store_line(out + (long long)p * count, g, count, x);
      }
    }
  } else if (kind == GC3_SA_REDUCESCATTER) {
    // Segment s of a rank's input (count elements from in + s * count) goes to
    // slot `me` of rank s; a rank reduces its own segment over ranks 0..n-1.
    for (long long g = t; g < L; g += stride)
      for (int s = 0; s < nranks; ++s)
        if (s != me) sa::put(lines_of(s) + (u64)me * max_lines + g, sa::load_line(in + (long long)s * count, g, count), flag);
    const uint4* mine = lines_of(me);
    const elem_t* own = in + (long long)me * count;
    for (long long g = t; ok && g < L; g += stride) {
      sa::RawAcc acc;
      const Where w{me, (int)blockIdx.x, 4, (int)g, 0};
      ok = sa::reduce_ranks(P, w, me, nranks, 0, own, g, count, mine + g, (u64)max_lines, flag, acc);
      if (ok) sa::store_line(out, g, count, acc.v);
    }
  } else if (kind == GC3_SA_ONESHOT) {
    // Slot r of every rank's region holds rank r's whole input.
    for (long long g = t; g < L; g += stride) {
      const uint2 d = sa::load_line(in, g, count);
      for (int p = 0; p < nranks; ++p)
        if (p != me) sa::put(lines_of(p) + (u64)me * max_lines + g, d, flag);
    }
    const uint4* mine = lines_of(me);
    for (long long g = t; ok && g < L; g += stride) {
      sa::LineAcc acc;
      const Where w{me, (int)blockIdx.x, 0, (int)g, 0};
      ok = sa::reduce_ranks(P, w, me, nranks, 0, in, g, count, mine + g, (u64)max_lines, flag, acc);
      if (ok) sa::store_result(dst, g, count, acc, ew);
    }
  } else {
    // Segment s (lines [s*Ls, min((s+1)*Ls, L))) belongs to rank s.  Phase 1:
    // slot r of the owner's first half holds rank r's lines of the segment;
    // phase 2: slot s of every rank's second half holds segment s reduced.
    const long long Ls = (L + nranks - 1) / nranks;
    const long long S = (max_lines + nranks - 1) / nranks;
    const long long half = (long long)nranks * S;
    for (long long g = t; g < L; g += stride) {
      const int s = (int)(g / Ls);
      if (s != me) sa::put(lines_of(s) + (u64)me * S + (g - s * Ls), sa::load_line(in, g, count), flag);
    }
    const long long lo = (long long)me * Ls, hi = lo + Ls < L ? lo + Ls : L;
    const uint4* mine = lines_of(me);
    for (long long g = sa::first_at(t, stride, lo); ok && g < hi; g += stride) {
      sa::LineAcc acc;
      const Where w{me, (int)blockIdx.x, 1, (int)g, 0};
      ok = sa::reduce_ranks(P, w, me, nranks, 1, in, g, count, mine + (g - lo), (u64)S, flag, acc);
      if (!ok) break;
      const uint2 r = acc.raw();     // the bits every rank gets, the owner too
      for (int p = 0; p < nranks; ++p)
        if (p != me) sa::put(lines_of(p) + half + (u64)me * S + (g - lo), r, flag);
      sa::store_result(dst, g, count, sa::LineAcc::of(r), ew);
    }
    for (long long g = t; ok && g < L; g += stride) {
      const int s = (int)(g / Ls);
      if (s == me) continue;
      uint2 x;
      Where w{me, (int)blockIdx.x, 2, (int)g, 0};
      if (!ll_read(P, w, s, 2, mine + half + (u64)s * S + (g - s * Ls), flag, x)) { ok = false; break; }
      sa::store_result(dst, g, count, sa::LineAcc::of(x), ew);
    }
  }
  // Every thread ends here, a failed one too.
  sa_call_end(header, k, grid_max);
  // After sa_call_end's barrier, so the fence orders every thread's stores before the count: a
  // stream the host switches to waits for the count, then reads what this call wrote.
  if (done != nullptr && threadIdx.x == 0) {
    __threadfence();
    atomicAdd(done, 1u);
  }
}

// kind: GC3_SA_ONESHOT, _TWOSHOT, _ALLGATHER or _REDUCESCATTER.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)
gc3_small_allreduce(const Plan* plan, const u64* peers, const u64* io, int nranks, int rank0, long long count,
                    int kind, long long max_lines, long long region_lines, int grid_max, const u64* epw,
                    unsigned* done) {
  small_allreduce<false>(plan, peers, io, nranks, rank0, count, kind, max_lines, region_lines, grid_max, epw, done);
}

// kind: GC3_SA_ONESHOT128, _TWOSHOT128, _ALLGATHER128 or _REDUCESCATTER128.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)
gc3_small_allreduce_ll128(const Plan* plan, const u64* peers, const u64* io, int nranks, int rank0, long long count,
                          int kind, long long max_lines, long long region_lines, int grid_max, const u64* epw,
                          unsigned* done) {
  small_allreduce<true>(plan, peers, io, nranks, rank0, count, kind, max_lines, region_lines, grid_max, epw, done);
}

#ifdef GC3_EPILOGUE
// The epilogue as one pass of its own: out = epilogue(y), y the communicator's
// allreduce of a call larger than the kernels' scratch.  out may be y itself (same
// type): a thread reads a line before it stores that line.  The epilogue's words come
// by value (a call is one launch, and a captured one needs no table).  col advances by
// the grid's stride instead of a 64-bit modulo per line.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)
gc3_epilogue_pass(const elem_t* y, out_t* out, long long count, u64 bias, u64 residual, u64 scale, u64 shape) {
  u64 w[GC3_CMP_PTRS] = {};
  w[GC3_EPW_BIAS] = bias;
  w[GC3_EPW_RESIDUAL] = residual;
  w[GC3_EPW_SCALE] = scale;
  w[GC3_EPW_SHAPE] = shape;
  const Epi E = load_epi(w);
  const long long L = (count + sa::N - 1) / sa::N;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long cols = E.cols > 0 ? E.cols : 1;
  const int step = (int)(stride * sa::N % cols);
  int col = (int)(t * sa::N % cols);
  for (long long g = t; g < L; g += stride) {
    sa::finish(out, g, count, sa::WideAcc::of(sa::load_line(y, g, count)), E, col);
    col += step;
    if (col >= cols) col -= (int)cols;
  }
}
#endif
