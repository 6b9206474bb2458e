"""Benchmark of the GEMM fusions (runtime_cuda/fused/gemm.py) against one cuBLAS call and the
sequential path: a wrapper of runtime_cuda.benchmarks.fused_gemm, where the code and its usage
are (`python scripts/bench_fused_gemm.py --help`)."""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from runtime_cuda.benchmarks.fused_gemm import main

    sys.exit(main())
