"""Pass 1: the Instruction DAG, derived from the Chunk DAG.

Every op node of the Chunk DAG (`gc3.dsl.chunk_dag.ChunkDAG`) becomes one instruction per rank it touches: a remote copy a
send (`s`) on the source rank and a receive (`r`) on the destination, a remote
reduce a send and a receive-reduce-copy (`rrc`), a local copy `cpy`, a local
reduce `re`.  A send and its receive are linked by a *communication* edge
(`send_to` / `recv_from`); *processing* edges link instructions of one rank
that touch the same chunk (read after write, write after read, write after
write).

Processing edges are derived here from the Chunk DAG's op nodes in its order,
per chunk and per rank, rather than copied from its edges: a Chunk DAG edge
between two remote ops does not say on which of their ranks the conflict lies,
and an instruction needs exactly that.  Both follow from the same op order, so
every Chunk DAG edge is kept (tests/test_lower_properties.py holds them to it).

Operands are stored in gc3's convention (`gc3.ir.Convention.GC3`): all local;
`s` repeats its source in dst, `r`/`rcs` their destination in src, the
receive-reduce family has the local operand in src and the output in dst.

The DAG also records, per writing instruction, who reads the value it wrote
and whether every chunk of it is overwritten (or is dead scratch) before
anyone else reads it: fusion needs that to turn `rrcs` into `rrs`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import LoweringError
from ..ir.opcodes import COMPUTE, OPCODES
from ..dsl.chunk_dag import ChunkDAG
from ..dsl.ops import Op
from .buffers import BufferPlan

__all__ = ["Instr", "InstrDAG", "build_instr_dag", "topological_order", "depths", "hints_agree"]



def hints_agree(a: Optional[int], b: Optional[int]) -> bool:
    """Two user hints (ch=, sendtb=/recvtb=) can hold for one instruction: equal, or one left to the compiler."""
    return a is None or b is None or a == b


@dataclass(slots=True)
class Instr:
    id: int
    rank: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    send_peer: int = -1
    recv_peer: int = -1
    ch: Optional[int] = None          # channel the user asked for
    tb: Optional[int] = None          # threadblock the user asked for
    parallel: int = 1                 # n of the enclosing parallelize(n)
    ops: Tuple[Op, ...] = ()          # the traced ops it implements (two once fused)
    part: int = 0                     # q of the n copies made for parallelize(n)
    base: int = -1                    # id before replication (-1: not replicated, same as id)
    compute: Optional[object] = None  # a compute instruction's gc3.ir.ComputeArgs

    @property
    def origin(self) -> int:
        return self.base if self.base >= 0 else self.id

    @property
    def where(self) -> str:
        return " and ".join(dict.fromkeys(op.where for op in self.ops)) or "<no op>"

    def describe(self) -> str:
        buf, off = (self.srcbuf, self.srcoff) if self.type == "s" else (self.dstbuf, self.dstoff)
        span = f"{off}" if self.cnt == 1 else f"{off}:{off + self.cnt}"
        return f"{self.type} {buf}[{span}] on rank {self.rank} (from {self.where})"


@dataclass
class InstrDAG:
    instrs: List[Instr]
    succs: List[List[int]]            # processing edges, same rank
    preds: List[List[int]]
    send_to: List[int]                # communication edge: send -> receive, -1 if none
    recv_from: List[int]
    plan: BufferPlan
    # Per writing instruction (before fusion only): readers of the value it
    # wrote, and whether all its chunks are overwritten by a pure write (or
    # are scratch nobody touches again) before any other read.
    value_readers: List[frozenset] = field(default_factory=list)
    value_dies: List[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.instrs)


def _pieces(op: Op, src: Tuple[str, int], dst: Tuple[str, int], plan: BufferPlan, split: bool):
    """(src index, dst index, count) runs of `op` that replication maps to contiguous ranges."""
    count = op.dst.count
    if not split or count == 1:
        return [(src[1], dst[1], count)]
    if op.parallel > 1:
        return [(src[1] + t, dst[1] + t, 1) for t in range(count)]
    cuts = {0, count}
    for rank, (buf, idx) in ((op.src.rank, src), (op.dst.rank, dst)):
        c = plan.block_size(rank, buf)
        first = (idx // c + 1) * c - idx
        cuts.update(range(first, count, c))
    edges = sorted(cuts)
    return [(src[1] + a, dst[1] + a, b - a) for a, b in zip(edges, edges[1:])]


def build_instr_dag(chunks: ChunkDAG, plan: BufferPlan) -> InstrDAG:
    """The Chunk DAG's op nodes, in its order, as instructions linked per rank and chunk."""
    instrs: List[Instr] = []
    send_to: List[int] = []
    recv_from: List[int] = []
    split = plan.factor > 1
    for op in chunks.ops:
        if op.src.count != op.dst.count:
            raise LoweringError(f"{op.where}: {op.kind} of {op.src} into {op.dst}: counts differ")
        if op.kind not in ("copy", "reduce") and op.kind not in COMPUTE:
            raise LoweringError(f"{op.where}: unknown op kind {op.kind!r}")
        src = plan.canonical(op.src.rank, op.src.buffer, op.src.index)
        dst = plan.canonical(op.dst.rank, op.dst.buffer, op.dst.index)
        local_tb = op.sendtb if op.sendtb is not None else op.recvtb
        if op.kind in COMPUTE:
            # A compute producer: one local instruction writing dst, which reads no chunk
            # (src repeats dst, as a receive's does), so what consumes a chunk depends on
            # the compute of that chunk only.  Ranges and chunks move together, so replication
            # (which would split one chunk into several) is refused in `lower`.
            # One that reads a chunk (agemm: the A rows that arrived) names it as its src.
            s = src if OPCODES[op.kind].local_in else dst
            instrs.append(Instr(len(instrs), op.dst.rank, op.kind, s[0], s[1], dst[0], dst[1], op.dst.count,
                                ch=op.ch, tb=local_tb, parallel=op.parallel, ops=(op,), compute=op.compute))
            send_to.append(-1)
            recv_from.append(-1)
            continue
        for si, di, cnt in _pieces(op, src, dst, plan, split):
            if not op.remote:
                kind = "cpy" if op.kind == "copy" else "re"
                instrs.append(Instr(len(instrs), op.src.rank, kind, src[0], si, dst[0], di, cnt,
                                    ch=op.ch, tb=local_tb, parallel=op.parallel, ops=(op,)))
                send_to.append(-1)
                recv_from.append(-1)
                continue
            s = Instr(len(instrs), op.src.rank, "s", src[0], si, src[0], si, cnt, send_peer=op.dst.rank,
                      ch=op.ch, tb=op.sendtb, parallel=op.parallel, ops=(op,))
            r = Instr(len(instrs) + 1, op.dst.rank, "r" if op.kind == "copy" else "rrc", dst[0], di, dst[0], di,
                      cnt, recv_peer=op.src.rank, ch=op.ch, tb=op.recvtb, parallel=op.parallel, ops=(op,))
            instrs += (s, r)
            send_to += (r.id, -1)
            recv_from += (-1, s.id)
    dag = InstrDAG(instrs=instrs, succs=[], preds=[], send_to=send_to, recv_from=recv_from, plan=plan)
    _link(dag)
    return dag


