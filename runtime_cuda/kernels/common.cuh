// Shared definitions of the gc3 interpreter kernel.
//
// The host (runtime_cuda/abi.py) parses the `#define GC3_*` lines below, so these
// numbers exist in one place only.  Every table the host builds is an array
// of 32-bit or 64-bit fields whose order is given by the GC3_*_ index defines.
#pragma once

typedef unsigned long long u64;
typedef long long i64;

// Opcodes of a device step (gc3.ir step types; nops are folded away on the host).
#define GC3_OP_S 1
#define GC3_OP_R 2
#define GC3_OP_RCS 3
#define GC3_OP_RRC 4
#define GC3_OP_RRS 5
#define GC3_OP_RRCS 6
#define GC3_OP_CPY 7
#define GC3_OP_RE 8
#define GC3_OP_GEMV 9        // compute steps of a fused="1" IR (prims_compute.cuh)
#define GC3_OP_EBAG 10

// Bits of a step descriptor's GC3_ST_FLAGS field.
#define GC3_F_RECV 1
#define GC3_F_SEND 2
#define GC3_F_REDUCE 4
#define GC3_F_SIGNAL 8     // another TB waits on this step: publish the TB's progress flag
#define GC3_F_EPILOGUE 16  // apply the call's epilogue to what the step stores into its dst (not what it sends)

// Buffer codes of operands.
#define GC3_BUF_NONE (-1)
#define GC3_BUF_I 0
#define GC3_BUF_O 1
#define GC3_BUF_S 2

// Element types and reduction ops, selected at compile time (-DGC3_DTYPE=.. -DGC3_REDOP=..).
#define GC3_DT_FLOAT16 1
#define GC3_DT_BFLOAT16 2
#define GC3_DT_FLOAT32 3
#define GC3_DT_FLOAT64 4
#define GC3_DT_INT32 5
#define GC3_DT_INT64 6
#define GC3_DT_UINT8 7
#define GC3_DT_INT8 8
#define GC3_DT_UINT32 9
#define GC3_DT_UINT64 10

#define GC3_RED_SUM 1
#define GC3_RED_PROD 2
#define GC3_RED_MAX 3
#define GC3_RED_MIN 4

#define GC3_PROTO_SIMPLE 1
#define GC3_PROTO_LL 2
#define GC3_PROTO_LL128 3

// What a timed-out wait was waiting for (ErrorRecord kind).
#define GC3_WAIT_DEP 1       // another TB of the same rank to finish a step
#define GC3_WAIT_DATA 2      // a Simple FIFO slot to be filled by the sender
#define GC3_WAIT_CREDIT 3    // a free FIFO slot (the receiver to consume one)
#define GC3_WAIT_LL 4        // an LL or LL128 line to carry the expected flag
#define GC3_WAIT_SLICE 5     // another block of the same rank to finish a split-K slice (GEMV)

// int32 fields of one TB descriptor (the host's table; block_rows.py turns
// it and the connection records into the rows the kernel reads).
#define GC3_TB_RANK_SLOT 0   // which entry of the per-call buffer table (3 pointers per rank)
#define GC3_TB_RANK 1
#define GC3_TB_ID 2
#define GC3_TB_STEP_START 3
#define GC3_TB_NSTEPS 4
#define GC3_TB_SEND 5        // index into the send-connection table, or -1
#define GC3_TB_RECV 6        // index into the recv-connection table, or -1
#define GC3_TB_CHAN 7
#define GC3_TB_NFIELDS 8

// int32 fields of one step descriptor.
#define GC3_ST_OP 0
#define GC3_ST_FLAGS 1
#define GC3_ST_CNT 2
#define GC3_ST_IN_BUF 3      // local input operand (gc3.ir.local_input)
#define GC3_ST_IN_OFF 4
#define GC3_ST_OUT_BUF 5     // local output operand (gc3.ir.local_output)
#define GC3_ST_OUT_OFF 6
#define GC3_ST_DEP_START 7   // into the dependency table: (block, step) pairs
#define GC3_ST_NDEPS 8
#define GC3_ST_EXTRA_START 9 // into the extra-source table: (buf, off) pairs of a fused `re`
#define GC3_ST_NEXTRA 10
#define GC3_ST_ORIG 11       // the step's index in the XML, for error messages
#define GC3_ST_NFIELDS 12

// A device step as the kernel reads it: the GC3_ST_* fields, then its first
// two waits inline (most steps have at most two, and an inline wait costs no
// extra dependent load); waits beyond those are GC3_ST_DEP_START + 2.. of P.deps.
#define GC3_DS_DEP0 12       // (block, device step) of wait 0, then wait 1
#define GC3_DS_INLINE_DEPS 2
#define GC3_DS_NFIELDS 16

