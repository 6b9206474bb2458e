"""Exact data checks for benchmarks, on the GPU, at any size.

Every rank's input is a function of (rank, element index), so each rank can
compute the output it should hold without seeing other ranks' data. The values
are small integers (powers of two for prod) chosen per dtype and op so that
every reduction order gives the same value: results are compared exactly (a
tolerance would let a stale or half-written buffer through). The one exception
is avg on floating types, where NCCL scales each input by 1/n before summing
and gc3 may divide at the end, so the two can round differently. There the
inputs are kept within [-4, 4] and the result may differ from the exact mean
by at most the rounding of 2n operations on such values (`avg_bound`), far
less than any change of an input or output by a whole unit.

The functions take the array module (`xp`: cupy on the GPU, numpy in the CPU
tests). Outputs are checked in windows so that a multi-GiB buffer needs only a
few window-sized temporaries and nothing larger than one element per mismatch
crosses to the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

from gc3.dtypes import dtype_info

# Elements generated and compared at a time (int64/float64 temporaries of
# 128 MiB each).
WINDOW = 1 << 24

# (output start, length, sources, reduced): the output elements
# [start, start + length) are the reduction (or, for one source, a copy) of the
# inputs of each source rank at [input start, input start + length).
Segment = Tuple[int, int, Sequence[Tuple[int, int]], bool]

# Significand bits (the implicit one included) of the floating types.
_PRECISION = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
# Inputs of a floating avg stay within [-AVG_MAX, AVG_MAX].
AVG_MAX = 4


def avg_bound(dtype: str, nranks: int) -> float:
    """How far a floating avg of inputs within [-AVG_MAX, AVG_MAX] may be from
    the exact mean as stored: 2n roundings (n scalings, n - 1 additions, the
    stored mean's own), each of a value at most AVG_MAX in magnitude (sums of
    whole inputs are exact), so at most half an ulp of 2 * AVG_MAX."""
    return 2 * nranks * AVG_MAX * 2.0 ** -_PRECISION[dtype_info(dtype).name]


def generate(xp, rank: int, start: int, n: int, op: str, dtype: str, nranks: int):
    """Rank `rank`'s input elements [start, start + n) as int64 values that
    reduce exactly in `dtype` over `nranks` ranks."""
    i = xp.arange(start, start + n, dtype=xp.int64)
    # Reduce the index first so that the product stays far below 2**63 for any count.
    h = ((i % 1000003) * (2654435761 % 1000003) + (rank + 1) * 40503 * 1021) % 1000003
    info = dtype_info(dtype)
    signed = info.signed
    if op == "prod":
        # Twos only from the first ranks, so that a product of all ranks stays
        # within the exact range (2**(bits - 1) <= exact) instead of wrapping.
        v = 1 + (h % 2) if rank < info.exact.bit_length() - 1 else xp.ones_like(h)
        return v * (1 - 2 * ((h >> 3) % 2)) if signed else v
    if op == "avg" and info.is_float:
        m = 2 * AVG_MAX
    else:
        m = max(2, min(info.exact // nranks if op in ("sum", "avg") else info.exact, 2048))
    return h % (m + 1) - (m // 2 if signed else 0)


def store(xp, buf, offset: int, values, dtype: str) -> None:
    """Write `values` as `dtype` into elements [offset, offset + n) of `buf` (any dtype, contiguous)."""
    n = values.size
    if dtype == "bfloat16":
        # Small integers are exact in bfloat16: dropping float32's low half is exact too.
        bits = values.astype(xp.float32).view(xp.uint32) >> 16
        buf.view(xp.uint16)[offset: offset + n] = bits.astype(xp.uint16)
    else:
        np_dtype = dtype_info(dtype).np
        buf.view(np_dtype)[offset: offset + n] = values.astype(np_dtype)


def load(xp, buf, offset: int, n: int, dtype: str):
    """Elements [offset, offset + n) of `buf` read as `dtype`, widened to float64 (floats) or int64."""
    if dtype == "bfloat16":
        bits = buf.view(xp.uint16)[offset: offset + n].astype(xp.uint32) << 16
        return bits.view(xp.float32).astype(xp.float64)
    info = dtype_info(dtype)
    return buf.view(info.np)[offset: offset + n].astype(xp.float64 if info.is_float else xp.int64)


def fill_input(xp, buf, offset: int, rank: int, n: int, op: str, dtype: str, nranks: int,
               window: int = WINDOW) -> None:
    for a in range(0, n, window):
        w = min(window, n - a)
        store(xp, buf, offset + a, generate(xp, rank, a, w, op, dtype, nranks), dtype)


def segments(coll: str, rank: int, nranks: int, count: int, root: int) -> Optional[List[Segment]]:
    """Where this rank's output comes from (NCCL's count convention), or None
    where NCCL leaves the output unspecified (reduce on a non-root rank)."""
    everyone = range(nranks)
    if coll == "allreduce":
        return [(0, count, [(r, 0) for r in everyone], True)]
    if coll == "reduce":
        return [(0, count, [(r, 0) for r in everyone], True)] if rank == root else None
    if coll == "broadcast":
        return [(0, count, [(root, 0)], False)]
    if coll == "allgather":
        return [(p * count, count, [(p, 0)], False) for p in everyone]
    if coll == "alltoall":
        return [(p * count, count, [(p, rank * count)], False) for p in everyone]
    if coll == "reducescatter":
        return [(0, count, [(r, rank * count) for r in everyone], True)]
    raise ValueError(f"no data check for {coll!r}")


def _reduce(xp, arrays: Iterator, op: str, nranks: int):
    acc = next(arrays).astype(xp.float64)
    for a in arrays:
        b = a.astype(xp.float64)
        if op in ("sum", "avg"):
            acc += b
        elif op == "prod":
            acc *= b
        elif op == "max":
            acc = xp.maximum(acc, b)
        elif op == "min":
            acc = xp.minimum(acc, b)
        else:
            raise ValueError(f"unknown reduction op {op!r}")
    return acc / nranks if op == "avg" else acc


def as_stored(xp, values, dtype: str):
    """What `values` become once written in `dtype` and read back (rounding, wrap-around)."""
    tmp = xp.empty(values.size * dtype_info(dtype).np.itemsize, dtype=xp.uint8)
    if dtype_info(dtype).is_float or values.dtype.kind in "iu":
        store(xp, tmp, 0, values, dtype)
    else:  # avg of integers: NCCL divides and truncates
        store(xp, tmp, 0, xp.trunc(values).astype(xp.int64), dtype)
    return load(xp, tmp, 0, values.size, dtype)


@dataclass
class Mismatch:
    wrong: int = 0            # elements that differ
    checked: int = 0
    index: int = -1           # first differing output element
    got: float = 0.0
    want: float = 0.0

    def describe(self, rank: int) -> str:
        if not self.wrong:
            return ""
        return (f"rank {rank} output[{self.index}] = {self.got!r}, expected {self.want!r} "
                f"({self.wrong} of {self.checked} wrong on this rank)")


def _bad(xp, got, want, dtype: str, op: str, nranks: int):
    if dtype_info(dtype).is_float and op == "avg":
        return ~(xp.abs(got - want) <= avg_bound(dtype, nranks))   # NaN is wrong
    return got != want     # NaN (a missed write into a NaN-filled output) counts as wrong


def check_output(xp, coll: str, rank: int, nranks: int, count: int, op: str, dtype: str, root: int,
                 out_buf, out_offset: int = 0, window: int = WINDOW) -> Mismatch:
    """Compare this rank's output (starting at element `out_offset` of
    `out_buf`) with what the generated inputs must give."""
    res = Mismatch()
    segs = segments(coll, rank, nranks, count, root)
    if segs is None:
        return res
    for start, length, sources, reduced in segs:
        for a in range(0, length, window):
            w = min(window, length - a)
            gens = (generate(xp, r, s + a, w, op, dtype, nranks) for r, s in sources)
            want = as_stored(xp, _reduce(xp, gens, op if reduced else "sum", nranks if reduced else 1), dtype)
            got = load(xp, out_buf, out_offset + start + a, w, dtype)
            bad = _bad(xp, got, want, dtype, op if reduced else "sum", nranks)
            k = int(xp.count_nonzero(bad))
            res.checked += w
            if k:
                if not res.wrong:
                    i = int(xp.argmax(bad))       # first True
                    res.index, res.got, res.want = start + a + i, float(got[i]), float(want[i])
                res.wrong += k
    return res
