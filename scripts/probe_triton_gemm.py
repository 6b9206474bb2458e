"""Is the tile-store GEMM as fast as cuBLAS? (dev tooling)

    python scripts/probe_triton_gemm.py [--quick]

runtime_cuda/torch_dist/tile_store.py's kernel (a persistent Triton GEMM, TMA loads) on one
GPU as a group of one rank (every tile its own, stored into one C), bf16, CUDA-event medians
(triton.testing.do_bench), against torch.matmul (cuBLAS), at several tile configurations
(BM, BN, BK, stages, warps).
Shapes: the per-rank GEMMs of `gc3 bench --fused`'s grid at 4 GPUs.  Each result is checked
against cuBLAS's first.  (measured/probe_triton_gemm_1xH100_2026-11-27.txt came from this
script's first version, at commit 21e1a1d: the same loop in a kernel of its own, which also
tried warp specialization and stored its scatter by pointer; it also timed the scatter into 4
local buffers.)
"""
from __future__ import annotations

import sys

import torch
import triton
from triton.testing import do_bench

from runtime_cuda.torch_dist import tile_store

SMS = torch.cuda.get_device_properties(0).multi_processor_count
# (BM, BN, BK, stages, warps); the first is tile_store's.
CONFIGS = [(tile_store.BM, tile_store.BN, tile_store.BK, tile_store.STAGES, tile_store.WARPS),
           (128, 128, 64, 4, 8), (128, 128, 64, 5, 4), (256, 128, 64, 3, 8), (128, 128, 128, 3, 8)]


def launch(A, B, C, cfg):
    """tile_store's kernel computing A @ B into C, as the only rank of a group."""
    BM, BN, BK, stages, warps = cfg
    M, K = A.shape
    N = B.shape[1]
    # Every entry of the address table is C: a group of one reads none but the failure word,
    # which stays 0.
    fail = torch.zeros(1, dtype=torch.int32, device=A.device)
    table = torch.tensor([C.data_ptr()] * 9 + [fail.data_ptr()], dtype=torch.int64, device=A.device)
    grid = (min(SMS, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)
    cnt = torch.zeros(grid[0], dtype=torch.int32, device=A.device)
    gemm = tile_store.kernels()["gemm_exchange"]
    return lambda: gemm[grid](A, B, C, table, cnt, M, N, K, M, 0, 0, 10 ** 9, 0, DT=tile_store._dt(A.dtype), G=1,
                              OP=tile_store.OPS.index("gemm_a2a"), BM=BM, BN=BN, BK=BK, GROUP_M=tile_store.GROUP_M,
                              num_stages=stages, num_warps=warps)


def shapes(quick):
    G = 4
    out = [("gemm_rs", M, K // G, N) for K, N in ((14336, 4096), (28672, 8192), (53248, 16384))
           for M in ((2048, 8192) if quick else (1024, 2048, 4096, 8192, 16384))]
    out += [("gemm_ar", M, 28672 // G, 8192) for M in (1024, 4096, 8192)]
    out += [("ag_gemm", M, 8192, 28672 // G) for M in (2048, 8192)]
    return out + [("gemm_a2a", 8192, 4096, 4096)]


def timed(fn, C, ref):
    """(us, or None where the result is wrong) of fn."""
    C.fill_(float("nan"))
    fn()
    got = C.float()
    err = ((got - ref).norm() / ref.norm()).item()
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3 if err < 2e-2 else None


def main():
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    tile_store._ensure_allocator()
    print(f"# {torch.cuda.get_device_name(0)}, {SMS} SMs, triton {triton.__version__}, torch {torch.__version__}; "
          "us, do_bench medians; ratio = cuBLAS / Triton", flush=True)
    for op, M, K, N in shapes(quick):
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        ref = (A @ B).float()
        t_cublas = do_bench(lambda: A @ B, warmup=25, rep=100, return_mode="median") * 1e3
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        results, best = [], None
        for cfg in CONFIGS:
            try:
                t = timed(launch(A, B, C, cfg), C, ref)
            except Exception as exc:   # a configuration this GPU or Triton refuses (shared memory)
                results.append(f"{cfg}: {type(exc).__name__}")
                continue
            results.append(f"{cfg}: {'wrong' if t is None else f'{t:.1f}'}")
            if t is not None and (best is None or t < best[0]):
                best = (t, cfg)
        line = f"{op:8} M={M:5} K={K:5} N={N:5} cublas {t_cublas:8.1f}"
        if best:
            line += f" | triton best {best[0]:8.1f} {best[1]} ratio {t_cublas / best[0]:.3f}"
        print(line, flush=True)
        print("    " + " ; ".join(results), flush=True)


if __name__ == "__main__":
    main()