// One row per block (runtime_cuda/block_rows.py), copied into shared memory
// by all threads at once when the block starts: everything a block needs
// before its first step arrives in one round trip to memory instead of a
// chain of dependent loads.  int32 fields first ...
#define GC3_BK_RANK_SLOT 0   // which entry of the per-call buffer table (3 pointers per rank)
#define GC3_BK_RANK 1
#define GC3_BK_TB 2
#define GC3_BK_NSTEPS 3
#define GC3_BK_NHOT 4        // steps held in the row; the rest are rows COLD_START.. of P.cold
#define GC3_BK_COLD_START 5
#define GC3_BK_SPEER 6       // -1: the TB sends to nobody
#define GC3_BK_SCHAN 7
#define GC3_BK_RPEER 8       // -1: the TB receives from nobody
#define GC3_BK_RCHAN 9
// ... then u64 fields, indexed in u64 units of the row: connection words
// (as GC3_CONN_*), and the block's running state, which only this block
// touches and stores back at exit.
#define GC3_BKQ_SFIFO 8      // slots of the send connection (receiver's memory)
#define GC3_BKQ_DATA_OUT 9   // its tail word (receiver's memory): slots filled
#define GC3_BKQ_CREDIT_IN 10 // its head word (own memory): slots the receiver consumed
#define GC3_BKQ_RFIFO 11     // slots of the receive connection (own memory)
#define GC3_BKQ_DATA_IN 12   // its tail word (own memory)
#define GC3_BKQ_CREDIT_OUT 13  // its head word (sender's memory)
#define GC3_BKQ_SENT 14      // slots sent so far on the send connection
#define GC3_BKQ_RECVD 15     // slots received so far on the receive connection
#define GC3_BKQ_EPOCH 16     // launches this block has run
#define GC3_BKQ_CREDIT_SEEN 17 // the last head value read: credits only grow, so sends that
                             // fit under it need not read the head again
#define GC3_BK_HEADER_WORDS 40
// Rows hold at most this many int32 words (the rest of a long TB's steps stay
// in P.cold); it is the size of the shared-memory copy.
#define GC3_HOT_WORDS 4096
// Per-call buffer table entries a launch can hold (3 per rank of the group).
#define GC3_MAX_BUFS 192
// A fused IR's call also passes each rank's compute inputs (gemv: x, w; ebag:
// tables, indices, offsets): GC3_CMP_PTRS addresses per rank slot, in the
// operator's input order, from entry GC3_MAX_BUFS of the same table on (read
// from global memory by compute steps only, so the shared copy stays small).
#define GC3_CMP_PTRS 4
// An epilogue IR's call (gc3.ir.epilogue; never also a compute IR) passes in the same place, per
// rank slot, the epilogue's GC3_CMP_PTRS words: the bias and residual addresses (0: none), the
// scale (a double's bits), and cols | nranks << 32 | items << 48, items being up to
// GC3_EPI_MAX_ITEMS item codes of 4 bits, the first in the lowest bits (0 ends the list).
#define GC3_EPW_BIAS 0
#define GC3_EPW_RESIDUAL 1
#define GC3_EPW_SCALE 2
#define GC3_EPW_SHAPE 3
#define GC3_EPI_SCALE 1
#define GC3_EPI_AVG 2
#define GC3_EPI_BIAS 3
#define GC3_EPI_RESIDUAL 4
#define GC3_EPI_MAX_ITEMS 4
// A compute step's operands, in the extras table from its GC3_ST_EXTRA_START
// (its GC3_ST_NEXTRA stays 0): pair 0 = [col0, col1) of the operator's split
// axis, pairs 1..3 = the operator's dimensions (gemv: batch, K, N; ebag: T,
// rows, dim, nnz, B), zero-padded.
#define GC3_CMP_EXTRA_PAIRS 4

// u64 fields of one connection record (send side and receive side alike);
// block_rows.py copies them into the rows of the blocks that own them.
#define GC3_CONN_FIFO 0      // slots, in the receiver's memory
#define GC3_CONN_TAIL 1      // slots filled so far (receiver's memory; sender writes)
#define GC3_CONN_HEAD 2      // slots consumed so far (sender's memory; receiver writes)
#define GC3_CONN_PEER 3
#define GC3_CONN_CHAN 4
#define GC3_CONN_NFIELDS 5

// int32 fields of the error record (one per launch group; the first failure wins).
#define GC3_ERR_SET 0
#define GC3_ERR_KIND 1
#define GC3_ERR_RANK 2
#define GC3_ERR_TB 3
#define GC3_ERR_STEP 4
#define GC3_ERR_TILE 5
#define GC3_ERR_A 6          // peer rank (data/credit/LL) or TB id waited on (dep)
#define GC3_ERR_B 7          // channel (data/credit/LL) or step waited on (dep)
#define GC3_ERR_SEEN_LO 8
#define GC3_ERR_SEEN_HI 9
#define GC3_ERR_WANT_LO 10
#define GC3_ERR_WANT_HI 11
#define GC3_ERR_OP 12
#define GC3_ERR_NFIELDS 16

