// Embedding-bag pooling + AllToAll in one launch (table-wise sharded embeddings:
// each rank pools its T tables' bags for the global batch of n * b samples, and
// rank q receives the pooled rows of its b samples from every rank;
// runtime_cuda/fused/ebag_kernel.py is the host side).
//
// Block j of every rank owns the same rows [r0, r1) of each destination's b
// samples (the host gives every rank the same grid).  For each destination q it
// pools those rows of its tables (prims_compute.cuh's ebag_tile, every SM busy)
// and stores them straight into q's staging slot for this rank over NVLink, its
// own rows straight into `out`; after a system fence it stores the call number
// into q's flag for (this rank, block j).  Then it waits for every peer's flag
// for block j and copies that peer's rows from its own staging into `out`.
//
// Staging has two parity regions.  A peer writes region k % 2 again in call
// k + 2 only after its block j saw this rank's flag of call k + 1, which this
// rank's block j stores after the whole launch of call k has finished (stream
// order), so no row is overwritten while it is being copied out.  The call number
// lives on the device (sa_call.cuh) and nothing is cleared, so a captured launch
// replays as a new call.  A block waits only on its namesakes on the other ranks
// after storing its own rows: with the grid resident at once (the host's bound),
// every wait ends.
#include "prims_ll.cuh"
#include "sa_call.cuh"
#include "prims_compute.cuh"

#ifndef GC3_HAS_COMPUTE
#error "ebag_alltoall.cu is built as a compute build (-DGC3_COMPUTE) of a float type"
#endif

// tables, indices, offsets and out of each local rank, and its indices' width (nnz):
// by value, so a call uploads nothing.
struct EbIO {
  u64 p[4 * GC3_GV_MAX_LOCAL];
  int nnz[GC3_GV_MAX_LOCAL];
};

// grid (blocks per rank, local ranks); blockIdx.y = local slot, rank rank0 + slot.
// peers: [nlocal][nranks] scratch bases as this process addresses them; a rank's
// flags ([nranks][GC3_SA_MAX_BLOCKS] u64, then the bad-input claim word) start at
// byte flags_off of its scratch and its staging (two parity regions of nranks
// slots of slot_bytes) at data_off.  bad: the host's bad-input record.
// region_lines, grid_max: as gc3_small_allreduce's.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)
    gc3_ebag_alltoall(const Plan* plan, const u64* peers, const EbIO io, int nranks, int rank0, int T, int rows,
                      int dim, int b, long long flags_off, long long data_off, long long slot_bytes, int* bad,
                      long long region_lines, int grid_max) {
  const Plan P = *plan;
  const int slot = blockIdx.y;
  const int me = rank0 + slot;
  const u64* base = peers + (u64)slot * nranks;
  u64* header = (u64*)base[me];
  const elem_t* tables = (const elem_t*)io.p[4 * slot];
  const int* idx = (const int*)io.p[4 * slot + 1];
  const int* off = (const int*)io.p[4 * slot + 2];
  elem_t* out = (elem_t*)io.p[4 * slot + 3];
  const SaCall call = sa_call_begin(header, region_lines);
  const u64 k = call.k;

  auto flags = [&](int r) { return (u64*)(base[r] + flags_off); };
  auto slot_of = [&](int r, int from) {
    return (elem_t*)(base[r] + data_off + ((k & 1) * nranks + from) * (u64)slot_bytes);
  };
  const EbagBad e{bad, (int*)(flags(me) + (u64)nranks * GC3_SA_MAX_BLOCKS), me};
  const i64 row = (i64)T * dim;
  const int per = (b + gridDim.x - 1) / gridDim.x;
  const int r0 = min(b, (int)blockIdx.x * per), r1 = min(b, r0 + per);
  const int n = (int)((r1 - r0) * row);

  for (int i = 1; i <= nranks; ++i) {
    const int q = (me + i) % nranks;   // this rank's own rows last, straight into out
    elem_t* dst = q == me ? out + ((i64)me * b + r0) * row : slot_of(q, me) + (i64)r0 * row;
    ebag_tile(tables, idx, off, T, rows, dim, io.nnz[slot], nranks * b, (i64)q * b + r0, dst, 0, n, e);
    if (q == me) break;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) st_release_sys(flags(q) + (u64)me * GC3_SA_MAX_BLOCKS + blockIdx.x, k);
  }

  __shared__ int s_ok;
  for (int i = 1; i < nranks; ++i) {
    const int p = (me + nranks - i) % nranks;
    if (threadIdx.x == 0) {
      u64 seen;
      const Where wh{me, (int)blockIdx.x, 6, r0, 0};
      s_ok = wait_geq<true, true>(P, flags(me) + (u64)p * GC3_SA_MAX_BLOCKS + blockIdx.x, k, wh, GC3_WAIT_DATA, p,
                                  0, seen);
    }
    __syncthreads();
    if (!s_ok) break;
    // Rows of T*dim elements are 16-byte multiples and both bases 16-byte aligned (the host's refusal).
    const uint4* src = (const uint4*)(slot_of(me, p) + (i64)r0 * row);
    uint4* dst = (uint4*)(out + ((i64)p * b + r0) * row);
    const i64 vecs = (i64)n * sizeof(elem_t) / 16;
    for (i64 g = threadIdx.x; g < vecs; g += blockDim.x) dst[g] = __ldcg(src + g);
    __syncthreads();   // s_ok is rewritten for the next peer
  }
  // Every thread ends here, a failed one too.
  sa_call_end(header, k, grid_max);
}
