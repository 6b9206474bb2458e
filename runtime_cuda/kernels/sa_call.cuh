// Which call a launch on the small kernels' scratch is: its number k, its LL
// flag and the parity region it writes (small_allreduce.cu's opening comment
// says why the count is kept per block and why k and k - 2 never share a flag).
// Every kernel on that scratch begins with sa_call_begin and ends with sa_call_end.
#pragma once
#include "common.cuh"

struct SaCall {
  u64 k;
  unsigned flag;
  u64 region;   // byte offset of the call's parity region in a rank's scratch
};

// Called by every thread of the block (one barrier inside).
__device__ __forceinline__ SaCall sa_call_begin(const u64* header, long long region_lines) {
  __shared__ u64 s_calls;
  if (threadIdx.x == 0) s_calls = header[GC3_SA_COUNTERS + blockIdx.x];
  __syncthreads();
  SaCall c;
  c.k = s_calls + 1;
  c.flag = (unsigned)(c.k % 0xffffffffull) + 1u;
  c.region = GC3_SA_HEADER_BYTES + (c.k & 1) * (u64)region_lines * 16;
  return c;
}

// Called by every thread of the block, a failed one too: the block's count
// advances once per launch whatever happened (after a failure the host refuses
// further calls), and block 0 also stores k into the counters of the blocks this
// launch left out, which no block of it reads, so that all grid_max counters hold
// the same count between calls and a larger grid next time agrees on k.
__device__ __forceinline__ void sa_call_end(u64* header, u64 k, int grid_max) {
  __syncthreads();
  if (threadIdx.x == 0) header[GC3_SA_COUNTERS + blockIdx.x] = k;
  if (blockIdx.x == 0)
    for (int b = gridDim.x + threadIdx.x; b < grid_max; b += blockDim.x) header[GC3_SA_COUNTERS + b] = k;
}
