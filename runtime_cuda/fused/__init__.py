"""Compute fused with collectives on CuPy arrays: each chunk leaves as soon as it exists.
memory_bound.py: GEMV+AllReduce and embedding-bag+AllToAll as compute steps of a gc3 program;
epilogue.py: AllReduce + scale/bias/residual applied as each chunk is stored; gemm.py: the GEMM
fusions, cuBLAS chunks releasing flags that transfers wait on."""
from .epilogue import allreduce_epilogue
from .gemm import all_gather_gemm, gemm_all_reduce, gemm_all_to_all, gemm_reduce_scatter
from .gemm_signal import release_backend, wait_backend
from .groups import IpcGemmGroup, VirtualGemmGroup
from .memory_bound import VirtualComm, check, embedding_bag_alltoall, gemv_allreduce

__all__ = ["all_gather_gemm", "gemm_all_reduce", "gemm_all_to_all", "gemm_reduce_scatter", "release_backend",
           "wait_backend", "IpcGemmGroup", "VirtualGemmGroup",
           "VirtualComm", "check", "gemv_allreduce", "embedding_bag_alltoall", "allreduce_epilogue"]
