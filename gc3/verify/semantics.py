"""Semantic verification: the IR computes its collective, for every call size.

The IR is executed symbolically on chunk identities.  Every chunk slot of every
rank holds a `Sym`: the input chunks (rank, index) combined into it, or
nothing.  A copy or a send/receive moves a `Sym`; a reduction is a commutative
n-ary node, kept as one rank bitmask per input index, so a step costs
O(cnt) set operations on words and the whole run is linear in the program
size (plus the vector clocks below).  Reducing two values that share a leaf is
reported at once: a contribution counted twice is wrong for `sum`.  Reading a
slot nothing has written is reported too (it would read poison or stale data).
At the end every output chunk that the postcondition specifies must hold
exactly its expression; the first that differs is reported with the step that
last wrote it.

Compute leaves.  In a fused IR (`fused="1"`, `gc3.ir.ComputeSpec`) no chunk
holds data at the start: a compute step creates its leaves, `gemv(rank, j)`
for column block j of rank's partial product x_rank @ w_rank (a `Sym` of kind
"gemv"), `ebag(rank, j)` for sample block j of rank's pooled tables, and the
collective's postcondition is read over those leaves in place of input chunks
(AllReduce: output chunk j = sum_r gemv(r, j); AllToAll: output chunk r*c+i
of rank p = ebag(r, p*c+i)).  A step computing a range that is not exactly the
blocks of its destination chunks (shifted, or a different width) is rejected,
so the proof still says which columns or samples every output chunk holds.
`gemm(rank, j)` is row block j of rank's a @ b (with a skewed AllToAll split,
j is the padded grid's chunk, `ComputeSpec.block_chunk`).  An `agemm` step
(AllGather + GEMM) reads its src chunks, which must each hold one input chunk
in(p, i) (an A row block as the caller gave it) whose rows are the ones the
step names; it makes agemm(rank, p*c + i), and the IR's <postcondition> asks
output chunk j of rank r to hold agemm(r, j); with return_a (the gathered A
after C's n*c chunks) output chunk n*c + j asks for the input chunk in(p, i)
itself, as an AllGather's would (`ComputeSpec.output_leaf_kind`).

Cost.  The symbolic run is O(sum of cnt) slot operations; each step also
joins a vector clock of T entries (T threadblocks in all) with numpy, and a
clock lives only while its threadblock runs.  Building a built-in
postcondition lists n terms per reduced output chunk (the specification's own
size).  A 64-rank ring AllReduce (8128 steps) takes about 0.3 s.

Order.  One run in one order proves nothing about other interleavings, so the
run also tracks happens-before with vector clocks (one entry per threadblock):
program order, `depid`/`deps`, and the k-th send before the k-th receive of a
connection.  FIFO back-pressure is not counted: it orders nothing the
runtime's protocol promises.  Any two accesses of one slot that are not both
reads must be ordered, otherwise the result may depend on the interleaving and
the IR is rejected, whatever order this run took.  A race-free program is
deterministic: every execution sees each read return the value of the same
write, so the result of this one run is the result of all of them.  Deadlock
freedom (checked before, `deadlock.py`) says that every execution completes.

Why chunk granularity covers every call size.  `gc3/ir/layout.py` maps a call
of any element count onto the chunks: a user buffer is blocks of c chunks;
chunk j of every block has the same length len(j) (non-increasing in j, some
may be 0), scratch chunks are always full; a step moves whole chunks lane by
lane, lanes past a user chunk's end read as zero and are not written.  So
every lane l is a copy of the same chunk-level program, run on lane l of each
chunk.  Lane l of a leaf in(r, k) is real data when l < len(k mod c) and zero
otherwise; a reduction of zeros is zero for every op; and the postconditions
only pair an output chunk at in-block position j with input chunks at the same
position j.  The one way the chunk-level result could differ from a lane's is
a value losing lanes when stored into a user chunk shorter than the data it
carries: storing a value whose leaves sit at positions p into a user chunk at
position q > min(p) is lossy for some call size (len(q) < len(p) there), so
such a store marks the value `lossy` and a lossy value never satisfies a
postcondition.  Everything else is exact at every lane for every size, so a
proof at chunk granularity is a proof for every count the runtime accepts.
`tests/test_semantics.py` compares with `gc3 simulate` on odd sizes.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..errors import (DeadlockError, DuplicateContributionError, PostconditionUnprovableError, RaceError,
                      SemanticError, UnwrittenReadError)
from ..ir.opcodes import OPCODES, STEP_VALUE
from ..ir import Postcondition, Program, local_input, local_output
from ..ir import collectives as C
from ..ir.layout import layout_for
from .model import Model

BUILTIN = C.NCCL_COLLECTIVES   # known without being told; any other carries its postcondition

_SHOWN = 6


class Sym:
    """What a chunk slot holds: for each input index, the ranks whose chunk at that
    index were reduced in (one rank and one index: a plain copy of an input)."""

    __slots__ = ("terms", "minpos", "lossy", "kind", "epi")

    def __init__(self, terms: Tuple[Tuple[int, int], ...], minpos: int, lossy: bool = False, kind: str = "in",
                 epi: Optional[Tuple[str, str, int]] = None):
        self.terms = terms        # sorted ((input index, rank bitmask), ...)
        self.minpos = minpos      # smallest in-block position of a leaf
        self.lossy = lossy        # passed through a user chunk that may be shorter than its data
        self.kind = kind          # what the leaves are: "in" (input chunks) or a compute operator ("gemv")
        # (epilogue text, memory buffer, chunk) when an epilogue was applied as it was stored
        # there: its bias/residual are indexed by that place, so it is part of the value
        self.epi = epi

    def leaves(self):
        for idx, mask in self.terms:
            r = 0
            while mask:
                if mask & 1:
                    yield r, idx
                mask >>= 1
                r += 1

    def __str__(self) -> str:
        names = [f"{self.kind}({r},{i})" for r, i in sorted(self.leaves())]
        text = "+".join(names) if len(names) <= _SHOWN else \
            f"sum of {len(names)} chunks " + "+".join(names[:3]) + "+...+" + names[-1]
        if self.epi is not None:
            text = f"{self.epi[0]} at {self.epi[1]}[{self.epi[2]}] of ({text})"
        return text + (" (truncated: stored in a shorter user chunk on the way)" if self.lossy else "")


def leaf(rank: int, index: int, pos: int, kind: str = "in") -> Sym:
    return Sym(((index, 1 << rank),), pos, kind=kind)


def reduce(a: Sym, b: Sym) -> Tuple[Sym, Optional[Tuple[int, int]]]:
    """a (+) b, and a leaf both contain (reduced twice) or None."""
    if a.kind != b.kind:    # cannot happen: a fused IR has no input leaves, a plain one no compute leaves
        raise SemanticError(f"reduces {a} with {b}: leaves of different kinds")
    merged = dict(a.terms)
    twice = None
    for idx, mask in b.terms:
        old = merged.get(idx, 0)
        if old & mask and twice is None:
            both = old & mask
            twice = ((both & -both).bit_length() - 1, idx)
        merged[idx] = old | mask
    return Sym(tuple(sorted(merged.items())), min(a.minpos, b.minpos), a.lossy or b.lossy, a.kind), twice


def from_terms(terms, c: int, kind: str = "in") -> Sym:
    """The Sym of input chunks `terms` ((rank, index), ...) of a layout with c chunks per block."""
    merged: Dict[int, int] = {}
    for r, idx in terms:
        merged[idx] = merged.get(idx, 0) | (1 << r)
    return Sym(tuple(sorted(merged.items())), min((idx % c for idx in merged), default=0), kind=kind)


def same(a: Sym, b: Sym) -> bool:
    return a.terms == b.terms and a.kind == b.kind and a.epi == b.epi and not a.lossy and not b.lossy


# --- postconditions -----------------------------------------------------------------
def builtin_collective(prog: Program):
    """The gc3.collectives object of an NCCL collective at the IR's chunk count, or None."""
    if prog.coll not in BUILTIN:
        return None
    n = prog.ngpus
    c = layout_for(prog, 0, 0).chunks_per_block
    root = root_of(prog)
    return {"allreduce": lambda: C.AllReduce(n, c), "allgather": lambda: C.AllGather(n, c),
            "reducescatter": lambda: C.ReduceScatter(n, c), "alltoall": lambda: C.AllToAll(n, c),
            "broadcast": lambda: C.Broadcast(n, c, root=root), "reduce": lambda: C.Reduce(n, c, root=root)
            }[prog.coll]()


