"""Pass: replication (the buffer geometry it maps through is `buffers.BufferPlan`).

`instances=k` runs k copies of the whole program side by side; `parallelize(n)`
runs n copies of a fragment.  Both work by cutting every chunk finer, so the
IR's buffers hold more, smaller chunks, and each copy moves its own share.

Chunk index mapping (the IR must stay correct under `gc3/ir/layout.py`'s rule: a
user buffer is B blocks of c chunks, and a collective's semantics only ever
pair chunk j of one block with chunk j of another block):

    chunk (b, j) of a buffer with blocks of c chunks, instance i, sub-chunk u
      -> b*(k*c*P) + i*(c*P) + j*P + u

where P is the lcm of the program's parallelize factors (1 without any) and a
parallel copy q of an n-way fragment owns sub-chunks [q*P/n, (q+1)*P/n).  The
same bijection is applied to every buffer of every rank, block by block, so
each block stays a block and chunk-to-chunk pairings between blocks survive.

Why instance-major inside a block and not msccl-tools' per-chunk interleaving
(j*k + i): an instance's multi-chunk step (cnt > 1) stays one contiguous step
instead of cnt steps of one chunk, so instances add no steps and no FIFO slots.
Each instance still owns 1/k of every block.  Parallel copies, on the other
hand, are interleaved inside each chunk (j*P + u) because fragments under
`parallelize` and plain operations touch the same chunks: a plain operation
covers all P sub-chunks of a chunk, which interleaving keeps contiguous.
Ranges that would not stay contiguous (crossing a block, or a parallel copy of
several chunks) are cut into pieces when the Instruction DAG is built.

Scratch is one block of all scratch chunks of the rank (named scratch buffers
laid out one after another inside "s"), so instance i gets its own copy.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List

from ..errors import LoweringError
from .buffers import BufferPlan
from .instruction_dag import InstrDAG

__all__ = ["replicate"]


def replicate(dag, plan: BufferPlan):
    """InstrDAG of the traced program -> InstrDAG of its first instance, parallel copies included.

    Copy q of an instruction under `parallelize(n)` gets `part = q`, which the
    channel pass turns into a disjoint channel range; edges are copied between
    copies whose sub-chunk ranges overlap.  Operands are mapped to instance 0.

    The other instances are not materialized here: they are exact copies on
    their own chunks and channels, so every later pass would repeat the same
    work k times.  The DAG records `instances`, and IR emission (`sync.py`)
    stamps the scheduled first instance k times (see `BufferPlan.shift`).
    """
    if plan.factor == 1:
        return dag
    P = plan.parallel
    instrs = dag.instrs
    index = plan.index
    copies: List[List[int]] = []           # base id -> [new id per parallel copy]
    out: list = []
    for x in instrs:
        n = x.parallel
        if n > 1 and x.cnt > 1:
            raise LoweringError(f"internal: parallel instruction {x.describe()} spans {x.cnt} chunks")
        width = P // n
        ids = []
        for q in range(n):
            sub = q * width
            ids.append(len(out))
            out.append(replace(x, id=len(out), srcoff=index(x.rank, x.srcbuf, x.srcoff, 0, sub),
                               dstoff=index(x.rank, x.dstbuf, x.dstoff, 0, sub), cnt=x.cnt * width,
                               parallel=n, part=q, base=x.id))
        copies.append(ids)

    succs: List[List[int]] = [[] for _ in out]
    preds: List[List[int]] = [[] for _ in out]
    for a, targets in enumerate(dag.succs):
        na = instrs[a].parallel
        ca = copies[a]
        for b in targets:
            nb = instrs[b].parallel
            cb = copies[b]
            if na == nb:
                pairs = zip(ca, cb)
            else:
                wa, wb = P // na, P // nb
                pairs = [(ca[qa], cb[qb]) for qa in range(na) for qb in range(nb)
                         if qa * wa < (qb + 1) * wb and qb * wb < (qa + 1) * wa]
            for u, v in pairs:
                succs[u].append(v)
                preds[v].append(u)
    send_to = [-1] * len(out)
    recv_from = [-1] * len(out)
    for a, b in enumerate(dag.send_to):
        if b >= 0:
            for u, v in zip(copies[a], copies[b]):
                send_to[u] = v
                recv_from[v] = u
    return InstrDAG(instrs=out, succs=succs, preds=preds, send_to=send_to, recv_from=recv_from, plan=plan)
