// Elementwise epilogues on finished values (gc3/ir/epilogue.py states each item's
// meaning; this header is its device side).  Compiled per dtype like the interpreter.
#pragma once
#include "reduce_ops.cuh"

#if GC3_DTYPE == GC3_DT_FLOAT16 || GC3_DTYPE == GC3_DT_BFLOAT16 || GC3_DTYPE == GC3_DT_FLOAT32 || \
    GC3_DTYPE == GC3_DT_FLOAT64
#define GC3_IS_FLOAT 1
#endif

// NCCL's ncclAvg on a finished, wrapped sum: floats multiply by 1/n in the
// accumulation type, integers divide truncating toward zero (C division, as
// NCCL's FuncSumPostDiv: |x| / n with the sign restored).  Integers divide in
// 64 bits, signed or unsigned as elem_t is: n itself may not fit a narrow
// elem_t (an int8 with 128 ranks), and the quotient always fits elem_t.
__device__ __forceinline__ elem_t avg_divide(elem_t x, int n) {
#ifdef GC3_IS_FLOAT
  return from_acc(to_acc(x) * ((acc_t)1 / (acc_t)n));
#else
  if ((elem_t)-1 < (elem_t)0) return (elem_t)((i64)x / (i64)n);
  return (elem_t)((u64)x / (u64)n);
#endif
}

// The call's epilogue as one store of a step applies it (the GC3_EPW_* words,
// kernels/common.cuh), or none (`on` false); `at` is the output element index
// of the stored operand's first lane, set per chunk.  Passed by value, not by
// pointer, so that it stays in registers.
struct Epi {
  bool on;
  const elem_t* bias;
  const elem_t* residual;
  double scale;
  i64 at;
  int cols;
  int nranks;
  unsigned items;
};

__device__ __forceinline__ Epi no_epi() {
  Epi e = {};
  return e;
}

__device__ __forceinline__ Epi load_epi(const u64* w) {
  Epi e;
  e.on = true;
  e.bias = (const elem_t*)w[GC3_EPW_BIAS];
  e.residual = (const elem_t*)w[GC3_EPW_RESIDUAL];
  e.scale = __longlong_as_double((long long)w[GC3_EPW_SCALE]);
  const u64 shape = w[GC3_EPW_SHAPE];
  e.cols = (int)(shape & 0xffffffffu);
  e.nranks = (int)((shape >> 32) & 0xffffu);
  e.items = (unsigned)(shape >> 48);
  e.at = 0;
  return e;
}

// One element: y the reduced value, e its output index, col = e % cols
// (kept by the caller: a 64-bit modulo per element is a long subroutine).
// Arithmetic in acc_t, left unrounded for the caller's one rounding; avg rounds
// as gc3.ir.epilogue.apply does (to the dtype, then NCCL's division).  The host
// refuses scale, bias and residual on integer data, as the CPU side does.
__device__ __forceinline__ acc_t epi_acc(const Epi& E, acc_t y, i64 e, int col) {
  for (int i = 0; i < GC3_EPI_MAX_ITEMS; ++i) {
    const unsigned item = (E.items >> (4 * i)) & 15u;
    if (item == 0) break;
    if (item == GC3_EPI_AVG) y = to_acc(avg_divide(from_acc(y), E.nranks));
#ifdef GC3_IS_FLOAT
    else if (item == GC3_EPI_SCALE) y = y * (acc_t)E.scale;
    else if (item == GC3_EPI_BIAS) y = y + to_acc(E.bias[col]);
    else if (item == GC3_EPI_RESIDUAL) y = y + to_acc(E.residual[e]);
#endif
  }
  return y;
}

// x the stored (raw) value, rounded once to elem_t after the epilogue.
__device__ __forceinline__ elem_t epi_apply(const Epi& E, elem_t x, i64 e, int col) {
  return from_acc(epi_acc(E, to_acc(x), e, col));
}

// The type a build stores its results in: elem_t, or with -DGC3_OUT_DTYPE another float
// type (the small kernels' epilogue build, small_allreduce.cu: fp32 partial sums stored
// as bf16), rounded once from acc_t so that a cast costs no second rounding.
#if !defined(GC3_OUT_DTYPE) || GC3_OUT_DTYPE == GC3_DTYPE
typedef elem_t out_t;
__device__ __forceinline__ out_t to_out(acc_t y) { return from_acc(y); }
#elif GC3_OUT_DTYPE == GC3_DT_BFLOAT16
typedef unsigned short out_t;
__device__ __forceinline__ out_t to_out(acc_t y) { return f32_to_bf16((float)y); }
#elif GC3_OUT_DTYPE == GC3_DT_FLOAT16
typedef unsigned short out_t;
__device__ __forceinline__ out_t to_out(acc_t y) { return f32_to_f16((float)y); }
#elif GC3_OUT_DTYPE == GC3_DT_FLOAT32
typedef float out_t;
__device__ __forceinline__ out_t to_out(acc_t y) { return (float)y; }
#else
#error "GC3_OUT_DTYPE: an epilogue stores float16, bfloat16, float32 or the input's type"
#endif
