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


def wait_value32(stream, address, value: int) -> None:
    """Queue on `stream`: hold until the 32-bit word at `address` reaches `value` (cyclically).
    `stream` may be one new_stream made and `address` one pointers made (a call then builds
    nothing)."""
    cb = driver()
    check(cb.cuStreamWaitValue32(_stream(stream), _pointer(address), value & 0xFFFFFFFF, WAIT_GEQ),
          "cuStreamWaitValue32")


def write_value32(stream, address, value: int) -> None:
    """Queue on `stream`: the 32-bit word at `address` := `value`, after the work queued before;
    arguments as wait_value32's."""
    cb = driver()
    check(cb.cuStreamWriteValue32(_stream(stream), _pointer(address), value & 0xFFFFFFFF, 0),
          "cuStreamWriteValue32")


def copy(stream, dst, src, nbytes: int) -> None:
    """Queue on `stream`: copy `nbytes` from `src` to `dst` (unified addresses: a peer's mapped
    buffer goes by the copy engine over the link); arguments as wait_value32's."""
    cb = driver()
    check(cb.cuMemcpyAsync(_pointer(dst), _pointer(src), nbytes, _stream(stream)), "cuMemcpyAsync")


def pointers(*addresses: int) -> tuple:
    """The driver's form of these addresses, to pass to calls made many times."""
    cb = driver()
    return tuple(cb.CUdeviceptr(a) for a in addresses)


def _pointer(address):
    cb = driver()
    return address if isinstance(address, cb.CUdeviceptr) else cb.CUdeviceptr(address)


def _stream(stream):
    cb = driver()
    return stream if isinstance(stream, cb.CUstream) else cb.CUstream(stream)


def new_event():
    """An event without timing, to order one stream after another's work (record, then
    wait_event), made once and recorded again for each call."""
    cb = driver()
    err, event = cb.cuEventCreate(cb.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    check(err, "cuEventCreate")
    return event


def join(stream, event, after) -> None:
    """`stream` waits for what `after` holds now, through `event`."""
    cb = driver()
    check(cb.cuEventRecord(event, _stream(after)), "cuEventRecord")
    check(cb.cuStreamWaitEvent(_stream(stream), event, 0), "cuStreamWaitEvent")


def graph(origin, enqueue):
    """An instantiated CUDA graph of what `enqueue()` queues from `origin` (and on streams it
    forks from `origin` with events and joins back), captured by this thread alone: one
    graph_launch then replays it for a single driver call.  Raises where the driver cannot
    capture what `enqueue` queues; nothing stays captured then."""
    cb = driver()
    origin = _stream(origin)
    check(cb.cuStreamBeginCapture(origin, cb.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
          "cuStreamBeginCapture")
    try:
        enqueue()
    except BaseException:
        err, captured = cb.cuStreamEndCapture(origin)
        if err == cb.CUresult.CUDA_SUCCESS and captured:
            cb.cuGraphDestroy(captured)
        raise
    err, captured = cb.cuStreamEndCapture(origin)
    check(err, "cuStreamEndCapture")
    try:
        err, made = getattr(cb, "cuGraphInstantiateWithFlags", cb.cuGraphInstantiate)(captured, 0)
        check(err, "cuGraphInstantiate")
    finally:
        cb.cuGraphDestroy(captured)
    return made


def graph_launch(made, stream) -> None:
    """Queue on `stream` a graph that `graph` made."""
    cb = driver()
    check(cb.cuGraphLaunch(made, _stream(stream)), "cuGraphLaunch")


def destroy(*objects) -> None:
    """Give back streams (after their work), events and instantiated graphs that this module
    made; errors are ignored (a context already torn down has taken them with it)."""
    try:
        cb = driver()
        for obj in objects if cb is not None else ():
            if isinstance(obj, cb.CUstream):
                cb.cuStreamSynchronize(obj)
                cb.cuStreamDestroy(obj)
            elif isinstance(obj, cb.CUevent):
                cb.cuEventDestroy(obj)
            elif isinstance(obj, cb.CUgraphExec):
                cb.cuGraphExecDestroy(obj)
    except Exception:   # interpreter or context teardown
        pass


def new_stream():
    """A stream of its own on the current context (non-blocking), never one shared from a pool:
    a stream that waits on a value must not be the stream the value's writer runs on."""
    cb = driver()
    err, stream = cb.cuStreamCreate(cb.CUstream_flags.CU_STREAM_NON_BLOCKING)
    check(err, "cuStreamCreate")
    return stream
