"""Element counts of a call whose larger buffer is nccl-tests' size, so numbers compare
(sizes and the bus factor themselves are gc3.units'), and the one timing loop of `gc3 run`
and the drop-in's benchmark."""
from __future__ import annotations

from typing import Callable, Tuple

from gc3.ir.layout import blocks_of


def in_elems_for(prog, nbytes: int, itemsize: int) -> int:
    """Input elements of a call whose larger buffer is about `nbytes` (nccl-tests' size)."""
    g = prog.gpus[0]
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    unit = max(1, nbytes // itemsize // max(bi, bo))
    return unit * bi


def nbytes_of(prog, in_elems: int, itemsize: int) -> int:
    g = prog.gpus[0]
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    return in_elems // bi * max(bi, bo) * itemsize


# Timed rounds per measurement.  Every gc3 timing reports the median round, so that one round
# disturbed by something else on the machine does not move the figure as a mean would.
ROUNDS = 3


def time_rounds(call: Callable[[], object], iters: int, rounds: int = ROUNDS, stream=None) -> Tuple[float, object]:
    """(microseconds per call, the last call's result): `rounds` rounds of `iters` calls of
    `call()`, each round between two CUDA events on `stream` (None: the current stream); the
    time is the median round's (the lower one of an even count)."""
    import cupy

    result = None
    marks = [cupy.cuda.Event() for _ in range(max(rounds, 1) + 1)]
    marks[0].record(stream)
    for mark in marks[1:]:
        for _ in range(iters):
            result = call()
        mark.record(stream)
    marks[-1].synchronize()
    per_call = sorted(cupy.cuda.get_elapsed_time(a, b) * 1000.0 / max(iters, 1) for a, b in zip(marks, marks[1:]))
    return per_call[(len(per_call) - 1) // 2], result
