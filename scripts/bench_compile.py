#!/usr/bin/env python3
"""Compile speed, gc3 against msccl-tools: gc3.benchmarks.compile_speed (its docstring says what
is timed).

    python3 scripts/bench_compile.py [--repeat N] [--check]
"""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from gc3.benchmarks.compile_speed import main

    sys.exit(main())
