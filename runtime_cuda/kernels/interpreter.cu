// The gc3 interpreter: one persistent block per (rank, threadblock) of the IR.
// Each block walks tiles of every chunk and, per tile, its own steps in order:
// wait for dependencies and FIFO space, move/reduce one tile, publish.
// Compiled per dtype x op x protocol (-DGC3_DTYPE, -DGC3_REDOP, -DGC3_PROTO); -DGC3_EPILOGUE
// for an epilogue IR's group (its stores apply the call's epilogue, epilogue.cuh).
#include "common.cuh"
#include "sync.cuh"
#include "reduce_ops.cuh"
#include "prims_simple.cuh"
#include "prims_ll.cuh"
#include "prims_ll128.cuh"
#include "prims_compute.cuh"

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

// Chunk geometry of one call (gc3.ir.layout.Layout).
struct Shape {
  i64 unit;   // elements per block of a user buffer
  i64 cs;     // lanes per chunk
  int cpb;    // chunks per block
  int T;      // lanes per tile
};

// Chunk `idx` of buffer `buf`, tile starting at lane `lane0`, as gc3.ir.layout's
// chunk_range places it.
template <int B>
__device__ __forceinline__ Operand chunk_operand(elem_t* const (&base)[3], int buf, int idx, const Shape& sh,
                                                 i64 lane0, int n) {
  if (buf == GC3_BUF_S) return make_operand<B>(base[GC3_BUF_S] + idx * sh.cs + lane0, n, n);
  // 32-bit: a 64-bit division is a long subroutine, and chunk indices fit.
  const int b = idx / sh.cpb, j = idx - b * sh.cpb;
  const i64 lo = min(j * sh.cs, sh.unit), hi = min((j + 1) * sh.cs, sh.unit);
  // A select, not base[buf]: a run-time index would put the array in local memory.
  elem_t* const p = buf == GC3_BUF_I ? base[GC3_BUF_I] : base[GC3_BUF_O];
  return make_operand<B>(p + (i64)b * sh.unit + lo + lane0, hi - lo - lane0, n);
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
  u64 rflag, sflag;   // the slot's flag (LL: its low 32 bits)
  int rpeer, rchan;
};

// The copy/reduce family: every opcode of gc3 IR is "read a received tile
// and/or local operands, combine, write to the send slot and/or a local
// operand".  Returns false if a wait inside the data path gave up (LL).
// `extra` is shared memory for the additional sources of a fused `re`; `ext`
// the rank's words past GC3_MAX_BUFS in the call's table (an epilogue IR: the
// GC3_EPW_* words, read only by steps flagged GC3_F_EPILOGUE).
__device__ __forceinline__ bool copy_reduce_step(const StepCtx& c, const int* st, Operand* extra, const u64* ext) {
  constexpr int B = (GC3_PROTO == GC3_PROTO_SIMPLE) ? 16 : 8;
  const int op = st[GC3_ST_OP], flags = st[GC3_ST_FLAGS], cnt = st[GC3_ST_CNT];
  const int in_buf = st[GC3_ST_IN_BUF], in_off = st[GC3_ST_IN_OFF];
  const int out_buf = st[GC3_ST_OUT_BUF], out_off = st[GC3_ST_OUT_OFF];
  const int* ex = c.P->extras + 2 * st[GC3_ST_EXTRA_START];
  const int nextra = st[GC3_ST_NEXTRA];
  const int T = c.sh.T;
  const bool recv = flags & GC3_F_RECV, send = flags & GC3_F_SEND;
#ifdef GC3_EPILOGUE
  // The host flags only steps with a local dst (tables.check_epilogue).
  Epi epi = (flags & GC3_F_EPILOGUE) ? load_epi(ext) : no_epi();
#else
  (void)ext;
  Epi epi = no_epi();
#endif
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
    if (out_buf != GC3_BUF_NONE) {
      d0 = chunk_operand<B>(c.base, out_buf, out_off + k, c.sh, c.lane0, c.n);
      nd = 1;
      // Output element of d0's first lane: its distance from o, as the simulator's
      // RankMemory.output_index measures it (i may alias o in an in-place call).
      epi.at = d0.p - c.base[GC3_BUF_O];
    }
#if GC3_PROTO == GC3_PROTO_SIMPLE
    if (send) {
      const Operand o = make_operand<B>((elem_t*)c.sslot + (i64)k * T, c.n, c.n);
      if (nd) d1 = o; else d0 = o;
      ++nd;
    }
    if (nd) reduce_copy<B, 4>(c.n, s, d0, d1, nd, epi);
#elif GC3_PROTO == GC3_PROTO_LL
    (void)d1;
    const i64 lines = (i64)T * sizeof(elem_t) / 8;   // lines per chunk-tile
    const uint4* rl = recv ? (const uint4*)c.rslot + k * lines : nullptr;
    uint4* sl = send ? (uint4*)c.sslot + k * lines : nullptr;
    if (!reduce_copy_ll(*c.P, c.w, c.rpeer, c.rchan, c.n, rl, (unsigned)c.rflag, s, sl, (unsigned)c.sflag, d0, nd, epi))
      return false;
#else
    (void)d1;
    const i64 words = (i64)T * sizeof(elem_t) / GC3_LL128_LINE_DATA_BYTES * GC3_LL128_LINE_WORDS;  // per chunk-tile
    const u64* rl = recv ? (const u64*)c.rslot + k * words : nullptr;
    u64* sl = send ? (u64*)c.sslot + k * words : nullptr;
    if (!reduce_copy_ll128(*c.P, c.w, c.rpeer, c.rchan, c.n, rl, c.rflag, s, sl, c.sflag, d0, nd, epi))
      return false;
#endif
  }
  return true;
}

