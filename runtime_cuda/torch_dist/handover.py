"""How a torch call hands its tensors to gc3's CuPy side: the GEMM operators' fused paths that
map buffers between the ranks (copy_engine.py, tile_store.py) share these."""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch


def cupy_view(t: torch.Tensor):
    """A zero-copy CuPy view of a contiguous CUDA tensor (bfloat16 as uint16 bits,
    which is how runtime_cuda.fused reads bfloat16)."""
    import cupy

    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)


@contextlib.contextmanager
def fused_call(pg, tensors: Sequence[torch.Tensor], what: str):
    """Builds the group's communicator if this is its first CUDA call (every rank
    is here), selects the tensors' GPU, and makes torch's current stream CuPy's
    too (DLPack's hand-over then orders nothing extra); yields that stream's handle
    (named so as not to read as `with stream:`, which tests/test_dropin_streams.py bans)."""
    import cupy

    from runtime_cuda.core import streams

    pg._cuda(list(tensors), what)
    ptr = torch.cuda.current_stream(pg._device).cuda_stream
    with cupy.cuda.Device(pg._device.index), streams.current(streams.wrap(ptr)):
        yield ptr


def ipc_group(pg):
    """The group's ranks as runtime_cuda.fused.IpcGemmGroup (buffers mapped between them per
    shape), built on its first use over the communicator's rendezvous (collectively)."""
    got = pg.__dict__.get("_gc3_copy_engine")
    if got is None:
        from runtime_cuda.fused import IpcGemmGroup
        from runtime_cuda.fused.memory_bound import exchange_of

        got = pg.__dict__["_gc3_copy_engine"] = IpcGemmGroup(exchange_of(pg._comm))
    return got
