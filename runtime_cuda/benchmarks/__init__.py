"""Benchmarks whose logic the tests check on the CPU: host time per call, the training loop,
the runtime sweep, the fused operators' compute and GEMM pipelines, and their plots.  The
scripts under scripts/ are thin wrappers that call each module's main(); `gc3 bench` is the
user's benchmark (runtime_cuda.commands.bench)."""
