"""Inputs and exact references for the small-message allreduce kernels, shared by
tests/test_small_allreduce.py (virtual ranks) and small_allreduce_ipc.py (mpirun).

Data are integer-valued and small enough that every partial sum is exact in the
dtype, so the reference (numpy, rank order 0..n-1) must match bit for bit."""
import numpy as np

from gc3 import limits
from gc3.dtypes import DTYPES as _ALL, dtype_info

DTYPES = tuple(_ALL)        # every dtype the kernels are built for (new ones last: earlier seeds stay)
OPS = ("sum", "max", "avg")


def counts(dtype: str):
    """Odd element counts from 1 up to the largest the kernels take for `dtype` (tails of every width)."""
    top = limits.SMALL_ALLREDUCE_MAX_BYTES // dtype_info(dtype).np.itemsize
    out = [1, 3, 7, 255, 4099] + [c for c in (65537, 262147) if c <= top]
    return out + [top - 1 if top % 2 == 0 else top]


def _low_high(dtype: str, op: str, n: int):
    info = dtype_info(dtype)
    if op == "avg":      # each value n*k: the sum divides by n exactly (any rounding rule agrees)
        if info.is_float:
            return -8, 8
        m = max(1, min(8, info.exact // (n * n)))      # n values of n*k: no wrap before the division
        return (-m if info.signed else 0), m
    if info.is_float:
        return -16, 16
    # Integers take their whole range: sums wrap (as numpy's do) and max sees the
    # sign bit, where a signed/unsigned mix-up in the kernel would show.
    i = np.iinfo(info.np)
    return int(i.min), int(i.max)


def inputs(seed: int, n: int, count: int, dtype: str, op: str):
    """One array per rank, of dtype's numpy type."""
    info = dtype_info(dtype)
    lo, hi = _low_high(dtype, op, n)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if info.is_float:
            k = rng.integers(lo, hi + 1, count)
            out.append((k * n if op == "avg" else k).astype(info.np))
        else:       # drawn in the type itself: uint64's top half has no int64
            k = rng.integers(lo, hi, count, dtype=info.np, endpoint=True)
            out.append(k * info.np.type(n) if op == "avg" else k)
    return out


def expected(ins, op: str, dtype: str):
    """Rank order 0..n-1; integers reduce in their own type (numpy wraps)."""
    info = dtype_info(dtype)
    wide = [a.astype(np.float64) for a in ins] if info.is_float else [a.copy() for a in ins]
    acc = wide[0].copy()
    for a in wide[1:]:
        acc = np.maximum(acc, a) if op == "max" else acc + a
    if op == "avg":     # exact either way: the sum is n*(sum of k)
        acc = acc / len(ins) if info.is_float else acc // info.np.type(len(ins))
    return acc.astype(info.np)


def storage(a):
    """The array as the device holds it (CuPy has no bfloat16)."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def bits(a):
    """Raw bits, for bit-exact comparison (-0.0 differs from 0.0)."""
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def first_wrong(got, want) -> str:
    bad = np.flatnonzero(bits(got) != bits(want))
    if bad.size == 0:
        return ""
    i = bad[0]
    return f"{bad.size} wrong of {want.size}, first [{i}] {got[i]!r} != {want[i]!r}"