def builtin_postcondition(prog: Program) -> Postcondition:
    """Output chunk -> input chunks of an NCCL collective at the IR's chunk count."""
    n = prog.ngpus
    coll = builtin_collective(prog)
    post: Postcondition = {}
    for r in range(n):
        for j in range(coll.output_size(r)):
            v = coll.postcondition(r, j)
            if v is not None:
                post[(r, j)] = v.terms      # sorted, as every Value's
    return post


def root_of(prog: Program) -> int:
    """The root of a broadcast/reduce IR: its <algo root=...>, else 0 (as `gc3 simulate` assumes)."""
    raw = prog.extra.get("root")
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= prog.ngpus:
        raise SemanticError(f"<algo root={raw!r}> is not a rank of {prog.ngpus}")
    return int(raw)


def postcondition_of(prog: Program) -> Postcondition:
    if prog.postcondition is not None:
        for (r, j), terms in prog.postcondition.items():
            if not 0 <= r < prog.ngpus or j < 0 or any(not 0 <= s < prog.ngpus or i < 0 for s, i in terms):
                raise SemanticError(f"the postcondition names rank {r} output chunk {j} = {terms}, outside the "
                                    f"program's {prog.ngpus} ranks")
        return prog.postcondition
    if prog.coll in BUILTIN:
        return builtin_postcondition(prog)
    raise PostconditionUnprovableError(
        f"collective {prog.coll!r} is not one gc3 knows ({', '.join(BUILTIN)}) and the IR carries no "
        f"<postcondition>: nothing says what it must compute, so it cannot be proven")


