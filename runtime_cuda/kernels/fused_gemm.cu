// The fused GEMM pipeline's small kernels (runtime_cuda/fused/gemm_signal.py, gemm.py): flags a
// stream releases and waits for, device timestamps, a spin for tests, and the rank-order sum of
// the partial products.

__device__ __forceinline__ unsigned long long gc3_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void gc3_flag_release(unsigned* flag, unsigned value) {
    // Work earlier on this stream is complete (kernel boundary); make it
    // visible system-wide before the flag says so.
    __threadfence_system();
    atomicExch_system(flag, value);
}

extern "C" __global__ void gc3_flag_wait(const unsigned* flag, unsigned value, unsigned long long timeout_ns,
                                         int* failed, int ident) {
    const unsigned long long start = gc3_now_ns();
    while ((int)(*(volatile const unsigned*)flag - value) < 0) {
        if (*(volatile int*)failed != 0) return;   // an earlier wait failed: drain, do not wait
        if (gc3_now_ns() - start > timeout_ns) {
            atomicCAS_system(failed, 0, ident);
            return;
        }
        __nanosleep(200);
    }
    __threadfence_system();   // later reads of the chunk come after the flag
}

extern "C" __global__ void gc3_stamp(unsigned long long* slot) {
    *(volatile unsigned long long*)slot = gc3_now_ns();
}

extern "C" __global__ void gc3_spin_ns(unsigned long long ns) {
    const unsigned long long start = gc3_now_ns();
    while (gc3_now_ns() - start < ns) __nanosleep(1000);
}

// Partials come in as fp32 (in_kind 0) or in the input's 16-bit type (in_kind 1 bf16, 2 fp16),
// and are summed in fp32 either way.
__device__ __forceinline__ float gc3_part(const void* parts, unsigned long long j, int in_kind) {
    if (in_kind == 0) return ((const float*)parts)[j];
    const unsigned short h = ((const unsigned short*)parts)[j];
    if (in_kind == 1) return __uint_as_float(((unsigned)h) << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

extern "C" __global__ void gc3_sum_round(const void* parts, unsigned long long stride, int nparts,
                                         unsigned long long count, void* out, int kind, int in_kind) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        float s = gc3_part(parts, i, in_kind);
        for (int p = 1; p < nparts; ++p) s += gc3_part(parts, p * stride + i, in_kind);
        if (kind == 0) {
            ((float*)out)[i] = s;
        } else {
            unsigned short h;
            if (kind == 1) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(s));
            else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(s));
            ((unsigned short*)out)[i] = h;
        }
    }
}
