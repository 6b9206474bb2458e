"""AllReduce with an elementwise epilogue on CuPy arrays, fused or sequential:
y = sum over ranks of x_r, then y * scale + bias + residual on every rank, stored as out_dtype.

*Fused*, up to gc3.limits.SMALL_ALLREDUCE_MAX_BYTES of x: one launch of the small-message
allreduce kernels' epilogue build (kernels/small_allreduce.cu, runtime_cuda/ranks/small_allreduce.py):
the n contributions summed in rank order in fp32, the epilogue applied in fp32 where each rank
stores its result, rounded once to out_dtype, the same bits on every rank (given the same bias
and residual).  Its group, scratch sized for that limit, is built on the first such call of a
communicator (collectively: every rank makes the same calls) and serves every later one; a call
is one driver launch, capturable in a CUDA graph.  Above the limit: the communicator's allReduce
into out (or into a buffer of x's type, for a cast), then one elementwise pass applying the
epilogue (kernels/small_allreduce.cu, gc3_epilogue_pass).  Nothing synchronises with the host.

*Sequential*: the communicator's AllReduce, then one fp32 CuPy pass.  Ranks, types, `path` and
GC3_FUSED as in memory_bound.py (VirtualComm: every array argument a list, one per rank).
"""
from __future__ import annotations

import functools
import math
from typing import List, Optional, Sequence

from gc3 import limits
from gc3.dtypes import dtype_info
from gc3.errors import GC3Error

from ..core import streams
from .memory_bound import (VirtualComm, _allreduce, _check_array, _path, _ranks, _where, exchange_of, from_f32,
                           group_of, not_capturing, settle, storage, to_f32, value_dtype)

SMALL_MAX_BYTES = limits.SMALL_ALLREDUCE_MAX_BYTES
_GROUP_KEY = ("small_allreduce_epilogue",)


def _items(scale, has_bias: bool, has_residual: bool) -> tuple:
    """The epilogue's item names, in the order the call states it: y * scale + bias + residual."""
    items = []
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ValueError(f"allreduce_epilogue: scale must be a finite number, got {scale!r}")
        items.append("scale")
    items += ["bias"] if has_bias else []
    items += ["residual"] if has_residual else []
    if not items:
        raise ValueError("allreduce_epilogue: no epilogue: give scale, bias or residual (a plain AllReduce is the "
                         "communicator's allReduce)")
    return tuple(items)


def _overlaps(a, b) -> bool:
    lo_a, lo_b = a.data.ptr, b.data.ptr
    return lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes


# --- the fused path on raw addresses (also runtime_cuda/torch_dist/ops.py's) ------------------------
def fits_kernel(count: int, dtype: str) -> bool:
    """Whether the small kernels serve a call of `count` elements of `dtype` (else: allReduce + pass)."""
    return count * dtype_info(dtype).np.itemsize <= SMALL_MAX_BYTES


@functools.lru_cache(maxsize=None)
def _twoshot_from(nranks: int) -> int:
    """The smallest power-of-two size at which the cost model (gc3/simulator/small_allreduce.py, calibrated
    on the measured 2x H200 kernels) puts two-shot ahead of one-shot, else above the kernels' limit:
    at 2 ranks two-shot moves as much as one-shot in one more hop and never wins; at 8 it wins from
    64 KiB (runtime_cuda/README.md's 8-rank table)."""
    from gc3.simulator.cost_config import preset
    from gc3.simulator.small_allreduce import small_allreduce_seconds

    cfg, nbytes = preset(), 1 << 10
    while nbytes <= SMALL_MAX_BYTES:
        if small_allreduce_seconds("twoshot", nbytes, nranks, cfg) < small_allreduce_seconds("oneshot", nbytes,
                                                                                             nranks, cfg):
            return nbytes
        nbytes <<= 1
    return SMALL_MAX_BYTES + 1


def kernel_kind(nbytes: int, nranks: int) -> str:
    """The small kernel a call of `nbytes` per rank runs."""
    return "twoshot" if nbytes >= _twoshot_from(nranks) else "oneshot"


def _make_small(comm):
    from ..ranks.small_allreduce import SmallAllreduce

    if isinstance(comm, VirtualComm):
        return lambda: SmallAllreduce.virtual(comm.nranks, max_bytes=SMALL_MAX_BYTES)
    return lambda: SmallAllreduce.ipc(exchange_of(comm), device=comm.device_id(), max_bytes=SMALL_MAX_BYTES)