# --- memory ---------------------------------------------------------------------------
class _Slot:
    __slots__ = ("value", "writer", "wclock", "reads")

    def __init__(self, value: Optional[Sym] = None):
        self.value = value
        self.writer = -1                  # tid of the last writer (-1: the caller, before the collective)
        self.wclock = 0                   # its epoch
        self.reads: Dict[int, int] = {}   # tid -> epoch of reads since that write


class _Rank:
    """One rank's chunk slots, with in-place aliasing resolved as the simulator does."""

    def __init__(self, prog: Program, rank: int, coll=None):
        c_layout = layout_for(prog, 0, rank)
        self.c = c = c_layout.chunks_per_block
        # One element per chunk: the layout's element offsets are chunk offsets.
        L = layout_for(prog, c_layout.blocks_in * c, rank)
        size = {"i": L.blocks_in * c, "o": L.blocks_out * c, "s": L.s_chunks}
        self.nin = size["i"]              # input chunks: the index space of a fused IR's compute leaves
        self.alias: Optional[Tuple[str, str, int]] = None
        if prog.inplace:
            base, off = L.inplace_offset(rank)
            self.alias = ("o" if base == "i" else "i", base, off)
        self.slots: Dict[str, List[_Slot]] = {}
        for buf in ("i", "o", "s"):
            if self.alias is None or buf != self.alias[0]:
                self.slots[buf] = [_Slot() for _ in range(size[buf])]
        # fused: compute steps make every leaf, unless the operator reads chunks (agemm: A rows)
        given = not prog.fused or OPCODES[prog.compute.op].local_in is not None
        for k in range(size["i"] if given else 0):
            # An input NCCL does not read (a broadcast's, off the root) holds nothing to rely on.
            if coll is None or coll.precondition(rank, k):
                b, j = self.location("i", k)
                self.slots[b][j].value = leaf(rank, k, k % c)

    def location(self, buf: str, index: int) -> Tuple[str, int]:
        if self.alias is not None and buf == self.alias[0]:
            return self.alias[1], index + self.alias[2]
        return buf, index

    def position(self, buf: str) -> Optional[int]:
        return None if buf == "s" else self.c


@dataclass
class _Msg:
    values: List[Sym]
    clock: np.ndarray
    sender: Tuple[int, int]   # (tid, step)