def _reads_writes(x: Instr):
    t = x.type
    if t == "s":
        return (x.srcbuf, x.srcoff), None
    if t == "r" or (t in COMPUTE and not OPCODES[t].local_in):
        return None, (x.dstbuf, x.dstoff)
    if t == "cpy":
        return (x.srcbuf, x.srcoff), (x.dstbuf, x.dstoff)
    # rrc reads its destination; re reads both its source and its destination
    return (x.srcbuf, x.srcoff), (x.dstbuf, x.dstoff)


def _link(dag: InstrDAG) -> None:
    n = len(dag.instrs)
    preds: List[set] = [set() for _ in range(n)]
    last_writer: Dict[tuple, int] = {}
    readers: Dict[tuple, List[int]] = {}
    value_readers: List[set] = [set() for _ in range(n)]
    overwritten = [0] * n
    for x in dag.instrs:
        rd, wr = _reads_writes(x)
        me = x.id
        p = preds[me]
        rank = x.rank
        if rd is not None:
            buf, off = rd
            for idx in range(off, off + x.cnt):
                loc = (rank, buf, idx)
                w = last_writer.get(loc)
                if w is not None:
                    p.add(w)
                    value_readers[w].add(me)
                readers.setdefault(loc, []).append(me)
        if x.type == "re":
            for idx in range(x.dstoff, x.dstoff + x.cnt):
                loc = (rank, x.dstbuf, idx)
                w = last_writer.get(loc)
                if w is not None:
                    p.add(w)
                    value_readers[w].add(me)
                readers.setdefault(loc, []).append(me)
        if wr is not None:
            buf, off = wr
            pure = x.type in ("r", "cpy") or x.type in COMPUTE
            for idx in range(off, off + x.cnt):
                loc = (rank, buf, idx)
                rs = readers.get(loc)
                w = last_writer.get(loc)
                if rs:
                    p.update(rs)
                elif w is not None:
                    p.add(w)
                if w is not None and pure:
                    overwritten[w] += 1
                last_writer[loc] = me
                readers[loc] = []
        p.discard(me)
    # Scratch is dead once the program ends: its last value need not be
    # stored beyond the reads already recorded in value_readers.
    for (rank, buf, idx), w in last_writer.items():
        if buf == "s":
            overwritten[w] += 1
    dag.preds = [sorted(p) for p in preds]
    succs: List[List[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(dag.preds):
        for u in ps:
            succs[u].append(v)
    dag.succs = succs
    dag.value_readers = [frozenset(v) for v in value_readers]
    dag.value_dies = [overwritten[x.id] == x.cnt for x in dag.instrs]


def topological_order(dag: InstrDAG) -> List[int]:
    """Kahn's order over processing and communication edges; LoweringError on a cycle."""
    n = len(dag.instrs)
    indeg = [len(p) for p in dag.preds]
    for v, u in enumerate(dag.recv_from):
        if u >= 0:
            indeg[v] += 1
    queue = deque(i for i in range(n) if indeg[i] == 0)
    order: List[int] = []
    succs, send_to = dag.succs, dag.send_to
    while queue:
        u = queue.popleft()
        order.append(u)
        for v in succs[u]:
            indeg[v] -= 1
            if not indeg[v]:
                queue.append(v)
        v = send_to[u]
        if v >= 0:
            indeg[v] -= 1
            if not indeg[v]:
                queue.append(v)
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i])
        raise LoweringError(f"internal: the instruction DAG has a cycle through {dag.instrs[stuck].describe()}")
    return order


def depths(dag: InstrDAG) -> Tuple[List[int], List[int]]:
    """(depth, reverse depth): longest path from a source and to a sink, in edges."""
    order = topological_order(dag)
    n = len(order)
    depth = [0] * n
    rdepth = [0] * n
    succs, send_to = dag.succs, dag.send_to
    for u in order:
        d = depth[u] + 1
        for v in succs[u]:
            if depth[v] < d:
                depth[v] = d
        v = send_to[u]
        if v >= 0 and depth[v] < d:
            depth[v] = d
    for u in reversed(order):
        best = -1
        for v in succs[u]:
            if rdepth[v] > best:
                best = rdepth[v]
        v = send_to[u]
        if v >= 0 and rdepth[v] > best:
            best = rdepth[v]
        rdepth[u] = best + 1
    return depth, rdepth
