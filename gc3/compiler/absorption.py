"""Pass 2a: absorption of a local producer or consumer into a receive-reduce.

Runs on the Instruction DAG right before fusion, and only when fusion is on
(`lower(..., absorption=False)` / `gc3 compile --no-absorption` turn it off
alone, to reproduce schedules compiled before it existed).

* receive absorption: `r` X then `re` D <- D op X, where X's value is read by
  that `re` alone and dies after it, becomes one `rrc` (src = dst = D) that
  receives, reduces with D and stores D.  The received tile never lands in X,
  and the cross-threadblock hop from the receive to the reduction goes away.
* copy absorption: `cpy` S -> D whose value is read only by an `rrc` reducing
  into D becomes that `rrc` reading S directly (src = S, dst = D).

Receive absorption is kept out of multi-source reductions (D's value was made
by an `re`, or an `re` reads the result): there the fan-in of local `re`s runs
in parallel with the receives, which one serial `rrc` per source would lose.

The reduction's operand order changes (received op local instead of local op
received); every reduction gc3 supports is commutative.

Scratch that only the absorbed instructions touched is no longer named by any
step; `lower` then sizes the IR's scratch (`s_chunks`) from what the program
still names (`replication.fit_scratch`), so the runtime allocates no scratch
it never uses (the 2-rank one-shot AllReduce needs none at all).  An `rrs`
still names its unwritten dst, so scratch it points into stays allocated.
Without absorption, scratch keeps its declared size.

The DAG keeps `value_readers` / `value_dies` for fusion's `rrcs` -> `rrs`
decision, remapped to the new ids: the merged `rrc` writes what the `re`
wrote, and a value the absorbed `cpy` read is now read by its `rrc`.  Neither
rewrite moves a write earlier or adds one, so a value that died before still
dies before anyone else reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Set, Tuple

from .instruction_dag import Instr, InstrDAG, hints_agree

__all__ = ["absorb"]


def _overlap(buf_a: str, off_a: int, buf_b: str, off_b: int, cnt: int) -> bool:
    return buf_a == buf_b and off_a < off_b + cnt and off_b < off_a + cnt


@dataclass
class _Work:
    """The DAG being rewritten: edges as sets, so each rewrite is local."""

    instrs: List[Instr]
    succs: List[Set[int]]
    preds: List[Set[int]]
    send_to: List[int]
    recv_from: List[int]
    readers: List[Set[int]]
    merged_into: List[int]             # -1: alive; else the instruction that absorbed it
    # A topological position per instruction, to keep ancestor searches to
    # the instructions between two positions.  Trace order is one (build()
    # only links earlier to later instructions, and merging keeps that); an
    # edge added against it moves the instructions in between (Pearce-Kelly).
    pos: List[int]

    @classmethod
    def of(cls, dag: InstrDAG) -> "_Work":
        n = len(dag.instrs)
        return cls(instrs=list(dag.instrs), succs=[set(s) for s in dag.succs], preds=[set(p) for p in dag.preds],
                   send_to=list(dag.send_to), recv_from=list(dag.recv_from),
                   readers=[set(r) for r in dag.value_readers], merged_into=[-1] * n, pos=list(range(n)))

    def _outs(self, u: int) -> List[int]:
        v = self.send_to[u]
        return [*self.succs[u], v] if v >= 0 else list(self.succs[u])

    def _ins(self, u: int) -> List[int]:
        p = self.recv_from[u]
        return [*self.preds[u], p] if p >= 0 else list(self.preds[u])

    def _reach(self, start: int, step, inside) -> List[int]:
        seen = {start}
        work = [start]
        while work:
            u = work.pop()
            for x in step(u):
                if x not in seen and inside(self.pos[x]):
                    seen.add(x)
                    work.append(x)
        return list(seen)

    def add_edge(self, u: int, v: int) -> None:
        """u -> v; the caller knows v does not reach u."""
        self.succs[u].add(v)
        self.preds[v].add(u)
        pos = self.pos
        lo, hi = pos[v], pos[u]
        if lo < hi:
            # v and what it reaches before u's place move after u and what reaches u.
            after = self._reach(v, self._outs, lambda q: q < hi)
            before = self._reach(u, self._ins, lambda q: q > lo)
            slots = sorted(pos[x] for x in after + before)
            ordered = sorted(before, key=pos.__getitem__) + sorted(after, key=pos.__getitem__)
            for x, q in zip(ordered, slots):
                pos[x] = q

    def is_ancestor_of_any(self, targets: Set[int], v: int) -> bool:
        """Whether any of `targets` reaches `v` (processing or communication edges)."""
        pos = self.pos
        # Only instructions placed between a target and v can lie on a path.
        targets = {t for t in targets if pos[t] < pos[v]}
        if not targets:
            return False
        lo = min(pos[t] for t in targets)
        seen = {v}
        work = [v]
        while work:
            for p in self._ins(work.pop()):
                if p in targets:
                    return True
                if p not in seen and pos[p] > lo:
                    seen.add(p)
                    work.append(p)
        return False


def _receive_pairs(dag: InstrDAG) -> List[Tuple[int, int]]:
    """(r, re) pairs that one `rrc` can replace, judged on the traced program."""
    instrs = dag.instrs
    pairs = []
    for x in instrs:
        if x.type != "r" or not dag.value_dies[x.id] or len(dag.value_readers[x.id]) != 1:
            continue
        (y_id,) = dag.value_readers[x.id]
        y = instrs[y_id]
        if (y.type != "re" or (y.srcbuf, y.srcoff, y.cnt) != (x.dstbuf, x.dstoff, x.cnt)
                or y.parallel != x.parallel or not hints_agree(x.ch, y.ch) or not hints_agree(x.tb, y.tb)
                or _overlap(y.srcbuf, y.srcoff, y.dstbuf, y.dstoff, y.cnt)
                or dag.succs[x.id] != [y_id]):
            continue
        # Part of a fan-in chain: leave it to the parallel local reductions.
        if any(instrs[v].type == "re" for v in dag.value_readers[y_id]):
            continue
        if any(p != x.id and instrs[p].type == "re" and y_id in dag.value_readers[p] for p in dag.preds[y_id]):
            continue
        pairs.append((x.id, y_id))
    return pairs


def _absorb_receive(w: _Work, r: int, e: int) -> None:
    x, y = w.instrs[r], w.instrs[e]
    # The merged instruction stands where the reduction stood, keeping its id.
    w.instrs[e] = replace(y, id=e, type="rrc", srcbuf=y.dstbuf, srcoff=y.dstoff, send_peer=-1,
                          recv_peer=x.recv_peer, ch=x.ch if x.ch is not None else y.ch,
                          tb=x.tb if x.tb is not None else y.tb, ops=x.ops + y.ops)
    for p in w.preds[r]:
        w.succs[p].discard(r)
        w.add_edge(p, e)
    w.preds[e].discard(r)
    w.preds[r] = set()
    w.succs[r] = set()
    s = w.recv_from[r]
    w.send_to[s] = e
    w.recv_from[e] = s
    w.recv_from[r] = -1
    w.readers[r] = set()
    w.merged_into[r] = e


def _copy_absorbable(w: _Work, c: int) -> Optional[int]:
    """The `rrc` that can read the copy's source directly, or None."""
    x = w.instrs[c]
    if len(w.readers[c]) != 1:
        return None
    (y_id,) = w.readers[c]
    y = w.instrs[y_id]
    if (y.type != "rrc" or (y.srcbuf, y.srcoff) != (x.dstbuf, x.dstoff) or (y.dstbuf, y.dstoff) != (x.dstbuf, x.dstoff)
            or y.cnt != x.cnt or y.parallel != x.parallel
            or _overlap(x.srcbuf, x.srcoff, x.dstbuf, x.dstoff, x.cnt)):
        return None
    # The rrc now reads S later than the cpy did: nothing may overwrite S in
    # between.  Writers of S after the cpy are its successors; those already
    # ordered before the rrc would clobber what it reads.
    later = w.succs[c] - {y_id}
    if later and w.is_ancestor_of_any(later, y_id):
        return None
    return y_id


