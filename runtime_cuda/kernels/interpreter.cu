// The gc3 interpreter: one persistent block per (rank, threadblock) of the IR.
// Each block walks tiles of every chunk and, per tile, its own steps in order:
// wait for dependencies and FIFO space, move/reduce one tile, publish.
// Compiled per dtype x op x protocol (-DGC3_DTYPE, -DGC3_REDOP, -DGC3_PROTO).
#include "common.cuh"
#include "sync.cuh"
#include "reduce_ops.cuh"
#include "prims_simple.cuh"
#include "prims_ll.cuh"

#ifndef GC3_PROTO
#define GC3_PROTO GC3_PROTO_SIMPLE
#endif
#ifndef GC3_MAX_THREADS
#define GC3_MAX_THREADS 512
#endif

// GC3_TRACE builds record %globaltimer at fixed points of each block (thread 0)
// into P.trace, to see where a call spends its time.
#ifdef GC3_TRACE
#define TRACE_AT(P, k) \
  do { if (threadIdx.x == 0 && (P).trace && (k) < GC3_TRACE_WORDS) \
         (P).trace[(u64)blockIdx.x * GC3_TRACE_WORDS + (k)] = global_ns(); } while (0)
#else
#define TRACE_AT(P, k) do { } while (0)
#endif

// Chunk geometry of one call (gc3.layout.Layout).
struct Shape {
  i64 unit;   // elements per block of a user buffer
  i64 cs;     // lanes per chunk
  int cpb;    // chunks per block
  int T;      // lanes per tile
};

// Chunk `idx` of buffer `buf`, tile starting at lane `lane0`, as gc3.layout's
// chunk_range places it.
template <int B>
__device__ __forceinline__ Operand chunk_operand(elem_t* const (&base)[3], int buf, int idx, const Shape& sh,
                                                 i64 lane0, int n) {
  if (buf == GC3_BUF_S) return make_operand<B>(base[GC3_BUF_S] + idx * sh.cs + lane0, n, n);
  const i64 b = idx / sh.cpb, j = idx - b * sh.cpb;
  const i64 lo = min(j * sh.cs, sh.unit), hi = min((j + 1) * sh.cs, sh.unit);
  // A select, not base[buf]: a run-time index would put the array in local memory.
  elem_t* const p = buf == GC3_BUF_I ? base[GC3_BUF_I] : base[GC3_BUF_O];
  return make_operand<B>(p + b * sh.unit + lo + lane0, hi - lo - lane0, n);
}

// Everything one step needs besides the step descriptor itself.
struct StepCtx {
  const Plan* P;
  Where w;
  elem_t* base[3];
  Shape sh;
  i64 lane0;
  int n;
  char* rslot;   // receive slot of this step (or null)
  char* sslot;   // send slot of this step (or null)
  unsigned rflag, sflag;
  int rpeer, rchan;
};

// The copy/reduce family: every opcode of gc3 IR is "read a received tile
// and/or local operands, combine, write to the send slot and/or a local
// operand".  Returns false if a wait inside the data path gave up (LL).
// `extra` is shared memory for the additional sources of a fused `re`.
__device__ __forceinline__ bool copy_reduce_step(const StepCtx& c, const int* st, Operand* extra) {
  constexpr int B = (GC3_PROTO == GC3_PROTO_LL) ? 8 : 16;
  const int op = st[GC3_ST_OP], flags = st[GC3_ST_FLAGS], cnt = st[GC3_ST_CNT];
  const int in_buf = st[GC3_ST_IN_BUF], in_off = st[GC3_ST_IN_OFF];
  const int out_buf = st[GC3_ST_OUT_BUF], out_off = st[GC3_ST_OUT_OFF];
  const int* ex = c.P->extras + 2 * st[GC3_ST_EXTRA_START];
  const int nextra = st[GC3_ST_NEXTRA];
  const int T = c.sh.T;
  const bool recv = flags & GC3_F_RECV, send = flags & GC3_F_SEND;
  for (int k = 0; k < cnt; ++k) {
    if (nextra) {
      __syncthreads();  // the previous chunk is done with `extra`
      if (threadIdx.x < nextra)
        extra[threadIdx.x] = chunk_operand<B>(c.base, ex[2 * threadIdx.x], ex[2 * threadIdx.x + 1] + k, c.sh, c.lane0, c.n);
      __syncthreads();
    }
    Sources s;
    s.n = 0;
    s.extra = extra;
    s.nextra = nextra;
    Operand d0, d1;
    int nd = 0;
#if GC3_PROTO == GC3_PROTO_SIMPLE
    if (recv) { s.a = make_operand<B>((elem_t*)c.rslot + (i64)k * T, c.n, c.n); s.n = 1; }
#endif
    if (op == GC3_OP_RE) {
      const Operand o = chunk_operand<B>(c.base, out_buf, out_off + k, c.sh, c.lane0, c.n);
      if (s.n) s.b = o; else s.a = o;
      ++s.n;
    }
    if (in_buf != GC3_BUF_NONE) {
      const Operand o = chunk_operand<B>(c.base, in_buf, in_off + k, c.sh, c.lane0, c.n);
      if (s.n) s.b = o; else s.a = o;
      ++s.n;
    }
    if (out_buf != GC3_BUF_NONE) { d0 = chunk_operand<B>(c.base, out_buf, out_off + k, c.sh, c.lane0, c.n); nd = 1; }
#if GC3_PROTO == GC3_PROTO_SIMPLE
    if (send) {
      const Operand o = make_operand<B>((elem_t*)c.sslot + (i64)k * T, c.n, c.n);
      if (nd) d1 = o; else d0 = o;
      ++nd;
    }
    if (nd) reduce_copy<B, 4>(c.n, s, d0, d1, nd);
#else
    (void)d1;
    const i64 lines = (i64)T * sizeof(elem_t) / 8;   // lines per chunk-tile
    const uint4* rl = recv ? (const uint4*)c.rslot + k * lines : nullptr;
    uint4* sl = send ? (uint4*)c.sslot + k * lines : nullptr;
    if (!reduce_copy_ll(*c.P, c.w, c.rpeer, c.rchan, c.n, rl, c.rflag, s, sl, c.sflag, d0, nd)) return false;
#endif
  }
  return true;
}

