// GEMV + AllReduce in one launch (a row-parallel linear layer at decode):
// y = sum over ranks r of x_r [batch, K] @ w_r [K, N], the same bits on every
// rank (runtime_cuda/fused/gemv_kernel.py is the host side).
//
// The weight is the whole cost, so every SM reads a share of it: block b owns
// column tiles b, b + grid, ... of `tw` columns and all batch rows, computes
// each with the interpreter's gemv passes (prims_compute.cuh: 16-byte weight
// loads, fp32 accumulation, tensor cores from batch 2), and puts the tile's
// partial into slot `me` of every rank's scratch (its own too) on the
// epoch-tagged LL lines of small_allreduce.cu, whose comment says how a call
// knows its number and flag from the per-block counters and why a parity
// region is never overwritten while a peer still reads it (every call reads a
// line from every peer).  The same block then reduces its tiles: every rank
// sums the n partials of a line in rank order 0..n-1 in fp32 and rounds once,
// so the ranks agree bit for bit and the only rounding before the sum is the
// one each rank's partial gets, as a matmul's output does before NCCL sums it.
//
// A block waits only on the lines its namesakes on the other ranks put, after
// putting its own: with the grid resident at once (the host's bound), every
// wait ends.  Nothing is cleared and nothing is synchronised on the host, so
// the launch can sit in a CUDA graph: a replay is a new call.
#include "prims_ll.cuh"
#include "sa_call.cuh"
#include "prims_compute.cuh"

#ifndef GC3_HAS_COMPUTE
#error "gemv_allreduce.cu is built as a compute build (-DGC3_COMPUTE) of a float type"
#endif

namespace gv {

constexpr int LANES = 8 / (int)sizeof(elem_t);   // elements of one LL line's 8 data bytes

// LL lines of one tile's slot: tiles sit at fixed offsets (the widest tile's lines).
__device__ __forceinline__ u64 tile_lines(int batch, int tw) { return ((u64)batch * tw + LANES - 1) / LANES; }

}  // namespace gv

// x, w and out of each local rank, by value: a call uploads nothing.
struct GvIO {
  u64 p[3 * GC3_GV_MAX_LOCAL];
};

// grid (blocks per rank, local ranks); blockIdx.y = local slot, rank rank0 + slot.
// peers: [nlocal][nranks] scratch bases as this process addresses them.
// io: x, w and out of each local rank for this call.  tw: columns per tile
// (batch * tw <= GC3_GV_TILE_LANES); max_lines, region_lines, grid_max: as
// gc3_small_allreduce's.
extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS)
gc3_gemv_allreduce(const Plan* plan, const u64* peers, const GvIO io, int nranks, int rank0, int batch, int K,
                   int N, int tw, long long max_lines, long long region_lines, int grid_max) {
  const Plan P = *plan;
  const int slot = blockIdx.y;
  const int me = rank0 + slot;
  const u64* base = peers + (u64)slot * nranks;
  u64* header = (u64*)base[me];
  const elem_t* x = (const elem_t*)io.p[3 * slot];
  const elem_t* w = (const elem_t*)io.p[3 * slot + 1];
  elem_t* out = (elem_t*)io.p[3 * slot + 2];

  __shared__ __align__(16) elem_t tile[GC3_GV_TILE_LANES];
  const SaCall call = sa_call_begin(header, region_lines);
  const u64 k = call.k;
  const unsigned flag = call.flag;
  const u64 region = call.region;
  auto lines_of = [&](int r) { return (uint4*)(base[r] + region); };
  const int tiles = (N + tw - 1) / tw;
  const u64 per_tile = gv::tile_lines(batch, tw);

  for (int j = blockIdx.x; j < tiles; j += gridDim.x) {
    const int c0 = j * tw, width = min(tw, N - c0);
    const int n = batch * width;
    // The tile's partial, row-major [batch][width]; gemv_store's closing barrier publishes it.
    gemv_tile(x, w, batch, K, N, c0, width, tile, 0, n);
    const u64 L = ((u64)n + gv::LANES - 1) / gv::LANES;
    const u64 at = (u64)me * max_lines + (u64)j * per_tile;
    for (u64 g = threadIdx.x; g < L; g += blockDim.x) {
      Pack<8> v;
      v.raw = make_uint2(0, 0);
#pragma unroll
      for (int e = 0; e < gv::LANES; ++e)
        if (g * gv::LANES + e < (u64)n) v.e[e] = tile[g * gv::LANES + e];
      for (int p = 0; p < nranks; ++p) st_volatile_v4(lines_of(p) + at + g, make_uint4(v.raw.x, flag, v.raw.y, flag));
    }
    __syncthreads();   // the next tile's passes overwrite `tile`
  }

  const uint4* mine = lines_of(me);
  bool ok = true;
  for (int j = blockIdx.x; ok && j < tiles; j += gridDim.x) {
    const int c0 = j * tw, width = min(tw, N - c0);
    const int n = batch * width;
    const u64 L = ((u64)n + gv::LANES - 1) / gv::LANES;
    for (u64 g = threadIdx.x; ok && g < L; g += blockDim.x) {
      float acc[gv::LANES];
      const u64 line = (u64)j * per_tile + g;
      for (int p = 0; p < nranks; ++p) {
        Pack<8> v;
        const Where wh{me, (int)blockIdx.x, 5, (int)line, 0};
        if (!ll_read(P, wh, p, 0, mine + (u64)p * max_lines + line, flag, v.raw)) {
          ok = false;
          break;
        }
#pragma unroll
        for (int e = 0; e < gv::LANES; ++e) acc[e] = p == 0 ? cmp_f32(v.e[e]) : acc[e] + cmp_f32(v.e[e]);
      }
      if (!ok) break;
#pragma unroll
      for (int e = 0; e < gv::LANES; ++e) {
        const int l = (int)(g * gv::LANES) + e;
        if (l < n) {
          const int r = l / width;
          out[(i64)r * N + c0 + (l - r * width)] = from_acc(acc[e]);
        }
      }
    }
  }
  // Every thread ends here, a failed one too.
  sa_call_end(header, k, grid_max);
}
