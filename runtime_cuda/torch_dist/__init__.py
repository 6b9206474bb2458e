"""gc3 as a torch.distributed backend.

    import runtime_cuda.torch_dist as gc3_torch
    gc3_torch.register()
    dist.init_process_group(backend="cpu:gloo,cuda:gc3")   # torchrun or any store

CUDA tensors go to gc3 (runtime_cuda.nccl's communicator: gc3 where its catalog
has an algorithm, NCCL for the rest), CPU tensors to gloo.  An unchanged script
that asks for backend="nccl" runs on gc3 with GC3_TORCH=1 in the environment
(`hook.py`, run by the installed startup hook).  GC3_TORCH_FALLBACK=0 turns the
NCCL fallback off (calls gc3 cannot serve then raise); ranks that share one GPU
have no NCCL either way.  `GC3_DEBUG=INFO` says what served each call and why.

Importing this package does not import torch; `register()` does.
"""
from __future__ import annotations

from .names import NAME, enabled, swap_nccl


def register() -> None:
    """Register backend "gc3" for CUDA with torch.distributed (idempotent)."""
    import torch.distributed as dist

    from .process_group import create
    plugin = dist.Backend._plugins.get(NAME.upper()) if hasattr(dist.Backend, "_plugins") else None
    if plugin is not None and plugin.creator_fn is create:
        return
    dist.Backend.register_backend(NAME, create, devices=["cuda"])


__all__ = ["NAME", "enabled", "register", "swap_nccl"]