def _absorb_copy(w: _Work, c: int, y_id: int) -> None:
    x, y = w.instrs[c], w.instrs[y_id]
    w.instrs[y_id] = replace(y, id=y_id, srcbuf=x.srcbuf, srcoff=x.srcoff, ops=x.ops + y.ops)
    for p in w.preds[c]:
        w.succs[p].discard(c)
        if p != y_id:
            w.add_edge(p, y_id)
        if c in w.readers[p]:
            w.readers[p].discard(c)
            w.readers[p].add(y_id)
    w.preds[y_id].discard(c)
    for v in w.succs[c]:
        if v != y_id:
            w.preds[v].discard(c)
            w.add_edge(y_id, v)
    w.preds[c] = set()
    w.succs[c] = set()
    w.readers[c] = set()
    w.merged_into[c] = y_id


def absorb(dag: InstrDAG) -> InstrDAG:
    """Receive absorption, then copy absorption (which may use the `rrc`s the first made)."""
    pairs = _receive_pairs(dag)
    made = {e for _, e in pairs}
    instrs, value_readers = dag.instrs, dag.value_readers
    # Only a copy whose one reader is (or is about to become) an rrc can go.
    copies = [x.id for x in instrs if x.type == "cpy" and len(value_readers[x.id]) == 1
              and any(instrs[v].type == "rrc" or v in made for v in value_readers[x.id])]
    if not pairs and not copies:
        return dag
    w = _Work.of(dag)
    for r, e in pairs:
        _absorb_receive(w, r, e)
    for c in copies:
        y = _copy_absorbable(w, c)
        if y is not None:
            _absorb_copy(w, c, y)
    if all(m < 0 for m in w.merged_into):
        return dag
    return _renumbered(w, dag)


def _renumbered(w: _Work, dag: InstrDAG) -> InstrDAG:
    n_old = len(w.instrs)
    new_id = [-1] * n_old
    kept: List[Instr] = []
    for i, x in enumerate(w.instrs):
        if w.merged_into[i] < 0:
            new_id[i] = len(kept)
            kept.append(x)
    for i, m in enumerate(w.merged_into):
        if m >= 0:
            new_id[i] = new_id[m]
    instrs = [replace(x, id=new_id[x.id]) for x in kept]
    n = len(instrs)
    succs: List[List[int]] = [[] for _ in range(n)]
    preds: List[List[int]] = [[] for _ in range(n)]
    send_to = [-1] * n
    recv_from = [-1] * n
    readers: List[frozenset] = [frozenset()] * n
    dies = [False] * n
    for old, x in zip((x.id for x in kept), instrs):
        a = x.id
        succs[a] = sorted({new_id[v] for v in w.succs[old]} - {a})
        v = w.send_to[old]
        if v >= 0:
            send_to[a] = new_id[v]
            recv_from[new_id[v]] = a
        readers[a] = frozenset(new_id[v] for v in w.readers[old]) - {a}
        dies[a] = dag.value_dies[old]
    for a, vs in enumerate(succs):
        for b in vs:
            preds[b].append(a)
    return InstrDAG(instrs=instrs, succs=succs, preds=preds, send_to=send_to, recv_from=recv_from, plan=dag.plan,
                    value_readers=readers, value_dies=dies)
