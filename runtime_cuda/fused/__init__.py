"""Compute fused with collectives on CuPy arrays."""
from .gemm import all_gather_gemm, gemm_all_reduce, gemm_all_to_all, gemm_reduce_scatter
from .gemm_signal import release_backend, wait_backend
from .groups import IpcGemmGroup, VirtualGemmGroup

__all__ = ["all_gather_gemm", "gemm_all_reduce", "gemm_all_to_all", "gemm_reduce_scatter", "release_backend",
           "wait_backend", "IpcGemmGroup", "VirtualGemmGroup"]