#ifdef GC3_HAS_COMPUTE
// A compute step (gemv, ebag): its operator for this tile of each of its cnt dst
// chunks, straight into them.  Operands: GC3_CMP_EXTRA_PAIRS pairs in the extras
// table ([col0, col1), then the operator's dimensions); `cmp` the rank's
// compute input addresses.  Chunk k holds split-axis units col0 + k*per ..
__device__ __forceinline__ void compute_step(const StepCtx& c, const int* st, const u64* cmp) {
  const int* ex = c.P->extras + 2 * st[GC3_ST_EXTRA_START];
  const int col0 = ex[0], cnt = st[GC3_ST_CNT];
  const int per = (ex[1] - col0) / cnt;
  for (int k = 0; k < cnt; ++k) {
    const Operand d = chunk_operand<16>(c.base, st[GC3_ST_OUT_BUF], st[GC3_ST_OUT_OFF] + k, c.sh, c.lane0, c.n);
    const i64 first = (i64)col0 + (i64)k * per;
    if (st[GC3_ST_OP] == GC3_OP_GEMV)
      gemv_tile((const elem_t*)cmp[0], (const elem_t*)cmp[1], ex[2], ex[3], ex[4], first, per, d.p, c.lane0, d.valid);
    else
      ebag_tile((const elem_t*)cmp[0], (const int*)cmp[1], (const int*)cmp[2], ex[2], ex[3], ex[4], ex[5], ex[6],
                first, d.p, c.lane0, d.valid);
  }
}
#endif

// The wait list of a device step: the first GC3_DS_INLINE_DEPS inline, the rest in P.deps.
__device__ __forceinline__ const int* dep_at(const Plan& P, const int* st, int d) {
  return d < GC3_DS_INLINE_DEPS ? st + GC3_DS_DEP0 + 2 * d
                                : P.deps + 2 * (st[GC3_ST_DEP_START] + d);
}

// A block's running state, kept in shared memory while it runs and stored
// back into its row at exit.
struct BlockState {
  u64 sent, recvd, credit_seen;
  unsigned epoch;
  int stop;
};

