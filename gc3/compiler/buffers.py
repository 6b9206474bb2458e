"""Pass 0 of lowering: the buffer geometry every later pass shares (`BufferPlan`).

Sizes, blocks and scratch offsets of each rank's buffers, and the chunk index
mapping that replication (`replication.py`) applies; see there for why the
mapping is instance-major inside a block.  `fit_scratch` cuts scratch to what
the instructions still name after absorption.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import lcm
from typing import Dict, Sequence, Tuple

from ..ir import collectives
from ..dsl.chunk_dag import ChunkDAG
from ..dsl.ops import Op
from ..errors import LoweringError
from ..ir.layout import blocks_of

__all__ = ["BufferPlan", "plan_buffers", "fit_scratch"]


@dataclass(frozen=True)
class BufferPlan:
    """How the traced buffers become the IR's: sizes, blocks, scratch offsets, copies."""

    coll: str
    nranks: int
    instances: int
    parallel: int                          # P: sub-chunks per chunk
    copies: int                            # channel slots per instance (largest parallel factor)
    block: Dict[Tuple[int, str], int]      # (rank, "i"/"o"/"s") -> chunks per block
    declared: Dict[Tuple[int, str], int]   # (rank, "i"/"o"/"s") -> chunks before replication
    scratch_offset: Dict[Tuple[int, str], int]   # (rank, scratch name) -> offset inside "s"

    @property
    def factor(self) -> int:
        return self.instances * self.parallel

    def ir_chunks(self, rank: int, buf: str) -> int:
        return self.declared.get((rank, buf), 0) * self.factor

    def canonical(self, rank: int, buf: str, index: int) -> Tuple[str, int]:
        """A traced (buffer, index) -> (i/o/s, index) before replication."""
        if buf in ("i", "o"):
            return buf, index
        return "s", self.scratch_offset[(rank, buf)] + index

    def block_size(self, rank: int, buf: str) -> int:
        return self.block[(rank, buf)]

    def index(self, rank: int, buf: str, index: int, instance: int, sub: int) -> int:
        c = self.block[(rank, buf)]
        b, j = divmod(index, c)
        return b * self.instances * c * self.parallel + instance * c * self.parallel + j * self.parallel + sub

    def shift(self, rank: int, buf: str) -> int:
        """How far instance i+1's copy of a chunk lies from instance i's."""
        return self.block[(rank, buf)] * self.parallel


def plan_buffers(dag: ChunkDAG, instances: int) -> BufferPlan:
    coll = dag.collective
    n = coll.num_ranks
    ops: Sequence[Op] = dag.ops
    factors = {op.parallel for op in ops} or {1}
    block: Dict[Tuple[int, str], int] = {}
    declared: Dict[Tuple[int, str], int] = {}
    offsets: Dict[Tuple[int, str], int] = {}
    for r in range(n):
        din, dout = coll.input_chunks(r), coll.output_chunks(r)
        bi, bo = blocks_of(coll.name, n, din, dout)
        # The real (un-aliased) buffer sizes: an in-place collective declares 0
        # chunks for the aliased buffer, but its blocks are those of the real one.
        for buf, size, blocks in (("i", coll.input_size(r), bi), ("o", coll.output_size(r), bo)):
            block[(r, buf)] = size // blocks if blocks and size % blocks == 0 and size >= blocks else max(size, 1)
        declared[(r, "i")] = din
        declared[(r, "o")] = dout
        scratch = dag.scratch_sizes.get(r, {})
        total = 0
        # "s" first, then named scratch buffers in the order the program made them.
        for name in sorted(scratch, key=lambda s: s != "s"):
            offsets[(r, name)] = total
            total += scratch[name]
        declared[(r, "s")] = total
        block[(r, "s")] = max(total, 1)
    if instances > 1:
        _require_same_positions(coll, block)
    P = lcm(*factors)
    return BufferPlan(coll=coll.name, nranks=n, instances=instances, parallel=P, copies=max(factors),
                      block=block, declared=declared, scratch_offset=offsets)


def fit_scratch(plan: BufferPlan, dag) -> BufferPlan:
    """`plan` with each rank's scratch cut to the chunks `dag`'s instructions name.

    Only scratch may shrink: the user buffers' sizes fix `gc3/ir/layout.py`'s
    blocks, while scratch chunk k sits at k*cs whatever s_chunks says, and is
    one block per instance, so a shorter block only packs the instances' copies
    closer.  Every operand field counts, read or not (an `rrs` names its dst),
    so any reader of the IR finds every named chunk inside the buffer.  Used
    after absorption, which can leave declared scratch unnamed (fusion renames
    no operand, so it may run before or after).
    """
    extent: Dict[int, int] = {}
    for x in dag.instrs:
        for buf, off in ((x.srcbuf, x.srcoff), (x.dstbuf, x.dstoff)):
            if buf == "s" and off + x.cnt > extent.get(x.rank, 0):
                extent[x.rank] = off + x.cnt
    block, declared = dict(plan.block), dict(plan.declared)
    changed = False
    for r in range(plan.nranks):
        used = extent.get(r, 0)
        if used < declared[(r, "s")]:
            declared[(r, "s")] = used
            block[(r, "s")] = max(used, 1)
            changed = True
    return replace(plan, block=block, declared=declared) if changed else plan


def _require_same_positions(coll, block) -> None:
    """The instance-major mapping interleaves the chunks of a block, so it is
    only right when every chunk of an output block is made the same way: from
    the same ranks' blocks, at its own position (or left unspecified alike).
    The built-in collectives are; a user's subclass may not be, and would
    compute the wrong thing silently."""
    if type(coll).__module__ == collectives.__name__:
        return
    for r in range(coll.num_ranks):
        co = block[(r, "o")]
        first = {}
        for idx in range(coll.output_size(r)):
            value = coll.postcondition(r, idx)
            terms = None if value is None else tuple(sorted(
                (src, j // block[(src, "i")], j % block[(src, "i")] - idx % co) for src, j in value.terms))
            made = first.setdefault(idx // co, (idx, terms))
            shifted = terms is not None and any(d for _, _, d in terms)
            if shifted or made[1] != terms:
                other = f"input chunk(s) {sorted(value.terms)}" if value is not None else "nothing"
                raise LoweringError(
                    f"instances>1 cannot replicate collective {coll.name!r}: output chunk (rank {r}, 'o', {idx}) "
                    f"gets {other}, unlike chunk {made[0]} of its block; instances interleave the chunks of "
                    f"every block, which is only right when all of a block's chunks are made alike at their own "
                    f"positions; use instances=1 (parallelize(n) keeps chunks whole)")
