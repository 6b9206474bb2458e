"""Fused algorithms: a collective and the compute that produces or consumes its chunks (GEMM,
GEMV, embedding-bag, an epilogue) as one program; `runtime_cuda.fused` runs them on GPUs."""
