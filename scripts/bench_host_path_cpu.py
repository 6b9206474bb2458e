"""The drop-in's Python per-call path on the CPU, with the GPU stubbed out: the code and
its usage are in runtime_cuda.benchmarks.host_path_cpu (run from the repository root with
PYTHONPATH=$PWD, or with gc3 installed)."""
import os
import sys

if __name__ == "__main__":
    # Run by path from a checkout: the package is the script's parent folder.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from runtime_cuda.benchmarks.host_path_cpu import main

    sys.exit(main())
