// The second pass of an avg call served by a sum program (runtime_cuda/avg.py):
// y[i] = avg_divide(y[i], n) over the output, on the call's stream.
#include "epilogue.cuh"

extern "C" __global__ void gc3_avg_divide(elem_t* y, i64 count, int n) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) y[i] = avg_divide(y[i], n);
}
