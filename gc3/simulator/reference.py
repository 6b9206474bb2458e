"""What each collective must produce, computed directly with numpy.

`reference(coll, inputs, op, nranks, root)` returns, per rank, the expected
output buffer, or None where the collective leaves that rank's output
unspecified (reduce: every rank but the root; alltonext: rank 0, which has
no predecessor).  Buffer sizes follow gc3.ir.layout: every input holds
`in_elems` elements; allgather's output is `nranks` inputs long,
reducescatter's `in_elems / nranks`.

Float reductions are computed in float64 and rounded once, integer ones in
the type itself so that wrap-around matches the GPU.  `make_inputs` draws
small integers so that every reduction order is exact in every dtype.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from ..dtypes import dtype_info, reduce_op
from ..errors import GC3Error

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "alltonext")


class ReferenceError(GC3Error):
    """No reference for a collective, or inputs it cannot take."""


Outputs = List[Optional[np.ndarray]]


def _reduced(inputs: Sequence[np.ndarray], op) -> np.ndarray:
    # One rank at a time into one accumulator, in rank order as a reduction along
    # the ranks' axis would go, so that memory stays two buffers, not nranks.
    ufunc = reduce_op(op) if isinstance(op, str) else op
    dt = inputs[0].dtype
    info = dtype_info(dt)
    # integers: the type numpy's own reduction would accumulate in (add and multiply widen small ones)
    wide = np.float64 if info.is_float else ufunc.reduce(np.stack([np.asarray(x)[:1] for x in inputs]), axis=0).dtype
    acc = np.array(inputs[0], dtype=wide, copy=True)
    for x in inputs[1:]:
        ufunc(acc, np.asarray(x), out=acc, casting="unsafe")
    out = acc.astype(dt) if info.is_float else acc
    if op == "avg":
        from ..ir.epilogue import avg_divide
        out = avg_divide(out.astype(dt), len(inputs))   # NCCL divides the wrapped sum
    return out


def _shared(x: np.ndarray, n: int) -> List[np.ndarray]:
    """The same expected buffer for `n` ranks: one array, read-only so that no
    caller can change one rank's expectation through another's."""
    x.flags.writeable = False
    return [x] * n


def _blocks(x: np.ndarray, n: int) -> List[np.ndarray]:
    if x.size % n:
        raise ReferenceError(f"a buffer of {x.size} elements does not split into {n} equal blocks")
    return np.split(x, n)


def _allreduce(inputs, op, n, root):
    return _shared(_reduced(inputs, op), n)


def _allgather(inputs, op, n, root):
    return _shared(np.concatenate(inputs), n)


def _reducescatter(inputs, op, n, root):
    return [b.copy() for b in _blocks(_reduced(inputs, op), n)]


def _alltoall(inputs, op, n, root):
    blocks = [_blocks(x, n) for x in inputs]
    return [np.concatenate([blocks[src][dst] for src in range(n)]) for dst in range(n)]


def _broadcast(inputs, op, n, root):
    return _shared(inputs[root].copy(), n)


def _reduce(inputs, op, n, root):
    r = _reduced(inputs, op)
    return [r if rank == root else None for rank in range(n)]


def _alltonext(inputs, op, n, root):
    return [None] + [inputs[r - 1].copy() for r in range(1, n)]


_REFERENCES: Dict[str, Callable] = {
    "allreduce": _allreduce,
    "allgather": _allgather,
    "reducescatter": _reducescatter,
    "alltoall": _alltoall,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "alltonext": _alltonext,
}


def reference(coll: str, inputs: Sequence[np.ndarray], op: Union[str, np.ufunc], nranks: int,
              root: int = 0) -> Outputs:
    """Expected output buffer of every rank (None where unspecified)."""
    if coll not in _REFERENCES:
        raise ReferenceError(
            f"no built-in reference for collective {coll!r} (known: {', '.join(COLLECTIVES)}); "
            "pass a reference callable")
    if len(inputs) != nranks:
        raise ReferenceError(f"{coll}: got {len(inputs)} input buffers for {nranks} ranks")
    if not 0 <= root < nranks:
        raise ReferenceError(f"{coll}: root {root} is not a rank of {nranks}")
    sizes = {np.asarray(x).size for x in inputs}
    if len(sizes) > 1:
        raise ReferenceError(f"{coll}: input buffers differ in size: {sorted(sizes)}")
    return _REFERENCES[coll]([np.asarray(x) for x in inputs], op, nranks, root)


def from_postcondition(prog, inputs: Sequence[np.ndarray], op, outputs: Sequence[np.ndarray]) -> Outputs:
    """Expected outputs of a custom collective, from the postcondition its IR
    carries (gc3.ir.Postcondition), chunk by chunk through gc3.ir.layout.  Output
    chunks it leaves unspecified expect what `outputs` hold, so they are not
    compared; a rank with none specified gets None."""
    from ..ir.layout import layout_for

    n = prog.ngpus
    in_elems = np.asarray(inputs[0]).size
    layouts = [layout_for(prog, in_elems, r) for r in range(n)]
    expected: Outputs = [None] * n
    for (r, j), terms in sorted(prog.postcondition.items()):
        if expected[r] is None:
            expected[r] = np.array(outputs[r], copy=True)
        a, b = layouts[r].chunk_range("o", j)
        parts = []
        for src, i in terms:
            lo, hi = layouts[src].chunk_range("i", i)
            part = np.zeros(b - a, dtype=expected[r].dtype)
            part[:min(hi - lo, b - a)] = inputs[src][lo:lo + min(hi - lo, b - a)]
            parts.append(part)
        expected[r][a:b] = _reduced(parts, op) if len(parts) > 1 else parts[0]
    return expected


def make_inputs(coll: str, nranks: int, in_elems: int, dtype="float32", seed: int = 0,
                op: str = "sum") -> List[np.ndarray]:
    """One input buffer per rank, of small integers chosen so that reducing all
    ranks with `op` in any order is exact in `dtype` (so results compare
    bit-for-bit), yet varied enough that a misplaced chunk shows.  `coll` is
    accepted so callers need not special-case; every collective's input is
    `in_elems` elements."""
    info = dtype_info(dtype)
    rng = np.random.default_rng([seed, nranks, in_elems])
    n = max(nranks, 1)
    signed = info.signed
    # Drawn one rank at a time (the generator's stream is the same as for one
    # (n, in_elems) draw), so that only one rank's int64 draw is alive at once.
    if op == "prod":
        # Magnitudes 1 or 2 with at most `cap` twos per element: products are
        # powers of two no larger than 2**cap, exact and finite everywhere.
        cap = min(14, info.exact.bit_length() - 2)
        seen = np.zeros(in_elems, dtype=np.int16)
        twos = []
        for _ in range(n):
            t = rng.random(in_elems) < 0.5
            seen += t
            twos.append(t & (seen <= cap))
        vals = [np.where(t, 2, 1) for t in twos]
        if signed:
            vals = [v * rng.choice([-1, 1], size=in_elems) for v in vals]
        return [v.astype(info.np) for v in vals[:nranks]]
    # sum: partial sums of n values stay within the exact integer range.
    bound = info.exact // n if op in ("sum", "avg") else info.exact
    m = max(1, min(bound, 2048))
    lo = -(m // 2) if signed else 0
    hi = m // 2 if signed else m
    return [rng.integers(lo, hi + 1, size=in_elems).astype(info.np) for _ in range(nranks)]