def small_group(comm):
    """The small kernels' group of `comm` for epilogue calls (group_of: built on its first use,
    collectively); its scratch serves calls up to SMALL_MAX_BYTES.  Raises where it cannot be."""
    group, why = group_of(comm, _GROUP_KEY, _make_small(comm))
    if why:
        raise GC3Error(why)
    return group


def refusal(comm, path: str, count: int, dtype: str, nranks: int, what: str, capturing=not_capturing) -> str:
    """'' where the fused path serves this call (its group built where it needs one, unless
    capturing() says the call is being captured: IN_CAPTURE), else why not (logged at INFO);
    raises GC3Error where `path` is "fused" and it cannot."""
    from ..ranks.small_allreduce import EPILOGUE_DTYPES

    why = ("path=sequential" if path == "sequential" else "a single rank: nothing to reduce" if nranks < 2
           else "an empty x" if count == 0
           else f"{dtype} (the fused kernels take {', '.join(EPILOGUE_DTYPES)})" if dtype not in EPILOGUE_DTYPES
           else "")
    if not why and fits_kernel(count, dtype):
        why = group_of(comm, _GROUP_KEY, _make_small(comm), capturing)[1]
    settle(path, why, what)
    return why


def words(items: Sequence[str], scale: Optional[float], cols: int, nranks: int, biases: Sequence[int],
          residuals: Sequence[int]) -> List[List[int]]:
    """Per rank the epilogue's GC3_EPW_* words, with that rank's bias and residual addresses (0: none)."""
    from ..core.tables import pack_epilogue

    return [pack_epilogue(items, scale, cols, nranks, b, r) for b, r in zip(biases, residuals)]


def run_kernel(comm, xs: Sequence[int], outs: Sequence[int], count: int, dtype: str, out_dtype: str,
               epw: Sequence[Sequence[int]], stream: int, kind: Optional[str] = None) -> None:
    """The small kernels' epilogue build: one launch for every rank this process runs (`kind`:
    kernel_kind's answer for the call, where the caller has it)."""
    if kind is None:
        kind = kernel_kind(count * dtype_info(dtype).np.itemsize, comm.size())
    small_group(comm).run_ptrs(xs, outs, count, dtype, "sum", stream, kind=kind, epilogue=epw, out_dtype=out_dtype)


def run_pass(ys: Sequence[int], outs: Sequence[int], count: int, dtype: str, out_dtype: str,
             epw: Sequence[Sequence[int]], stream: int) -> None:
    """The epilogue as one pass over each rank's allreduced y (above the kernels' limit)."""
    for y, o, w in zip(ys, outs, epw):
        pass_launch(count, dtype, out_dtype, w)(y, o, stream)


def pass_launch(count: int, dtype: str, out_dtype: str, words: Sequence[int]):
    """One rank's pass, packed once, to keep for repeated calls: run(y, out, stream)."""
    from ..ranks.small_allreduce import PassLaunch

    return PassLaunch(count, dtype, out_dtype, words)


