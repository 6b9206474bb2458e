#!/usr/bin/env python3
"""gc3's CUDA runtime against NCCL, every candidate program per collective and size, one
process per GPU: runtime_cuda.benchmarks.runtime_sweep (its docstring says what is timed and
checked).

    mpirun --allow-run-as-root -np 2 python3 scripts/bench_runtime.py [--max 1GiB] [--out table.txt]
"""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from runtime_cuda.benchmarks.runtime_sweep import main

    sys.exit(main())
