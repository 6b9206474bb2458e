"""AllReduce with an elementwise epilogue on CuPy arrays, fused or sequential:
y = sum over ranks of x_r, then y * scale + bias + residual, on every rank.

*Fused*: algorithms/fused/allreduce_epilogue.py with the epilogue the call asks for; the
interpreter applies it as each output chunk's final value is stored (kernels/epilogue.cuh), with
no second pass over y.  *Sequential*: the communicator's AllReduce, then one CuPy elementwise pass
in fp32.  Ranks, types, `path` and GC3_FUSED as in memory_bound.py (VirtualComm: every array
argument a list, one per rank).  GC3_FUSED_EPILOGUE_VARIANT picks the program (1: one-shot, 2:
ring); by default one-shot up to 64 KiB per rank, the ring above.

The epilogue's arithmetic is fp32, rounded once to the call's type (bfloat16, float16, float32);
the fused path sums in the call's type as the interpreter reduces (bf16: rounded per step), the
sequential one as the communicator does.
"""
from __future__ import annotations

import math
from typing import Optional

from .. import streams
from .memory_bound import (VirtualComm, _allreduce, _check_array, _decide, _env_int, _path, _ranks, _where,
                           from_f32, storage, to_f32, value_dtype)

ALGO = "allreduce_epilogue"
ONESHOT_MAX_BYTES = 1 << 16


def _items(scale, has_bias: bool, has_residual: bool) -> tuple:
    """The epilogue, in the order the call states it: y * scale + bias + residual."""
    items = []
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ValueError(f"allreduce_epilogue: scale must be a finite number, got {scale!r}")
        items.append(("scale", float(scale)))
    items += [("bias", "bias")] if has_bias else []
    items += [("residual", "residual")] if has_residual else []
    if not items:
        raise ValueError("allreduce_epilogue: no epilogue: give scale, bias or residual (a plain AllReduce is the "
                         "communicator's allReduce)")
    return tuple(items)


def _overlaps(a, b) -> bool:
    lo_a, lo_b = a.data.ptr, b.data.ptr
    return lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes


def allreduce_epilogue(x, comm, scale: Optional[float] = None, bias=None, residual=None, out=None, stream=None, *,
                       path: Optional[str] = None):
    """out = (sum over ranks of x) * scale + bias + residual on every rank; each term optional.

    x: this rank's C-contiguous array, any shape, bfloat16 (uint16), float16 or float32; bias: a
    1-D array of x.shape[-1] elements (a per-column vector broadcast over the rows); residual: an
    array of x's shape; both of x's type, on every rank or on none.  out (x's shape and type,
    allocated when None) may be x itself; it may not overlap bias or residual (the fused path
    keeps partial sums in it).  Returns out (a list of them with a VirtualComm)."""
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
    xshape, sdt = first[0], storage(dtype).name
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
                a["out"][k] = cupy.empty(xshape, dtype=sdt)
            _check_array(a["out"][k], at, len(xshape), sdt)
            if a["out"][k].shape != xshape:
                raise ValueError(f"{at} is {a['out'][k].shape}, expected {xshape}")
            for name in ("bias", "residual"):
                if a[name][k] is not None and _overlaps(a["out"][k], a[name][k]):
                    raise ValueError(f"{at} overlaps {name}: the fused path keeps partial sums in out")
        variant = 1 if count * storage(dtype).itemsize <= ONESHOT_MAX_BYTES else 2
        variant = _env_int("GC3_FUSED_EPILOGUE_VARIANT", variant)
        if variant not in (1, 2):
            raise ValueError(f"GC3_FUSED_EPILOGUE_VARIANT must be 1 (one-shot) or 2 (ring), got {variant}")
        cols = xshape[-1] if a["bias"][0] is not None else 0
        args = (n, variant, cols, 0, items)
        refusal = "a single rank: nothing to reduce" if n < 2 else "an empty x" if count == 0 else ""
        what = f"allreduce_epilogue {xshape} {dtype} {','.join(k for k, _ in items)} on {n} ranks"
        group = _decide(comm, path, refusal, ALGO, args, None, 0, what)
        if group is None:
            _sequential(comm, a, dtype, scale, stream)
        else:
            names = group.prog.epilogue.names
            group.run_ptrs([v.data.ptr for v in a["x"]], [o.data.ptr for o in a["out"]], count, dtype, "sum",
                           stream, epilogue=[tuple(a[name][k].data.ptr for name in names)
                                             for k in range(len(a["x"]))])
    return a["out"] if isinstance(comm, VirtualComm) else a["out"][0]


def _sequential(comm, a, dtype: str, scale, stream) -> None:
    _allreduce(comm, a["x"], a["out"], dtype, stream)
    for k, o in enumerate(a["out"]):
        y = to_f32(o, dtype)
        if scale is not None:
            y *= float(scale)
        if a["bias"][k] is not None:
            y += to_f32(a["bias"][k], dtype)        # broadcast over the rows
        if a["residual"][k] is not None:
            y += to_f32(a["residual"][k], dtype)
        from_f32(y, dtype, o)


__all__ = ["allreduce_epilogue"]