// Runs one block's threadblock to the end of the call.  Returns with the
// connection counters in shared memory for the caller to store.
__device__ void run_tb(const Plan& P, const int* tb, const u64* bufs, const Shape& sh, int ntiles,
                       unsigned epoch, u64& sh_sent, u64& sh_recvd, int& sh_stop) {
  const int rank_slot = tb[GC3_TB_RANK_SLOT];
  const int nsteps = tb[GC3_TB_NSTEPS];
  const int* steps = P.steps + (i64)tb[GC3_TB_STEP_START] * GC3_ST_NFIELDS;
  // A TB without a connection still points at row 0 (the host never leaves
  // a table empty), so no load through sc/rc can fault whatever the compiler
  // speculates; `has_send`/`has_recv` decide what is used.
  const bool has_send = tb[GC3_TB_SEND] >= 0, has_recv = tb[GC3_TB_RECV] >= 0;
  const u64* sc = P.sends + (i64)max(tb[GC3_TB_SEND], 0) * GC3_CONN_NFIELDS;
  const u64* rc = P.recvs + (i64)max(tb[GC3_TB_RECV], 0) * GC3_CONN_NFIELDS;
  // The connection words, loaded once: the waits' memory clobbers would
  // otherwise reload them from the record at every step.
  char* const rfifo = (char*)rc[GC3_CONN_FIFO];
  char* const sfifo = (char*)sc[GC3_CONN_FIFO];
  const u64* const data_in = (const u64*)rc[GC3_CONN_TAIL];     // filled slots (recv side, local)
  u64* const credit_out = (u64*)rc[GC3_CONN_HEAD];              // consumed slots (recv side, remote)
  const u64* const credit_in = (const u64*)sc[GC3_CONN_HEAD];   // consumed slots (send side, local)
  u64* const data_out = (u64*)sc[GC3_CONN_TAIL];                // filled slots (send side, remote)
  const u64 nslots = P.nslots, slot_bytes = P.slot_bytes;
  (void)data_in;
  (void)data_out;   // LL carries its signal in the data
  __shared__ Operand extra[GC3_MAX_FANIN];
  StepCtx c;
  c.P = &P;
  c.w.rank = tb[GC3_TB_RANK];
  c.w.tb = tb[GC3_TB_ID];
  for (int b = 0; b < 3; ++b) c.base[b] = (elem_t*)bufs[3 * rank_slot + b];
  c.sh = sh;
  c.rpeer = has_recv ? (int)rc[GC3_CONN_PEER] : -1;
  c.rchan = has_recv ? (int)rc[GC3_CONN_CHAN] : -1;
  const int speer = has_send ? (int)sc[GC3_CONN_PEER] : -1, schan = has_send ? (int)sc[GC3_CONN_CHAN] : -1;

  int ev = 2;   // next trace slot
  for (int t = 0; t < ntiles; ++t) {
    c.lane0 = (i64)t * sh.T;
    c.n = (int)min((i64)sh.T, sh.cs - c.lane0);
    c.w.tile = t;
    for (int j = 0; j < nsteps; ++j) {
      const int* st = steps + (i64)j * GC3_ST_NFIELDS;
      const int flags = st[GC3_ST_FLAGS];
      c.w.step = st[GC3_ST_ORIG];
      c.w.op = st[GC3_ST_OP];
      if (threadIdx.x == 0) {
        bool ok = true;
        const int* dep = P.deps + 2 * st[GC3_ST_DEP_START];
        for (int d = 0; ok && d < st[GC3_ST_NDEPS]; ++d)
          ok = wait_geq<false>(P, P.flags + dep[2 * d], progress_value(epoch, t, dep[2 * d + 1]), c.w,
                               GC3_WAIT_DEP, dep[2 * d], dep[2 * d + 1]);
#if GC3_PROTO == GC3_PROTO_SIMPLE
        if (ok && (flags & GC3_F_RECV))
          ok = wait_geq<true>(P, data_in, sh_recvd + 1, c.w, GC3_WAIT_DATA, c.rpeer, c.rchan);
#endif
        if (ok && (flags & GC3_F_SEND)) {
          const u64 want = sh_sent + 1 > nslots ? sh_sent + 1 - nslots : 0;
          ok = wait_geq<true>(P, credit_in, want, c.w, GC3_WAIT_CREDIT, speer, schan);
        }
        sh_stop = !ok;
      }
      TRACE_AT(P, ev < GC3_TRACE_WORDS - 1 ? ev : GC3_TRACE_WORDS);
      ++ev;
      __syncthreads();
      if (sh_stop) return;
      const u64 sent = sh_sent, recvd = sh_recvd;
      c.rslot = has_recv ? rfifo + (recvd % nslots) * slot_bytes : nullptr;
      c.sslot = has_send ? sfifo + (sent % nslots) * slot_bytes : nullptr;
      c.rflag = (unsigned)(recvd + 1);
      c.sflag = (unsigned)(sent + 1);

      bool ok = true;
      switch (c.w.op) {
        case GC3_OP_S: case GC3_OP_R: case GC3_OP_RCS: case GC3_OP_RRC:
        case GC3_OP_RRS: case GC3_OP_RRCS: case GC3_OP_CPY: case GC3_OP_RE:
          ok = copy_reduce_step(c, st, extra);
          break;
        default:  // the host emits no other opcode
          break;
      }
      if (__syncthreads_or(!ok)) return;
      TRACE_AT(P, ev < GC3_TRACE_WORDS - 1 ? ev : GC3_TRACE_WORDS);
      ++ev;

      // One releasing store publishes what the whole block wrote: the
      // barrier above orders the other threads' stores before thread 0's
      // release, and release is cumulative (no separate fence needed).
      if (threadIdx.x == 0) {
        if (flags & GC3_F_SEND) {
#if GC3_PROTO == GC3_PROTO_SIMPLE
          st_release_sys(data_out, sent + 1);
#endif
          sh_sent = sent + 1;
        }
        if (flags & GC3_F_RECV) {
          st_release_sys(credit_out, recvd + 1);
          sh_recvd = recvd + 1;
        }
        if (flags & GC3_F_SIGNAL) st_release_gpu(P.flags + blockIdx.x, progress_value(epoch, t, j));
      }
    }
  }
}

