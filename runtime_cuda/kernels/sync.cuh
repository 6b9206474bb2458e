// Cross-TB and cross-GPU signalling: ordered loads/stores, bounded spins, and
// the error record that turns a stuck wait into a host-side exception.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 ld_acquire_gpu(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// Relaxed loads for spinning: an acquire load also invalidates the SM's L1
// (CCTL.IVALL), which would evict every other warp's cached tables on each
// poll; waits acquire once, after the value is there.
__device__ __forceinline__ u64 ld_relaxed_sys(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 ld_relaxed_gpu(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
// Returning FIFO credits needs no release: the receiver's loads of the slot
// have returned (their values were stored before the block barrier), so a
// later overwrite by the sender cannot reach them.
__device__ __forceinline__ void st_relaxed_sys(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(u64* p, u64 v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_volatile_v4(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile_v4(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// Programmatic dependent launch (sm_90 and up).  A launch the host marks
// (core/launcher.py, pdl_launch) may start while the kernel before it on the
// stream still runs, so a marked kernel passes grid_dependency_wait before it
// touches any memory: that returns once the previous grid has finished and its
// writes are visible, as plain stream order would have it.  allow_next_grid
// lets the next marked launch start (its blocks then sit in their own wait);
// it changes no ordering.  Both are no-ops for an unmarked launch.
__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A TB's progress flag after finishing device step `j` of tile `t` in launch
// `epoch`.  Ordered lexicographically by (epoch, tile, step), so a waiter's
// ">=" test works across tiles and launches and nothing is ever reset.
// The host keeps tiles < 2^21 and steps < 2^11.
__device__ __forceinline__ u64 progress_value(unsigned epoch, int tile, int step) {
  return ((u64)epoch << 32) | ((u64)tile << 11) | (u64)(step + 1);
}

// Where a block is, for the error record.
struct Where {
  int rank, tb, step, tile, op;
};

__device__ __forceinline__ bool aborted(const Plan& P) {
  return *(volatile int*)P.abort_local != 0;
}

// First failure wins the record; every block (and the peers' blocks, through
// their abort words) stops at its next wait.
__device__ void record_failure(const Plan& P, const Where& w, int kind, int a, int b, u64 seen, u64 want) {
  int* e = P.err;
  if (atomicCAS(e + GC3_ERR_SET, 0, -1) == 0) {
    e[GC3_ERR_KIND] = kind;
    e[GC3_ERR_RANK] = w.rank;
    e[GC3_ERR_TB] = w.tb;
    e[GC3_ERR_STEP] = w.step;
    e[GC3_ERR_TILE] = w.tile;
    e[GC3_ERR_A] = a;
    e[GC3_ERR_B] = b;
    e[GC3_ERR_SEEN_LO] = (int)(seen & 0xffffffffu);
    e[GC3_ERR_SEEN_HI] = (int)(seen >> 32);
    e[GC3_ERR_WANT_LO] = (int)(want & 0xffffffffu);
    e[GC3_ERR_WANT_HI] = (int)(want >> 32);
    e[GC3_ERR_OP] = w.op;
    __threadfence_system();
    atomicExch(e + GC3_ERR_SET, 1);
  }
  atomicExch(P.abort_local, 1);
  for (u64 k = 0; k < P.n_abort_peers; ++k) {
    int* peer = (int*)P.abort_peers[k];
    asm volatile("st.relaxed.sys.global.s32 [%0], %1;" :: "l"(peer), "r"(1) : "memory");
  }
  __threadfence_system();
}

// Spins until *p >= want; `seen` gets the value that satisfied it.  Returns
// false when the wait timed out (recorded) or another block gave up first.
// The counters only grow, so with ACQ the acquiring load after the relaxed
// polls reads a value >= want and synchronises with the store that made it
// so.  Without ACQ (FIFO credits: the sender only overwrites a slot after
// the wait, and stores are never performed ahead of the branch that guards
// them) the relaxed load is enough and the SM's L1 is left alone.
template <bool SYS, bool ACQ>
__device__ bool wait_geq(const Plan& P, const u64* p, u64 want, const Where& w, int kind, int a, int b, u64& seen) {
  u64 v = ACQ ? (SYS ? ld_acquire_sys(p) : ld_acquire_gpu(p)) : (SYS ? ld_relaxed_sys(p) : ld_relaxed_gpu(p));
  if (v >= want) {
    seen = v;
    return true;
  }
  const u64 t0 = global_ns();
  for (unsigned spins = 1;; ++spins) {
    v = SYS ? ld_relaxed_sys(p) : ld_relaxed_gpu(p);
    if (v >= want) break;
    if ((spins & 63) == 0) {
      if (aborted(P)) return false;
      if (global_ns() - t0 > P.timeout_ns) {
        record_failure(P, w, kind, a, b, v, want);
        return false;
      }
    }
  }
  if (ACQ) {
    if (SYS) ld_acquire_sys(p); else ld_acquire_gpu(p);
  }
  seen = v;
  return true;
}