// Runs one block's threadblock to the end of the call.  `row` is the
// block's row in shared memory (GC3_BK_*); `cold` its steps beyond the row.
// `gbufs` is the call's buffer table in global memory (compute input addresses).
__device__ void run_tb(const Plan& P, const int* row, const u64* bufs, const u64* gbufs, const Shape& sh, int ntiles,
                       BlockState& bs) {
  const u64* q = (const u64*)row;
  const int nsteps = row[GC3_BK_NSTEPS], nhot = row[GC3_BK_NHOT];
  const int* hot = row + GC3_BK_HEADER_WORDS;
  const int* cold = P.cold + (i64)row[GC3_BK_COLD_START] * GC3_DS_NFIELDS;
  char* const rfifo = (char*)q[GC3_BKQ_RFIFO];
  char* const sfifo = (char*)q[GC3_BKQ_SFIFO];
  const u64* const data_in = (const u64*)q[GC3_BKQ_DATA_IN];     // filled slots (recv side, local)
  u64* const credit_out = (u64*)q[GC3_BKQ_CREDIT_OUT];          // consumed slots (recv side, remote)
  const u64* const credit_in = (const u64*)q[GC3_BKQ_CREDIT_IN];  // consumed slots (send side, local)
  u64* const data_out = (u64*)q[GC3_BKQ_DATA_OUT];              // filled slots (send side, remote)
  const u64 nslots = P.nslots, slot_bytes = P.slot_bytes;
  const unsigned epoch = bs.epoch;
  (void)data_in;
  (void)data_out;   // LL and LL128 carry their signal in the data
  __shared__ Operand extra[GC3_MAX_FANIN];
  StepCtx c;
  c.P = &P;
  c.w.rank = row[GC3_BK_RANK];
  c.w.tb = row[GC3_BK_TB];
  const int rank_slot = row[GC3_BK_RANK_SLOT];
  for (int b = 0; b < 3; ++b) c.base[b] = (elem_t*)bufs[3 * rank_slot + b];
  c.sh = sh;
  c.rpeer = row[GC3_BK_RPEER];
  c.rchan = row[GC3_BK_RCHAN];
  const int speer = row[GC3_BK_SPEER], schan = row[GC3_BK_SCHAN];
  const bool has_send = speer >= 0, has_recv = c.rpeer >= 0;

  int ev = 2;   // next trace slot
  for (int t = 0; t < ntiles; ++t) {
    c.lane0 = (i64)t * sh.T;
    c.n = (int)min((i64)sh.T, sh.cs - c.lane0);
    c.w.tile = t;
    for (int j = 0; j < nsteps; ++j) {
      const int* st = j < nhot ? hot + j * GC3_DS_NFIELDS : cold + (i64)(j - nhot) * GC3_DS_NFIELDS;
      const int flags = st[GC3_ST_FLAGS];
      c.w.step = st[GC3_ST_ORIG];
      c.w.op = st[GC3_ST_OP];
      if (threadIdx.x == 0) {
        bool ok = true;
        u64 seen;
        const int ndeps = st[GC3_ST_NDEPS];
        for (int d = 0; ok && d < ndeps; ++d) {
          const int* dep = dep_at(P, st, d);
          ok = wait_geq<false, true>(P, P.flags + dep[0], progress_value(epoch, t, dep[1]), c.w,
                                     GC3_WAIT_DEP, dep[0], dep[1], seen);
        }
#if GC3_PROTO == GC3_PROTO_SIMPLE
        if (ok && (flags & GC3_F_RECV))
          ok = wait_geq<true, true>(P, data_in, bs.recvd + 1, c.w, GC3_WAIT_DATA, c.rpeer, c.rchan, seen);
#endif
        if (ok && (flags & GC3_F_SEND)) {
          const u64 want = bs.sent + 1 > nslots ? bs.sent + 1 - nslots : 0;
          if (bs.credit_seen < want) {
            ok = wait_geq<true, false>(P, credit_in, want, c.w, GC3_WAIT_CREDIT, speer, schan, seen);
            if (ok) bs.credit_seen = seen;
          }
        }
        bs.stop = !ok;
      }
      TRACE_AT(P, ev < GC3_TRACE_WORDS - 1 ? ev : GC3_TRACE_WORDS);
      ++ev;
      __syncthreads();
      if (bs.stop) return;
      const u64 sent = bs.sent, recvd = bs.recvd;
      c.rslot = has_recv ? rfifo + (recvd % nslots) * slot_bytes : nullptr;
      c.sslot = has_send ? sfifo + (sent % nslots) * slot_bytes : nullptr;
      c.rflag = recvd + 1;
      c.sflag = sent + 1;

      bool ok = true;
      switch (c.w.op) {
        case GC3_OP_S: case GC3_OP_R: case GC3_OP_RCS: case GC3_OP_RRC:
        case GC3_OP_RRS: case GC3_OP_RRCS: case GC3_OP_CPY: case GC3_OP_RE:
          ok = copy_reduce_step(c, st, extra, gbufs + GC3_MAX_BUFS + GC3_CMP_PTRS * rank_slot);
          break;
        case GC3_OP_GEMV: case GC3_OP_EBAG:
#ifdef GC3_HAS_COMPUTE
          compute_step(c, st, gbufs + GC3_MAX_BUFS + GC3_CMP_PTRS * rank_slot);
#endif
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
      // Most urgent first: the data a peer or another block waits for, then
      // the credit, which only matters once the sender's FIFO is full.
      if (threadIdx.x == 0) {
        if (flags & GC3_F_SEND) {
#if GC3_PROTO == GC3_PROTO_SIMPLE
          st_release_sys(data_out, sent + 1);
#endif
          bs.sent = sent + 1;
        }
        if (flags & GC3_F_SIGNAL) st_release_gpu(P.flags + blockIdx.x, progress_value(epoch, t, j));
        if (flags & GC3_F_RECV) {
          st_relaxed_sys(credit_out, recvd + 1);
          bs.recvd = recvd + 1;
        }
      }
    }
  }
}

// Every argument is fixed for a given (group, buffers, size), so a call can
// be replayed from a CUDA graph; the launch count lives in the block's row.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS, 1)
gc3_interpreter(const Plan* plan, int* rows, int row_words, const u64* bufs, int nbufs, const int* abort_word,
                i64 unit, i64 cs, int cpb, int T, int ntiles) {
  __shared__ __align__(16) int row[GC3_HOT_WORDS];
  __shared__ Plan sP;
  __shared__ u64 sbufs[GC3_MAX_BUFS];
  __shared__ BlockState bs;
#ifdef GC3_TRACE
  const u64 t_entry = global_ns();   // before the loads below; stored once P is known
#endif
  // Everything the block needs, loaded by all threads at once: one round
  // trip to memory, not a chain of dependent loads.
  int* grow = rows + (i64)blockIdx.x * row_words;
  for (int i = threadIdx.x; i < row_words / 4; i += blockDim.x)
    ((uint4*)row)[i] = ((const uint4*)grow)[i];
  for (int i = threadIdx.x; i < GC3_PLAN_WORDS; i += blockDim.x) ((u64*)&sP)[i] = ((const u64*)plan)[i];
  for (int i = threadIdx.x; i < nbufs; i += blockDim.x) sbufs[i] = bufs[i];
  if (threadIdx.x == 0) bs.stop = *(volatile const int*)abort_word;
  __syncthreads();
  const Plan& P = sP;
#ifdef GC3_TRACE
  if (threadIdx.x == 0 && P.trace) P.trace[(u64)blockIdx.x * GC3_TRACE_WORDS] = t_entry;
#endif
  if (bs.stop) return;
  const u64* q = (const u64*)row;
  if (threadIdx.x == 0) {
    bs.sent = q[GC3_BKQ_SENT];
    bs.recvd = q[GC3_BKQ_RECVD];
    bs.credit_seen = q[GC3_BKQ_CREDIT_SEEN];
    bs.epoch = (unsigned)(q[GC3_BKQ_EPOCH] + 1);
  }
  __syncthreads();
  TRACE_AT(P, 1);
  Shape sh;
  sh.unit = unit;
  sh.cs = cs;
  sh.cpb = cpb;
  sh.T = T;
  run_tb(P, row, sbufs, bufs, sh, ntiles, bs);
  __syncthreads();
  if (threadIdx.x == 0) {
    u64* gq = (u64*)grow;
    gq[GC3_BKQ_SENT] = bs.sent;
    gq[GC3_BKQ_RECVD] = bs.recvd;
    gq[GC3_BKQ_CREDIT_SEEN] = bs.credit_seen;
    gq[GC3_BKQ_EPOCH] = bs.epoch;
  }
  TRACE_AT(P, GC3_TRACE_WORDS - 1);
}
