"""Element counts of a call whose larger buffer is nccl-tests' size, so numbers compare
(sizes and the bus factor themselves are gc3.units')."""
from __future__ import annotations

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
