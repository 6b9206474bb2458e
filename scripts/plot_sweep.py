"""busbw and ratio to NCCL vs size, per collective, drawn from bench_runtime.py logs: the
code and its usage are in runtime_cuda.benchmarks.plot_sweep (run from the repository root
with PYTHONPATH=$PWD, or with gc3 installed)."""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from runtime_cuda.benchmarks.plot_sweep import main

    sys.exit(main())
