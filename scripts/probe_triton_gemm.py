"""Would owning the GEMM pay? (dev tooling)

    python scripts/probe_triton_gemm.py [--quick]

The overlap pipeline keeps cuBLAS and moves each chunk's collective beside it, and on
these GPUs that loses: the exchange takes SMs or bandwidth from a GEMM that already fills
the chip (docs/history.md).  A GEMM of our own could instead store each finished output
tile straight into the peer that needs it (a reduce-scatter's or all-to-all's rows), so
the transfer rides on the GEMM's epilogue and no second kernel competes.  That only pays
if such a GEMM is as fast as cuBLAS.  This times, on one GPU, bf16, CUDA-event medians
(triton.testing.do_bench):
  - torch.matmul (cuBLAS);
  - a persistent Triton GEMM with TMA loads, several tile configurations, stored by TMA;
  - the same GEMM with the best configuration, each tile stored by pointer into one of G
    buffers chosen by its rows (the scatter a reduce-scatter needs; local buffers here).
Shapes: the per-rank GEMMs of `gc3 bench --fused`'s grid at 4 GPUs.
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _gemm(a_desc, b_desc, c_desc, dst, M, N, K, rows_per,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
          NUM_SMS: tl.constexpr, SCATTER: tl.constexpr, WS: tl.constexpr):
    start = tl.program_id(0)
    pm = tl.cdiv(M, BM)
    pn = tl.cdiv(N, BN)
    kt = tl.cdiv(K, BK)
    for t in tl.range(start, pm * pn, NUM_SMS, flatten=True, warp_specialize=WS):
        # Grouped order: GROUP_M row blocks share the B columns they read while those are in L2.
        group = GROUP_M * pn
        first = (t // group) * GROUP_M
        gsz = tl.minimum(pm - first, GROUP_M)
        pid_m = first + (t % group) % gsz
        pid_n = (t % group) // gsz
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), tl.float32)
        for ki in range(kt):
            a = a_desc.load([off_m, ki * BK])
            b = b_desc.load([ki * BK, off_n])
            acc = tl.dot(a, b, acc)
        c = acc.to(tl.bfloat16)
        if SCATTER:
            d = off_m // rows_per
            base = tl.load(dst + d).to(tl.pointer_type(tl.bfloat16))
            rm = (off_m - d * rows_per) + tl.arange(0, BM)
            rn = off_n + tl.arange(0, BN)
            tl.store(base + rm[:, None].to(tl.int64) * N + rn[None, :], c, mask=(rn < N)[None, :])
        else:
            c_desc.store([off_m, off_n], c)


SMS = torch.cuda.get_device_properties(0).multi_processor_count
# (BM, BN, BK, stages, warps, WS)
CONFIGS = [(128, 256, 64, 3, 8, False), (128, 256, 64, 4, 8, False), (128, 128, 64, 4, 8, False),
           (128, 128, 64, 5, 4, False), (256, 128, 64, 3, 8, False), (128, 256, 64, 3, 8, True),
           (128, 128, 64, 4, 8, True), (128, 128, 128, 3, 8, False)]


def launch(A, B, C, dst, rows_per, cfg, scatter):
    BM, BN, BK, stages, warps, ws = cfg
    M, K = A.shape
    N = B.shape[1]
    a = TensorDescriptor.from_tensor(A, [BM, BK])
    b = TensorDescriptor.from_tensor(B, [BK, BN])
    c = TensorDescriptor.from_tensor(C, [BM, BN])
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    grid = (min(SMS, tiles),)
    return lambda: _gemm[grid](a, b, c, dst, M, N, K, rows_per, BM=BM, BN=BN, BK=BK, GROUP_M=8, NUM_SMS=SMS,
                               SCATTER=scatter, WS=ws, num_stages=stages, num_warps=warps)


def shapes(quick):
    out = []
    G = 4
    for K, N in ((14336, 4096), (28672, 8192), (53248, 16384)):
        for M in ((2048, 8192) if quick else (1024, 2048, 4096, 8192, 16384)):
            out.append(("gemm_rs", M, K // G, N))
    for M in (1024, 4096, 8192):
        out.append(("gemm_ar", M, 28672 // G, 8192))
    for M in (2048, 8192):
        out.append(("ag_gemm", M, 8192, 28672 // G))
    out.append(("gemm_a2a", 8192, 4096, 4096))
    return out


def main():
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name(0)}, {SMS} SMs, triton {triton.__version__}, torch {torch.__version__}; "
          "us, do_bench medians; ratio = cuBLAS / Triton", flush=True)
    G = 4
    for op, M, K, N in shapes(quick):
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = A @ B
        t_cublas = do_bench(lambda: A @ B, warmup=25, rep=100, return_mode="median") * 1e3
        best, results = None, []
        dummy = torch.zeros(1, dtype=torch.int64, device="cuda")
        for cfg in CONFIGS:
            try:
                fn = launch(A, B, C, dummy, M, cfg, False)
                C.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = ((C.float() - ref.float()).norm() / ref.float().norm()).item()
                if not err < 2e-2:
                    results.append(f"{cfg}: wrong ({err:.2e})")
                    continue
                t = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            except Exception as e:  # a configuration this GPU or Triton refuses
                results.append(f"{cfg}: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}")
                continue
            results.append(f"{cfg}: {t:.1f}")
            if best is None or t < best[0]:
                best = (t, cfg)
        line = f"{op:8} M={M:5} K={K:5} N={N:5} cublas {t_cublas:8.1f}"
        if best:
            rows_per = M // G
            bufs = [torch.empty(rows_per, N, device="cuda", dtype=torch.bfloat16) for _ in range(G)]
            table = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device="cuda")
            t_sc = None
            if rows_per % best[1][0] == 0:
                fn = launch(A, B, C, table, rows_per, best[1], True)
                fn()
                torch.cuda.synchronize()
                err = ((torch.cat(bufs).float() - ref.float()).norm() / ref.float().norm()).item()
                t_sc = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3 if err < 2e-2 else float("nan")
            line += (f" | triton best {best[0]:8.1f} {best[1]} ratio {t_cublas / best[0]:.3f}"
                     f" | scatter {t_sc if t_sc is None else round(t_sc, 1)}"
                     f" ratio {'n/a' if not t_sc else round(t_cublas / t_sc, 3)}")
        print(line, flush=True)
        print("    " + " ; ".join(results), flush=True)


if __name__ == "__main__":
    main()
