// Element type x reduction op, chosen at compile time, and the packed
// (8- or 16-byte) granules that every data path moves.
#pragma once
#include "common.cuh"

#ifndef GC3_DTYPE
#define GC3_DTYPE GC3_DT_FLOAT32
#endif
#ifndef GC3_REDOP
#define GC3_REDOP GC3_RED_SUM
#endif

// elem_t is the storage type, acc_t the type arithmetic happens in.  Half
// types compute in float and round once per binary op, as numpy/ml_dtypes do.
// fp32 to the 16-bit float types, rounded to nearest even; defined for every build
// because an epilogue may store a type other than the one it reduces (epilogue.cuh, out_t).
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                   // round to nearest even
  return (unsigned short)(u >> 16);
}

#if GC3_DTYPE == GC3_DT_FLOAT16
typedef unsigned short elem_t;
typedef float acc_t;
__device__ __forceinline__ acc_t to_acc(elem_t x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}
__device__ __forceinline__ elem_t from_acc(acc_t f) { return f32_to_f16(f); }
#elif GC3_DTYPE == GC3_DT_BFLOAT16
typedef unsigned short elem_t;
typedef float acc_t;
__device__ __forceinline__ acc_t to_acc(elem_t x) { return __uint_as_float(((unsigned)x) << 16); }
__device__ __forceinline__ elem_t from_acc(acc_t f) { return f32_to_bf16(f); }
#else
#if GC3_DTYPE == GC3_DT_FLOAT32
typedef float elem_t;
#elif GC3_DTYPE == GC3_DT_FLOAT64
typedef double elem_t;
#elif GC3_DTYPE == GC3_DT_INT32
typedef int elem_t;
#elif GC3_DTYPE == GC3_DT_INT64
typedef long long elem_t;
#elif GC3_DTYPE == GC3_DT_UINT8
typedef unsigned char elem_t;
#elif GC3_DTYPE == GC3_DT_INT8
typedef signed char elem_t;
#elif GC3_DTYPE == GC3_DT_UINT32
typedef unsigned int elem_t;
#elif GC3_DTYPE == GC3_DT_UINT64
typedef unsigned long long elem_t;
#else
#error "unknown GC3_DTYPE"
#endif
typedef elem_t acc_t;
__device__ __forceinline__ acc_t to_acc(elem_t x) { return x; }
__device__ __forceinline__ elem_t from_acc(acc_t x) { return x; }
#endif

// Integer sums and products wrap like numpy's; do them unsigned to stay
// clear of signed-overflow UB.  Narrow types promote to int before the
// operation, where an unsigned char product (255 * 255) already overflows int,
// so they too go through unsigned; the result is truncated to the width.
__device__ __forceinline__ float add_(float a, float b) { return a + b; }
__device__ __forceinline__ double add_(double a, double b) { return a + b; }
__device__ __forceinline__ int add_(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
__device__ __forceinline__ long long add_(long long a, long long b) { return (long long)((u64)a + (u64)b); }
__device__ __forceinline__ unsigned char add_(unsigned char a, unsigned char b) {
  return (unsigned char)((unsigned)a + (unsigned)b);
}
__device__ __forceinline__ signed char add_(signed char a, signed char b) {
  return (signed char)(unsigned char)((unsigned)a + (unsigned)b);
}
__device__ __forceinline__ unsigned add_(unsigned a, unsigned b) { return a + b; }
__device__ __forceinline__ u64 add_(u64 a, u64 b) { return a + b; }
__device__ __forceinline__ float mul_(float a, float b) { return a * b; }
__device__ __forceinline__ double mul_(double a, double b) { return a * b; }
__device__ __forceinline__ int mul_(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
__device__ __forceinline__ long long mul_(long long a, long long b) { return (long long)((u64)a * (u64)b); }
__device__ __forceinline__ unsigned char mul_(unsigned char a, unsigned char b) {
  return (unsigned char)((unsigned)a * (unsigned)b);
}
__device__ __forceinline__ signed char mul_(signed char a, signed char b) {
  return (signed char)(unsigned char)((unsigned)a * (unsigned)b);
}
__device__ __forceinline__ unsigned mul_(unsigned a, unsigned b) { return a * b; }
__device__ __forceinline__ u64 mul_(u64 a, u64 b) { return a * b; }

// numpy.maximum/minimum propagate NaN from either side (x != x only for NaN).
__device__ __forceinline__ acc_t red(acc_t a, acc_t b) {
#if GC3_REDOP == GC3_RED_SUM
  return add_(a, b);
#elif GC3_REDOP == GC3_RED_PROD
  return mul_(a, b);
#elif GC3_REDOP == GC3_RED_MAX
  return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
#elif GC3_REDOP == GC3_RED_MIN
  return (a != a) ? a : ((b != b) ? b : (a < b ? a : b));
#else
#error "unknown GC3_REDOP"
#endif
}

template <int B> struct RawOf;
template <> struct RawOf<4> { typedef unsigned type; };
template <> struct RawOf<8> { typedef uint2 type; };
template <> struct RawOf<16> { typedef uint4 type; };

// B bytes of consecutive elements, moved as one vector.
template <int B>
union Pack {
  static constexpr int N = B / (int)sizeof(elem_t);
  typename RawOf<B>::type raw;
  elem_t e[B / sizeof(elem_t)];
};

template <int B>
__device__ __forceinline__ void reduce_into(Pack<B>& acc, const Pack<B>& x) {
#pragma unroll
  for (int k = 0; k < Pack<B>::N; ++k) acc.e[k] = from_acc(red(to_acc(acc.e[k]), to_acc(x.e[k])));
}
