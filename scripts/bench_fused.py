"""Benchmark of the memory-bound fused operators (GEMV+AllReduce, embedding-bag+AllToAll) against
the sequential baselines: a wrapper of runtime_cuda.benchmarks.fused_memory_bound, where the code
and its usage are (`python3 scripts/bench_fused.py --help`)."""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from runtime_cuda.benchmarks.fused_memory_bound import main

    sys.exit(main())
