// Elementwise epilogues on finished values (gc3/ir/epilogue.py states each item's
// meaning; this header is its device side).  Compiled per dtype like the interpreter.
#pragma once
#include "reduce_ops.cuh"

// NCCL's ncclAvg on a finished, wrapped sum: floats multiply by 1/n in the
// accumulation type, integers divide truncating toward zero (C division, as
// NCCL's FuncSumPostDiv: |x| / n with the sign restored).
__device__ __forceinline__ elem_t avg_divide(elem_t x, int n) {
#if GC3_DTYPE == GC3_DT_FLOAT16 || GC3_DTYPE == GC3_DT_BFLOAT16 || GC3_DTYPE == GC3_DT_FLOAT32 || \
    GC3_DTYPE == GC3_DT_FLOAT64
  return from_acc(to_acc(x) * ((acc_t)1 / (acc_t)n));
#else
  return (elem_t)(x / (elem_t)n);
#endif
}
