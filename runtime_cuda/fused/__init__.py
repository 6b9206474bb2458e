"""Compute-fused collectives on CuPy arrays (issue 16): each chunk is sent as soon as a compute
step of the same gc3 program has produced it.  See memory_bound.py."""
from .memory_bound import VirtualComm, check, embedding_bag_alltoall, gemv_allreduce

__all__ = ["VirtualComm", "check", "gemv_allreduce", "embedding_bag_alltoall"]
