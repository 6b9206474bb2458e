"""cuda.bindings' driver module, for the calls CuPy does not wrap: stream memory
operations (cuStreamWaitValue32, cuStreamWriteValue32), launches with attributes, and copies
between raw addresses on a raw stream.

cuda-bindings is optional: every user of this module has a path without it.  On a
machine without a GPU it may import (it arrives with torch's wheels) and fail at its
first call; `driver()` answers None there too.  Stream memory operations need nothing
more than the module: since CUDA 11.7 every device takes them.
"""
from __future__ import annotations

import functools

# CU_STREAM_WAIT_VALUE_GEQ: wait until (int32)(*addr - value) >= 0, a cyclic comparison,
# so a 32-bit count may wrap as long as a waiter is never 2**31 behind.
WAIT_GEQ = 0


@functools.lru_cache(maxsize=None)
def driver(min_version: int = 0):
    """cuda.bindings' driver module where it imports and finds a CUDA driver of at least
    `min_version` (e.g. 12030 for CUDA 12.3), else None."""
    try:
        from cuda.bindings import driver as cb
        err, version = cb.cuDriverGetVersion()
    except Exception:   # absent, a build that does not match the installed driver, or no libcuda
        return None
    return cb if err == cb.CUresult.CUDA_SUCCESS and version >= min_version else None


def check(result, what: str) -> None:
    """Raise if a cuda.bindings call's result (its status, or a tuple led by it) is not success."""
    cb = driver()
    err = result[0] if isinstance(result, tuple) else result
    if err != cb.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def wait_value32(stream: int, address: int, value: int) -> None:
    """Queue on `stream`: hold until the 32-bit word at `address` reaches `value` (cyclically)."""
    cb = driver()
    check(cb.cuStreamWaitValue32(cb.CUstream(stream), cb.CUdeviceptr(address), value & 0xFFFFFFFF, WAIT_GEQ),
          "cuStreamWaitValue32")


def write_value32(stream: int, address: int, value: int) -> None:
    """Queue on `stream`: the 32-bit word at `address` := `value`, after the work queued before."""
    cb = driver()
    check(cb.cuStreamWriteValue32(cb.CUstream(stream), cb.CUdeviceptr(address), value & 0xFFFFFFFF, 0),
          "cuStreamWriteValue32")


def copy(stream: int, dst: int, src: int, nbytes: int) -> None:
    """Queue on `stream`: copy `nbytes` from `src` to `dst` (unified addresses: a peer's mapped
    buffer goes by the copy engine over the link)."""
    cb = driver()
    check(cb.cuMemcpyAsync(cb.CUdeviceptr(dst), cb.CUdeviceptr(src), nbytes, cb.CUstream(stream)), "cuMemcpyAsync")


def new_stream() -> int:
    """A stream of its own on the current context (non-blocking), never one shared from a pool:
    a stream that waits on a value must not be the stream the value's writer runs on."""
    cb = driver()
    err, stream = cb.cuStreamCreate(cb.CUstream_flags.CU_STREAM_NON_BLOCKING)
    check(err, "cuStreamCreate")
    return int(stream)
