#!/usr/bin/env python3
"""A training-style loop of in-place allreduces, gc3's drop-in against NCCL:
runtime_cuda.benchmarks.train_loop (its docstring says what is run and checked).

    mpirun -np N python scripts/bench_train_loop.py [--steps 200] [--gc3-only] [--no-nccl]
"""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from runtime_cuda.benchmarks.train_loop import main

    sys.exit(main())