// Timestamps per block in a GC3_TRACE build: entry, start of work, then
// (after waits, after data) per step of the first tiles, last: exit.
#define GC3_TRACE_WORDS 64

// The plan: device pointers and constants of one launch group, all 8-byte
// fields so that the host can write it as a plain uint64 array.
struct Plan {
  const int* cold;           // [ncold][GC3_DS_NFIELDS] steps that did not fit their block's row
  const int* deps;           // [ndeps][2]: (block waited on, its device step index)
  const int* extras;         // [nextra][2]: (buf, chunk offset)
  u64* flags;                // [nblocks] progress of each TB, see progress_value()
  int* err;                  // [GC3_ERR_NFIELDS]
  int* abort_local;          // set when any block gave up; every wait watches it
  const u64* abort_peers;    // int* of the other processes' abort words
  u64 n_abort_peers;
  u64 timeout_ns;
  u64 nslots;                // FIFO slots per connection
  u64 slot_bytes;            // bytes per slot (LL, LL128: bytes of lines)
  u64* trace;                // null, or [nblocks][GC3_TRACE_WORDS] timestamps (GC3_TRACE builds)
};
#define GC3_PLAN_WORDS 12

// Small-message allreduce kernels (small_allreduce.cu): each rank's scratch
// starts with a header of u64 words (abort word, error record, one call counter
// per block), then two parity regions of 16-byte LL lines.
#define GC3_SA_ABORT 0             // int32 abort word, as CONTROL_ABORT of the interpreter
#define GC3_SA_ERR 2               // GC3_ERR_NFIELDS int32s (8 u64 words)
#define GC3_SA_COUNTERS 16         // [GC3_SA_MAX_BLOCKS] calls each block has run
#define GC3_SA_MAX_BLOCKS 240
#define GC3_SA_HEADER_BYTES 4096
#define GC3_SA_ONESHOT 1
#define GC3_SA_TWOSHOT 2
#define GC3_SA_ALLGATHER 3         // the one-shot forms of allgather and reducescatter
#define GC3_SA_REDUCESCATTER 4
#define GC3_SA_ONESHOT128 5         // the same four on LL128 lines
#define GC3_SA_TWOSHOT128 6
#define GC3_SA_ALLGATHER128 7
#define GC3_SA_REDUCESCATTER128 8
// GEMV + AllReduce (gemv_allreduce.cu) on the same scratch: a tile's partial
// (batch rows x its columns) sits in shared memory, at most this many elements.
#define GC3_GV_TILE_LANES 4096
// Ranks one process launches together (virtual ranks), whose x, w and out
// addresses travel in the launch's parameters.
#define GC3_GV_MAX_LOCAL 8
// Split-K batches (at most this many rows): each rank's workspace starts with one
// u64 per item (slice of a column tile: the number of the call whose partial of
// it is in place), then the slices' fp32 partials.
#define GC3_GV_SPLIT_MAX_BATCH 8
#define GC3_GV_DONE_BYTES 65536
// fp32 accumulators a split-K thread holds (batch bucket x tile columns it owns), and
// the weight bytes it loads before using any.
#ifndef GC3_GV_SPLIT_ACC
#define GC3_GV_SPLIT_ACC 64
#endif
// 16-bit types: split-K slices of up to this many rows on CUDA-core FMAs, of more on
// tensor cores, where one mma feeds a weight element to 8 rows for the price of one:
// the FMAs' cost per weight byte grows with the rows, and from 3 rows they fell
// behind the weight's bandwidth.
#ifndef GC3_GV_SPLIT_FMA_ROWS
#define GC3_GV_SPLIT_FMA_ROWS 2
#endif
// The rows form of those CUDA-core slices (gemv_allreduce.cu's rows_item): weight rows (one
// 16-byte vector each) a thread has in flight, and the fewest rows of K a slice takes (the
// host's split plan).
#ifndef GC3_GV_ROWS_INFLIGHT
#define GC3_GV_ROWS_INFLIGHT 16
#endif
#define GC3_GV_ROWS_MIN 16
// Columns one warp owns in a tensor-core slice (4 m-tiles of 16): a tile is one per warp.
#define GC3_GV_MMA_COLS 64
#ifndef GC3_GV_SPLIT_INFLIGHT
#define GC3_GV_SPLIT_INFLIGHT 128
#endif
// Weight bytes a marked launch (programmatic dependent launch) prefetches into L2 over
// its whole grid before it waits for the kernel ahead: a third of an H100's L2, so the
// rows it brings stay there until they are read.
#ifndef GC3_GV_PDL_PREFETCH_BYTES
#define GC3_GV_PDL_PREFETCH_BYTES (16 << 20)
#endif
// Iterations of rows ahead a split-K thread prefetches into L2 (0: none): one measured best on
// H100 (scripts/bench_gemv_splitk.py), more thrashed L2 at the largest K.
#ifndef GC3_GV_SPLIT_PREFETCH
#define GC3_GV_SPLIT_PREFETCH 1
#endif
