"""The interpreter's gemv opcode (kernels/prims_compute.cuh gemv_tile) alone in a kernel of its own:
block j computes lanes [lane0, lane0 + n) of chunk j, y[:, j*per:(j+1)*per] row-major, as a fused
program's compute step does for a tile of that chunk -- the same device code, without the plan,
flags and collective around it.  For the opcode's micro-benchmark (scripts/bench_gemv_opcode.py)
and its GPU tests (tests/test_gemv_opcode_gpu.py), where tails, tile ranges and batch sizes are
picked freely."""
from __future__ import annotations

import functools
from typing import Mapping, Optional, Tuple

from ..core import module
from .memory_bound import storage, value_dtype

_KERNEL = "gc3_gemv_opcode"  # kernels/gemv_opcode.cu


@functools.lru_cache(maxsize=None)
def _kernel(dtype: str, device: int, tune: Tuple[Tuple[str, int], ...]):
    import cupy

    mod = cupy.RawModule(code=module.source("gemv_opcode.cu"),
                         options=module.options(dtype, "sum", "Simple", compute=True, tune=dict(tune)))
    return mod.get_function(_KERNEL)


def gemv_chunks(x, w, chunks: int, out=None, lane0: int = 0, n: Optional[int] = None, threads: int = module.MAX_THREADS,
                stream=None, tune: Optional[Mapping[str, int]] = None):
    """y = x @ w by the opcode, laid out as a fused gemv program's buffer: out [chunks, batch, N/chunks],
    out[j] = y[:, j*N/chunks:(j+1)*N/chunks]; only lanes [lane0, lane0 + n) of each chunk are written
    (n defaults to the rest of the chunk).  x [batch, K], w [K, N]: C-contiguous CuPy arrays of one
    value type (uint16: bfloat16).  `threads` per block: 128, 256 or 512, the sizes a launch group
    picks.  `tune`: gemv tunables of this build ({macro: value}, module.GEMV_TUNABLES; over the
    environment's, over prims_compute.cuh's defaults).  Queued on `stream` (default: the current
    one); returns out."""
    import cupy

    for a, what in ((x, "x"), (w, "w")):
        if not hasattr(a, "__cuda_array_interface__") or a.ndim != 2 or not a.flags.c_contiguous:
            raise ValueError(f"gemv_chunks: {what}: expected a C-contiguous 2-D CuPy array, got "
                             f"{type(a).__name__} {getattr(a, 'shape', '')}")
    dtype = value_dtype(x, "gemv_chunks: x")
    if w.dtype != x.dtype or x.shape[1] != w.shape[0]:
        raise ValueError(f"gemv_chunks: x {x.shape} {x.dtype} and w {w.shape} {w.dtype} do not multiply "
                         f"(x [batch, K], w [K, N], one dtype)")
    (batch, k), n_out = x.shape, w.shape[1]
    if chunks < 1 or n_out % chunks:
        raise ValueError(f"gemv_chunks: chunks={chunks} must divide N={n_out}")
    tuning = module.gemv_tuning(tune)   # refuses a bad tunable before anything is allocated
    if threads not in (128, 256, 512):
        raise ValueError(f"gemv_chunks: threads={threads}; a launch group runs 128, 256 or 512")
    per = n_out // chunks
    n = batch * per - lane0 if n is None else n
    if lane0 < 0 or n < 0 or lane0 + n > batch * per:
        raise ValueError(f"gemv_chunks: lanes [{lane0}, {lane0 + n}) are outside a chunk of {batch} x {per}")
    if out is None:
        out = cupy.zeros((chunks, batch, per), dtype=storage(dtype))
    if out.shape != (chunks, batch, per) or out.dtype != storage(dtype) or not out.flags.c_contiguous:
        raise ValueError(f"gemv_chunks: out is {out.shape} {out.dtype}, expected C-contiguous "
                         f"{(chunks, batch, per)} {storage(dtype)}")
    st = stream if stream is not None else cupy.cuda.get_current_stream()
    with st:
        _kernel(dtype, cupy.cuda.Device().id, tuning)(
            (chunks,), (threads,), (x, w, cupy.int32(batch), cupy.int32(k), cupy.int32(n_out), cupy.int32(per),
                                    out, cupy.int64(lane0), cupy.int32(n)))
    return out


def unchunk(out):
    """y [batch, N] from a gemv_chunks result [chunks, batch, N/chunks]."""
    chunks, batch, per = out.shape
    return out.transpose(1, 0, 2).reshape(batch, chunks * per)


__all__ = ["gemv_chunks", "unchunk"]
