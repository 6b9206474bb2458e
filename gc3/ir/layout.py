"""Where each chunk of an IR lives in memory for a given call size.

One rule, shared by the simulator and the CUDA runtime so they agree on every
element:

* A call passes `in_elems`, the element count of each rank's input buffer
  (NCCL's count for allreduce/broadcast/reduce, sendcount for allgather,
  recvcount*nranks for reducescatter, the whole send buffer for alltoall).
* The collective says how many equal *blocks* each buffer holds (allgather's
  output holds `nranks` blocks, alltoall's input and output `nranks` each, ...).
  `unit = in_elems / blocks_in` must be whole, as in NCCL.
* Each block splits into `c` chunks (c = i_chunks / blocks_in, equal to
  o_chunks / blocks_out), each of `cs = ceil(unit / c)` *lanes*.  Chunk j of
  block b covers elements  b*unit + [j*cs, min((j+1)*cs, unit))  of a user
  buffer: when `unit` does not divide by `c` the last chunks of every block are
  short or empty.  Scratch chunk k covers lanes [k*cs, (k+1)*cs), always full.
* Every step moves whole chunks of `cs` lanes.  A lane past the end of a user
  chunk is never read from user memory (it reads as zero) and never written to
  it, so data that matters is exact and padding never lands in a user buffer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

from ..errors import LayoutError
from . import Program

# (blocks in the input buffer, blocks in the output buffer) per collective.
_BLOCKS = {
    "allreduce": lambda n: (1, 1),
    "allgather": lambda n: (1, n),
    "reducescatter": lambda n: (n, 1),
    "alltoall": lambda n: (n, n),
    "broadcast": lambda n: (1, 1),
    "reduce": lambda n: (1, 1),
    "alltonext": lambda n: (1, 1),
}


def blocks_of(coll: str, nranks: int, i_chunks: int, o_chunks: int) -> Tuple[int, int]:
    if coll in _BLOCKS:
        return _BLOCKS[coll](nranks)
    # A custom collective: the input is one block, the output as many blocks
    # of the same chunk count as it holds.
    if i_chunks and o_chunks % i_chunks == 0:
        return 1, max(o_chunks // i_chunks, 1)
    return 1, 1


@dataclass(frozen=True)
class Layout:
    coll: str
    nranks: int
    in_elems: int        # elements of each rank's input buffer
    out_elems: int       # elements of each rank's output buffer
    unit: int            # elements of one block
    chunks_per_block: int
    cs: int              # lanes per chunk
    blocks_in: int
    blocks_out: int
    i_chunks: int
    o_chunks: int
    s_chunks: int

    @property
    def scratch_elems(self) -> int:
        return self.s_chunks * self.cs

    def chunk_range(self, buf: str, index: int) -> Tuple[int, int]:
        """Element range [start, stop) of chunk `index` of buffer i/o/s; stop-start <= cs."""
        if buf == "s":
            return index * self.cs, (index + 1) * self.cs
        b, j = divmod(index, self.chunks_per_block)
        start = b * self.unit + min(j * self.cs, self.unit)
        stop = b * self.unit + min((j + 1) * self.cs, self.unit)
        return start, stop

    def inplace_offset(self, rank: int) -> Tuple[str, int]:
        """For an in-place call: which buffer is the real allocation and where the
        other one starts inside it, as (base buffer 'i' or 'o', element offset)."""
        if self.coll == "allgather":
            return "o", rank * self.unit      # input = output[rank block]
        if self.coll == "reducescatter":
            return "i", rank * self.unit      # output = input[rank block]
        return "i", 0


def layout_for(prog: Program, in_elems: int, rank: int = 0) -> Layout:
    """The layout of `prog` on rank `rank` for a call of `in_elems` elements."""
    g = prog.gpu(rank)
    for name in ("i_chunks", "o_chunks", "s_chunks"):
        if getattr(g, name) < 0:
            raise LayoutError(f"rank {rank}: {name}={getattr(g, name)}; a buffer cannot have a negative size")
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    if in_elems < 0 or in_elems % bi:
        raise LayoutError(
            f"{prog.coll} with {prog.ngpus} ranks needs an input element count divisible by {bi}; got {in_elems}")
    unit = in_elems // bi
    c_in = g.i_chunks // bi if g.i_chunks else 0
    c_out = g.o_chunks // bo if g.o_chunks else 0
    if g.i_chunks and g.i_chunks % bi:
        raise LayoutError(f"rank {rank}: i_chunks={g.i_chunks} is not a multiple of {bi} blocks ({prog.coll})")
    if g.o_chunks and g.o_chunks % bo:
        raise LayoutError(f"rank {rank}: o_chunks={g.o_chunks} is not a multiple of {bo} blocks ({prog.coll})")
    if c_in and c_out and c_in != c_out:
        raise LayoutError(
            f"rank {rank}: input has {c_in} chunks per block but output {c_out}; gc3 needs them equal")
    c = c_in or c_out or prog.nchunksperloop or 1
    cs = math.ceil(unit / c) if unit else 0
    return Layout(
        coll=prog.coll, nranks=prog.ngpus, in_elems=in_elems, out_elems=unit * bo, unit=unit,
        chunks_per_block=c, cs=cs, blocks_in=bi, blocks_out=bo,
        i_chunks=g.i_chunks, o_chunks=g.o_chunks, s_chunks=g.s_chunks,
    )
