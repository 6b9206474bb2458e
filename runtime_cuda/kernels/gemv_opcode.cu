// The interpreter's gemv opcode alone in a kernel of its own (runtime_cuda/fused/gemv_opcode.py):
// block j computes lanes [lane0, lane0 + n) of chunk j, for the opcode's micro-benchmark and tests.
#include "prims_compute.cuh"

extern "C" __global__ void __launch_bounds__(GC3_MAX_THREADS, 1)
gc3_gemv_opcode(const elem_t* x, const elem_t* w, int batch, int K, int N, int per, elem_t* y, long long lane0, int n) {
  const i64 col0 = (i64)blockIdx.x * per;
  gemv_tile(x, w, batch, K, N, col0, per, y + col0 * batch + lane0, lane0, n);
}