// Every argument is fixed for a given (group, buffers, size), so a call can
// be replayed from a CUDA graph; the launch count lives in P.epochs.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS, 1)
gc3_interpreter(const Plan* plan, const u64* bufs, i64 unit, i64 cs, int cpb, int T, int ntiles) {
  __shared__ u64 sh_sent, sh_recvd;
  __shared__ int sh_stop;
  __shared__ unsigned sh_epoch;
  const Plan& P = *plan;
  TRACE_AT(P, 0);
  const int* tb = P.tbs + (i64)blockIdx.x * GC3_TB_NFIELDS;
  u64* sent_ctr = (u64*)P.sends[(i64)max(tb[GC3_TB_SEND], 0) * GC3_CONN_NFIELDS + GC3_CONN_COUNTER];
  u64* recv_ctr = (u64*)P.recvs[(i64)max(tb[GC3_TB_RECV], 0) * GC3_CONN_NFIELDS + GC3_CONN_COUNTER];
  if (tb[GC3_TB_SEND] < 0) sent_ctr = nullptr;
  if (tb[GC3_TB_RECV] < 0) recv_ctr = nullptr;
  if (threadIdx.x == 0) {
    sh_sent = sent_ctr ? *sent_ctr : 0;
    sh_recvd = recv_ctr ? *recv_ctr : 0;
    sh_epoch = (unsigned)(P.epochs[blockIdx.x] + 1);
    sh_stop = aborted(P);
  }
  __syncthreads();
  if (sh_stop) return;
  const unsigned epoch = sh_epoch;
  TRACE_AT(P, 1);
  Shape sh;
  sh.unit = unit;
  sh.cs = cs;
  sh.cpb = cpb;
  sh.T = T;
  run_tb(P, tb, bufs, sh, ntiles, epoch, sh_sent, sh_recvd, sh_stop);
  __syncthreads();
  if (threadIdx.x == 0) {
    if (sent_ctr) *sent_ctr = sh_sent;
    if (recv_ctr) *recv_ctr = sh_recvd;
    P.epochs[blockIdx.x] = epoch;
  }
  TRACE_AT(P, GC3_TRACE_WORDS - 1);
}
