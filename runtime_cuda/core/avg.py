"""NCCL's avg op on the GPU for a call a sum program served: the second pass
y = avg_divide(y, nranks) over the output (kernels/epilogue.cuh; the rule, NCCL's
ncclAvg, is stated in gc3/ir/epilogue.py), launched on the call's stream so it
orders after the collective like any later work."""
from __future__ import annotations

import functools

from . import abi, streams
from .module import source

_THREADS = 256
_MAX_BLOCKS = 1024


@functools.lru_cache(maxsize=None)
def _kernel(dtype: str, device: int):
    import cupy

    mod = cupy.RawModule(code=source("avg_pass.cu"), options=("-std=c++17", f"-DGC3_DTYPE={abi.DTYPE[dtype]}"))
    return mod.get_function("gc3_avg_divide")


def divide(ptr: int, count: int, dtype: str, nranks: int, stream: int) -> None:
    """Divide `count` elements of `dtype` at device pointer `ptr` by `nranks`, NCCL's way."""
    import cupy
    import numpy as np

    if dtype not in abi.DTYPE:
        raise ValueError(f"avg: no kernel for dtype {dtype!r} (have {', '.join(abi.DTYPE)})")
    if nranks < 1:
        raise ValueError(f"avg: nranks must be >= 1, got {nranks}")
    if count <= 0 or nranks == 1:
        return
    blocks = min(_MAX_BLOCKS, (count + _THREADS - 1) // _THREADS)
    dev = cupy.cuda.Device().id
    with streams.current(cupy.cuda.ExternalStream(stream)):
        _kernel(dtype, dev)((blocks,), (_THREADS,), (np.uint64(ptr), np.int64(count), np.int32(nranks)))