class _Run:
    def __init__(self, m: Model):
        self.m = m
        prog = m.prog
        self.conv = prog.convention
        coll = builtin_collective(prog)
        self.ranks = [_Rank(prog, r, coll) for r in range(prog.ngpus)]
        # A threadblock's clock exists from its first step to its last: a
        # finished one's knowledge lives on in its messages and snapshots, and
        # one still waiting for its first step knows nothing yet.  So memory is
        # (threadblocks running at once) x T, not T x T.
        self.T = len(m.tbs)
        self.vc: Dict[int, np.ndarray] = {}
        self.snap: Dict[Tuple[int, int], np.ndarray] = {}
        self.wanted = {(m.index[(t.rank, st.depid)], st.deps) for t in m.tbs for st in t.steps if st.depid >= 0}
        self.place = None   # (steps, epilogue) while place_epilogue marks the steps that get it

    def where(self, tid: int, step: int) -> str:
        return self.m.tbs[tid].at(step)

    # --- accesses ---------------------------------------------------------------
    def _ordered(self, tid: int, vc: np.ndarray, other: int, epoch: int) -> bool:
        return other < 0 or other == tid or epoch <= vc[other]

    def read(self, tid: int, step: int, rank: int, buf: str, off: int, cnt: int) -> List[Sym]:
        mem = self.ranks[rank]
        vc = self.vc[tid]
        out = []
        for j in range(off, off + cnt):
            b, k = mem.location(buf, j)
            slot = mem.slots[b][k]
            if not self._ordered(tid, vc, slot.writer, slot.wclock):
                raise RaceError(self._race(rank, b, k, "read/write", slot.writer, slot.wclock - 1, tid, step))
            if slot.value is None:
                why = ("an input the collective does not provide on this rank (NCCL reads only the root's)"
                       if buf == "i" and b == "i" else "which nothing has written")
                raise UnwrittenReadError(
                    f"{self.where(tid, step)} reads {_name(buf, j, b, k)} on rank {rank}, {why}: it would read "
                    f"whatever the buffer held")
            slot.reads[tid] = step + 1
            out.append(slot.value)
        return out

    def write(self, tid: int, step: int, rank: int, buf: str, off: int, values: List[Sym], epilogue=None) -> None:
        mem = self.ranks[rank]
        vc = self.vc[tid]
        if buf == "i" and mem.alias is None:
            raise SemanticError(
                f"{self.where(tid, step)} writes i[{off}:{off + len(values)}] on rank {rank}: an out-of-place "
                f"call's input is the caller's send buffer, which a collective must leave as it was")
        for n, v in enumerate(values):
            b, k = mem.location(buf, off + n)
            slot = mem.slots[b][k]
            if not self._ordered(tid, vc, slot.writer, slot.wclock):
                raise RaceError(self._race(rank, b, k, "write/write", slot.writer, slot.wclock - 1, tid, step))
            for rt, epoch in slot.reads.items():
                if not self._ordered(tid, vc, rt, epoch):
                    raise RaceError(self._race(rank, b, k, "read/write", rt, epoch - 1, tid, step))
            c = mem.position(b)
            if c is not None and k % c > v.minpos and not v.lossy:
                v = Sym(v.terms, v.minpos, True, v.kind, v.epi)
            if epilogue is not None:
                if v.epi is not None:
                    raise SemanticError(
                        f"{self.where(tid, step)} on rank {rank} applies the epilogue {epilogue} to {v}, which "
                        f"already went through one: the epilogue would apply twice")
                v = Sym(v.terms, v.minpos, v.lossy, v.kind, (epilogue.text, b, k))
            slot.value, slot.writer, slot.wclock, slot.reads = v, tid, step + 1, {}

    def _no_partial_overlap(self, tid: int, step: int, rank: int, src, dst, cnt: int) -> None:
        """A step may read and write the very same chunks (elementwise, in place),
        but not overlapping different ones: the runtime moves a tile's chunks in
        no promised order, so the result would depend on it."""
        mem = self.ranks[rank]
        (sb, so), (db, do) = mem.location(*src), mem.location(*dst)
        if sb == db and so != do and so < do + cnt and do < so + cnt:
            raise SemanticError(
                f"{self.where(tid, step)} on rank {rank} reads {sb}[{so}:{so + cnt}] and writes {db}[{do}:{do + cnt}], "
                f"which overlap without being the same chunks: the result depends on the copy order")

    def _race(self, rank, b, k, kind, t1, s1, t2, s2) -> str:
        return (f"{kind} race on rank {rank} {b}[{k}]: {self.where(t1, s1)} and {self.where(t2, s2)} are not "
                f"ordered by program order, dependencies or send/receive, so the result depends on the "
                f"interleaving")

    def reduced(self, tid: int, step: int, rank: int, a: List[Sym], b: List[Sym]) -> List[Sym]:
        out = []
        for x, y in zip(a, b):
            done = x if x.epi is not None else y if y.epi is not None else None
            if done is not None:
                raise SemanticError(
                    f"{self.where(tid, step)} on rank {rank} reduces {done}, a value its epilogue already "
                    f"transformed: the epilogue belongs on the final value only")
            v, twice = reduce(x, y)
            if twice is not None:
                raise DuplicateContributionError(
                    f"{self.where(tid, step)} on rank {rank} reduces {x.kind}({twice[0]},{twice[1]}) into a value "
                    f"that already contains it ({x} with {y}): that contribution would count twice")
            out.append(v)
        return out

    # --- one step --------------------------------------------------------------------
    def execute(self, tid: int, k: int, msg: Optional[_Msg]) -> Optional[_Msg]:
        tb = self.m.tbs[tid]
        st = tb.steps[k]
        r, cnt, t = tb.rank, st.cnt, st.type
        vc = self.vc[tid]
        vc[tid] = k + 1
        value = STEP_VALUE[t]
        if value is None:
            return None
        src = local_input(st, self.conv)
        dst = local_output(st, self.conv)
        if src is not None and dst is not None:
            self._no_partial_overlap(tid, k, r, src, dst, cnt)
        values = value(lambda a, b: self.reduced(tid, k, r, a, b),
                       lambda buf, off: self.read(tid, k, r, buf, off, cnt), src, dst, msg and msg.values,
                       lambda *operand: self.computed(tid, k, r, *operand))
        if self.place is not None and (tid, k) in self.place[0]:
            # A final store applies the epilogue unless its value already carries it (read
            # back from an output chunk that had it and forwarded); never half and half.
            carried = {v.epi is not None for v in values}
            if len(carried) > 1:
                raise SemanticError(f"{self.where(tid, k)} on rank {r} stores final chunks of which some already "
                                    f"went through the epilogue and some did not: no one step attribute serves")
            if carried == {False}:
                st.epilogue = self.place[1]
        if dst is not None:
            self.write(tid, k, r, dst[0], dst[1], values, st.epilogue)
        elif st.epilogue is not None:
            raise SemanticError(f"{self.where(tid, k)} on rank {r}: a {t} step stores nothing, so it cannot "
                                f"carry an epilogue ({st.epilogue})")
        if st.info.send:
            return _Msg(values, vc.copy(), (tid, k))
        return None

    def computed(self, tid: int, step: int, rank: int, operand: Optional[List[Sym]] = None) -> List[Sym]:
        """The leaves a compute step makes: with the operator's split axis (gemv: N columns
        of y; ebag: B samples) cut into K blocks of w = length / K units, K the rank's
        input chunks (the collective's input index space: c for an AllReduce, N*c for an
        AllToAll), dst chunk q holds leaf col0/w + q.  A range that is not exactly those
        blocks (shifted by any amount, or a different width) means the destination chunks
        would hold data the layout does not put there: rejected here."""
        st = self.m.tbs[tid].steps[step]
        mem = self.ranks[rank]
        op = self.m.prog.compute.op
        axis, n, _ = self.m.prog.compute.split()
        if operand is not None:
            return self._computed_from(tid, step, rank, st, operand)
        spec = self.m.prog.compute
        k = sum(spec.splits) if spec.splits else mem.nin     # row blocks (skewed: fewer than chunks)
        if not k or n % k:
            raise SemanticError(f"the {op} output has {n} {axis}s, not a multiple of the {k} input chunks: "
                                f"a chunk would not hold a whole {axis} block")
        w = n // k
        a, b = st.compute.col0, st.compute.col1
        if a % w or b - a != st.cnt * w:
            raise SemanticError(
                f"{self.where(tid, step)} on rank {rank} computes {axis}s [{a}, {b}) of {op} into {st.cnt} chunk(s) "
                f"of {w} {axis}s each: not whole {axis} blocks [{w}*j, {w}*(j+{st.cnt})), so the chunks would not "
                f"hold the {axis}s the layout puts there")
        idx = [spec.block_chunk(a // w + q) for q in range(st.cnt)]
        return [leaf(rank, i, i % mem.c, op) for i in idx]

    def _computed_from(self, tid: int, step: int, rank: int, st, operand: List[Sym]) -> List[Sym]:
        """agemm: src chunk q must hold exactly one input chunk in(p, i), an A row block of rank
        p, and the step's rows must be that block's rows of the gathered A (block p*c + i, c
        chunks per rank); dst chunk q then holds leaf agemm(rank, p*c + i): block p*c + i of
        C computed with this rank's b (the rank is part of the leaf, so a block computed
        elsewhere, with another rank's b, never satisfies the postcondition)."""
        mem = self.ranks[rank]
        op = self.m.prog.compute.op
        _, m, _ = self.m.prog.compute.split()
        c, nranks = mem.nin, len(self.ranks)
        w = m // (nranks * c) if c and m % (nranks * c) == 0 else 0
        a, b = st.compute.col0, st.compute.col1
        out = []
        for q, v in enumerate(operand):
            leaves = list(v.leaves())
            if v.kind != "in" or len(leaves) != 1:
                raise SemanticError(f"{self.where(tid, step)} on rank {rank} computes {op} of {v}: its src chunk "
                                    f"must hold one row block of A as the caller gave it")
            p, i = leaves[0]
            block = p * c + i
            if not w or a + q * w != block * w or b - a != len(operand) * w:
                raise SemanticError(
                    f"{self.where(tid, step)} on rank {rank} says rows [{a}, {b}) but its src chunk {q} holds A "
                    f"block {block} (rows [{block * w}, {(block + 1) * w})) of rank {p}")
            out.append(leaf(rank, block, block % c, op))
        return out

    def run(self) -> None:
        m = self.m
        pc = [0] * len(m.tbs)
        queues: Dict = {conn: deque() for conn in m.connections}
        parked: Dict[tuple, List[int]] = {}
        work = list(range(len(m.tbs) - 1, -1, -1))
        while work:
            t = work.pop()
            tb = m.tbs[t]
            while pc[t] < len(tb.steps):
                k = pc[t]
                st = tb.steps[k]
                key = None
                if st.depid >= 0:
                    d = m.index[(tb.rank, st.depid)]
                    if pc[d] <= st.deps:
                        key = ("dep", d, st.deps)
                if key is None and st.info.recv and not queues[tb.recv_conn]:
                    key = ("data", tb.recv_conn)
                if key is not None:
                    parked.setdefault(key, []).append(t)
                    break
                vc = self.vc.get(t)
                if vc is None:
                    vc = self.vc[t] = np.zeros(self.T, dtype=np.int32)
                if st.depid >= 0:
                    np.maximum(vc, self.snap[(m.index[(tb.rank, st.depid)], st.deps)], out=vc)
                msg = None
                if st.info.recv:
                    msg = queues[tb.recv_conn].popleft()
                    np.maximum(vc, msg.clock, out=vc)
                out = self.execute(t, k, msg)
                if out is not None:
                    queues[tb.send_conn].append(out)
                    work.extend(parked.pop(("data", tb.send_conn), ()))
                if (t, k) in self.wanted:
                    self.snap[(t, k)] = vc.copy()
                work.extend(parked.pop(("dep", t, k), ()))
                pc[t] = k + 1
            if pc[t] == len(tb.steps):
                self.vc.pop(t, None)
        stuck = [t for t in range(len(m.tbs)) if pc[t] < len(m.tbs[t].steps)]
        if stuck:  # deadlock.check ran first; reaching this is a verifier bug, not a user error
            raise DeadlockError(f"{self.where(stuck[0], pc[stuck[0]])} never runs")

    # --- the postcondition -----------------------------------------------------------
    def prove(self, post: Postcondition) -> int:
        prog = self.m.prog
        c = self.ranks[0].c if self.ranks else 1
        if any(mem.c != c for mem in self.ranks):
            raise SemanticError("the ranks' buffers have different chunks per block; gc3's layout needs them equal")
        seen: Dict[tuple, Sym] = {}     # the same expression for many chunks (allreduce: every rank)
        for (r, j) in sorted(post):
            terms = post[(r, j)]
            mem = self.ranks[r]
            kind = prog.compute.output_leaf_kind(j, len(self.ranks), mem.nin) if prog.fused else "in"
            want = seen.get((terms, kind))
            if want is None:
                want = seen[(terms, kind)] = from_terms(terms, c, kind)
            bad = [(rr, ii) for ii, mask in want.terms if ii % c != j % c for rr in (mask.bit_length() - 1,)]
            if bad:
                raise SemanticError(
                    f"the postcondition pairs output chunk {j} of rank {r} with input chunk in({bad[0][0]},"
                    f"{bad[0][1]}) at another in-block position; no chunk layout serves that for every size")
            b, k = mem.location("o", j)
            if k >= len(mem.slots[b]):
                raise SemanticError(f"rank {r}: the postcondition names output chunk {j}, but the output holds "
                                    f"{len(mem.slots[b])} chunks")
            if prog.epilogue is not None:
                want = Sym(want.terms, want.minpos, want.lossy, want.kind, (prog.epilogue.text, b, k))
            slot = mem.slots[b][k]
            got = slot.value
            if got is not None and same(got, want):
                continue
            stored = "" if (b, k) == ("o", j) else f" (in place: stored at {b}[{k}])"
            by = f"; last written by {self.where(slot.writer, slot.wclock - 1)}" if slot.writer >= 0 else \
                " (never written by the program)"
            detail = _difference(want, got) if got is not None else ""
            raise SemanticError(
                f"program {prog.name!r} does not compute {prog.coll}: rank {r} output chunk o[{j}]{stored} "
                f"should hold {want} but holds {got if got is not None else 'nothing'}{detail}{by}")
        return len(post)


def place_epilogue(prog: Program, epi) -> int:
    """Mark the steps of a plain, verified `prog` that must apply `epi` (a gc3.ir.epilogue.Epilogue):
    for every output chunk the postcondition specifies, the step that stores its final value,
    unless that value was read back from an output chunk that already had it.  Sets
    `prog.epilogue`; returns the number of steps marked.  The run is deterministic (the program
    is race-free), so `check` on the result proves each output chunk gets it exactly once."""
    from .model import build_model

    m = build_model(prog)
    post = postcondition_of(prog)
    first = _Run(m)
    first.run()
    finals = set()
    for (r, j) in post:
        mem = first.ranks[r]
        b, k = mem.location("o", j)
        slot = mem.slots[b][k]
        if slot.writer < 0:
            raise SemanticError(f"rank {r} output chunk {j} is never written by the program: no step can apply "
                                f"the epilogue {epi} to it")
        finals.add((slot.writer, slot.wclock - 1))
    for tid, k in sorted(finals):
        tb = m.tbs[tid]
        st = tb.steps[k]
        mem = first.ranks[tb.rank]
        dst = local_output(st, first.conv)
        for n in range(st.cnt):
            b, kk = mem.location(dst[0], dst[1] + n)
            slot = mem.slots[b][kk]
            if (slot.writer, slot.wclock - 1) != (tid, k):
                raise SemanticError(f"{tb.at(k)} on rank {tb.rank} stores final output chunks and {b}[{kk}], which a "
                                    f"later step overwrites: the epilogue would apply to a non-final value")
    for t in m.tbs:
        for st in t.steps:
            st.epilogue = None
    second = _Run(m)
    second.place = (finals, epi)
    second.run()
    prog.epilogue = epi
    return sum(st.epilogue is not None for t in m.tbs for st in t.steps)


def _name(buf: str, j: int, b: str, k: int) -> str:
    return f"{buf}[{j}]" + ("" if (b, k) == (buf, j) else f" (in place: {b}[{k}])")


def _difference(want: Sym, got: Sym) -> str:
    w, g = set(want.leaves()), set(got.leaves())
    parts = []
    if w - g:
        parts.append("missing " + ", ".join(f"{want.kind}({r},{i})" for r, i in sorted(w - g)[:_SHOWN]))
    if g - w:
        parts.append("extra " + ", ".join(f"{got.kind}({r},{i})" for r, i in sorted(g - w)[:_SHOWN]))
    return f" [{'; '.join(parts)}]" if parts else ""


def check(m: Model) -> int:
    """Prove `m.prog` computes its postcondition in every interleaving; return the
    number of output chunks proven.  Needs structure, FIFO order and deadlock checked."""
    post = postcondition_of(m.prog)
    run = _Run(m)
    run.run()
    return run.prove(post)
