"""What tracing records and lowering consumes: slots and operations.

An `Op` is a node of the Chunk DAG (`chunk_dag.py`), the one structure the
lowering passes read.  Tracing (`program.py`, `chunk_ref.py`) adds one per
`copy`/`reduce` call after checking it; other producers add them with
`ChunkDAG.add`, so an `Op` holds everything lowering needs and nothing about
how it was made but `where` (for messages).

Buffers in a `Slot` are canonical: "i", "o", "s", or the name of a user scratch
buffer.  For an in-place collective the DSL has already rewritten aliased
buffers onto the real one (allreduce/alltoall/broadcast/reduce/alltonext: "o"
-> "i"; allgather: "i"[j] -> "o"[rank*chunk_factor + j]; reducescatter:
"o"[j] -> "i"[rank*chunk_factor + j]), so lowering never sees an alias.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Slot:
    rank: int
    buffer: str
    index: int
    count: int = 1

    def indices(self) -> range:
        return range(self.index, self.index + self.count)

    def __str__(self) -> str:
        span = f"{self.index}" if self.count == 1 else f"{self.index}:{self.index + self.count}"
        return f"(rank {self.rank}, {self.buffer!r}, {span})"


@dataclass
class Op:
    """One traced data movement.

    kind "copy":   dst <- src
    kind "reduce": dst <- dst (op) src      (src and dst have equal counts)
    kind "gemv":   dst <- columns `compute.col0:col1` of x @ w on dst.rank (a
                   compute producer: it reads no chunk; src repeats dst)
    The op is remote when src.rank != dst.rank: lowering turns it into a send
    on src.rank and a recv (or recv-reduce-copy) on dst.rank.
    """

    id: int
    kind: str
    src: Slot
    dst: Slot
    ch: Optional[int] = None
    sendtb: Optional[int] = None
    recvtb: Optional[int] = None
    parallel: int = 1                 # factor of the enclosing parallelize(n), 1 if none
    parallel_group: Optional[int] = None  # which parallelize block (None if none)
    where: str = ""                   # "file.py:line" of the user's call
    compute: Optional[object] = None  # kind "gemv": its gc3.ir.ComputeArgs

    @property
    def remote(self) -> bool:
        return self.src.rank != self.dst.rank