# --- the CuPy API ---------------------------------------------------------------------------------------
def allreduce_epilogue(x, comm, scale: Optional[float] = None, bias=None, residual=None, out=None, stream=None, *,
                       path: Optional[str] = None, out_dtype: Optional[str] = None):
    """out = (sum over ranks of x) * scale + bias + residual on every rank; each term optional.

    x: this rank's C-contiguous array, any shape, bfloat16 (uint16), float16 or float32; bias: a
    1-D array of x.shape[-1] elements (a per-column vector broadcast over the rows); residual: an
    array of x's shape; both of x's type, on every rank or on none.  out_dtype: the result's type
    (default x's; "bfloat16" for fp32 partial sums delivered as bf16).  out (x's shape, out_dtype,
    allocated when None) may be x itself where the types agree; it may not overlap bias or
    residual.  Returns out (a list of them with a VirtualComm)."""
    import cupy

    n, a, rank = _ranks(comm, {"x": x, "bias": bias, "residual": residual, "out": out})
    path = _path(path)
    first = None
    for k in range(len(a["x"])):
        at = f"allreduce_epilogue: {_where(rank, k)}"
        _check_array(a["x"][k], f"{at}: x", max(getattr(a["x"][k], "ndim", 1), 1))   # any shape but a scalar
        shape = (a["x"][k].shape, a["x"][k].dtype.name)
        if first is not None and shape != first:
            raise ValueError(f"{at}: x {shape[0]} {shape[1]} differs from rank 0's {first[0]} {first[1]}")
        first = shape
    dtype = value_dtype(a["x"][0], "allreduce_epilogue: x")
    odt = dtype if out_dtype is None else _out_dtype(out_dtype)
    xshape, sdt, odt_storage = first[0], storage(dtype).name, storage(odt).name
    for name, want in (("bias", (xshape[-1],)), ("residual", xshape)):
        given = [v is not None for v in a[name]]
        if any(given) and not all(given):
            raise ValueError(f"allreduce_epilogue: {name} is given on some ranks and not on others "
                             f"({', '.join(_where(rank, k) for k, g in enumerate(given) if not g)} lack it)")
        for k, v in enumerate(a[name] if all(given) else []):
            at = f"allreduce_epilogue: {_where(rank, k)}: {name}"
            _check_array(v, at, len(want), sdt)
            if v.shape != want:
                raise ValueError(f"{at} is {v.shape}, expected {want} (x is {xshape})")
    items = _items(scale, a["bias"][0] is not None, a["residual"][0] is not None)
    count = int(math.prod(xshape))
    with streams.current(streams.wrap(streams.handle(stream))):
        for k in range(len(a["out"])):
            at = f"allreduce_epilogue: {_where(rank, k)}: out"
            if a["out"][k] is None:
                a["out"][k] = cupy.empty(xshape, dtype=odt_storage)
            _check_array(a["out"][k], at, len(xshape), odt_storage)
            if a["out"][k].shape != xshape:
                raise ValueError(f"{at} is {a['out'][k].shape}, expected {xshape}")
            for name in ("bias", "residual"):
                if a[name][k] is not None and _overlaps(a["out"][k], a[name][k]):
                    raise ValueError(f"{at} overlaps {name}: the fused path keeps partial sums in out")
            if odt != dtype and _overlaps(a["out"][k], a["x"][k]):
                raise ValueError(f"{at} overlaps x: a {dtype} result cast to {odt} cannot be stored in place")
        what = f"allreduce_epilogue {xshape} {dtype}->{odt} {','.join(items)} on {n} ranks"
        if refusal(comm, path, count, dtype, n, what, lambda: streams.is_capturing(streams.handle(stream))):
            _sequential(comm, a, dtype, odt, scale, stream)
        else:
            _fused(comm, a, items, scale, count, dtype, odt, streams.handle(stream))
    return a["out"] if isinstance(comm, VirtualComm) else a["out"][0]


def _out_dtype(name) -> str:
    import numpy

    text = str(name)
    if text not in ("bfloat16", "float16", "float32"):
        text = numpy.dtype(name).name if text != "uint16" else "bfloat16"
    if text not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"allreduce_epilogue: out_dtype {name!r}; expected bfloat16, float16 or float32")
    return text


def _fused(comm, a, items, scale, count: int, dtype: str, odt: str, stream: int) -> None:
    import cupy

    n = len(a["x"])
    cols = a["x"][0].shape[-1]
    ptrs = lambda name: [0 if v is None else v.data.ptr for v in a[name]]   # noqa: E731
    epw = words(items, scale, cols, comm.size(), ptrs("bias"), ptrs("residual"))
    if fits_kernel(count, dtype):
        run_kernel(comm, ptrs("x"), ptrs("out"), count, dtype, odt, epw, stream)
        return
    # Above the kernels' limit: the sum at the communicator's speed, then one pass.  A cast needs
    # the sum in x's type first; allocated on the call's stream (current here), so the pool hands
    # it to nothing unordered with the pass that reads it.
    ys = a["out"] if odt == dtype else [cupy.empty_like(a["x"][k]) for k in range(n)]
    _allreduce(comm, a["x"], ys, dtype, stream)
    run_pass([y.data.ptr for y in ys], ptrs("out"), count, dtype, odt, epw, stream)


def _sequential(comm, a, dtype: str, odt: str, scale, stream) -> None:
    import cupy

    ys = a["out"] if odt == dtype else [cupy.empty_like(x) for x in a["x"]]
    _allreduce(comm, a["x"], ys, dtype, stream)
    for k, (y, o) in enumerate(zip(ys, a["out"])):
        f = to_f32(y, dtype)
        if scale is not None:
            f *= float(scale)
        if a["bias"][k] is not None:
            f += to_f32(a["bias"][k], dtype)        # broadcast over the rows
        if a["residual"][k] is not None:
            f += to_f32(a["residual"][k], dtype)
        from_f32(f, odt, o)


__all__ = ["allreduce_epilogue"]
