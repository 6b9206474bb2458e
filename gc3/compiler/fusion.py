"""Pass 2: peephole fusion of a receive with the send that forwards it.

* `r` + `s` of the same slot -> `rcs` (receive, store, forward);
* `rrc` + `s` -> `rrcs` (receive, reduce, store, forward);
* `rrcs` whose stored result nobody else reads before it is overwritten (or
  that lands in scratch nobody reads again) -> `rrs` (receive, reduce,
  forward; nothing stored).

A send that reads exactly the receive's destination has that receive as its
only predecessor, so executing it together with the receive cannot break any
dependency.  When several sends forward the same receive, the one starting
the longest remaining path is fused, since that is the chain that gains most.

Two instructions are not fused when the user pinned them apart (different
`ch=`, or a receive `recvtb=` and a send `sendtb=` that differ), or when they
belong to different parallel fragments (their replicated sizes would differ).
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import List

from ..errors import ScheduleError
from ..ir.opcodes import SEND_FUSION
from .instruction_dag import Instr, InstrDAG, depths, hints_agree

__all__ = ["fuse"]

_FUSED = SEND_FUSION    # receive -> receive-and-send


def fuse(dag: InstrDAG) -> InstrDAG:
    instrs = dag.instrs
    _, rdepth = depths(dag)
    partner = [-1] * len(instrs)       # receive -> fused send
    absorbed = [False] * len(instrs)   # sends folded into a receive
    for x in instrs:
        if x.type not in _FUSED:
            continue
        best = -1
        for s in dag.succs[x.id]:
            y = instrs[s]
            if (y.type != "s" or absorbed[s] or y.srcbuf != x.dstbuf or y.srcoff != x.dstoff
                    or y.cnt != x.cnt or y.parallel != x.parallel or not hints_agree(x.ch, y.ch)
                    or not hints_agree(x.tb, y.tb) or len(dag.preds[s]) != 1):
                continue
            if best < 0 or rdepth[s] > rdepth[best]:
                best = s
        if best >= 0:
            partner[x.id] = best
            absorbed[best] = True

    _break_impossible_chains(dag, partner, absorbed)

    new_id: List[int] = [-1] * len(instrs)
    out = []
    for x in instrs:
        if absorbed[x.id]:
            continue
        new_id[x.id] = len(out)
        out.append(x)
    # An absorbed send lives on as its receive.
    for r, s in enumerate(partner):
        if s >= 0:
            new_id[s] = new_id[r]

    fused = []
    for x in out:
        s = partner[x.id]
        if s < 0:
            fused.append(_renumber(x, new_id[x.id]))
            continue
        y = instrs[s]
        kind = _FUSED[x.type]
        if kind == "rrcs" and dag.value_readers[x.id] <= {s} and dag.value_dies[x.id]:
            kind = "rrs"
        z = _renumber(x, new_id[x.id])
        z.type = kind
        z.send_peer = y.send_peer
        z.ch = x.ch if x.ch is not None else y.ch
        z.tb = x.tb if x.tb is not None else y.tb
        z.ops = x.ops + y.ops
        fused.append(z)

    n = len(fused)
    succ_sets = [set() for _ in range(n)]
    for u, vs in enumerate(dag.succs):
        a = new_id[u]
        for v in vs:
            b = new_id[v]
            if a != b:
                succ_sets[a].add(b)
    succs = [sorted(s) for s in succ_sets]
    preds: List[List[int]] = [[] for _ in range(n)]
    for a, vs in enumerate(succs):
        for b in vs:
            preds[b].append(a)
    send_to = [-1] * n
    recv_from = [-1] * n
    for u, v in enumerate(dag.send_to):
        if v >= 0:
            send_to[new_id[u]] = new_id[v]
            recv_from[new_id[v]] = new_id[u]
    for z in fused:
        if z.type in ("rcs", "rrcs", "rrs") and send_to[z.id] < 0:
            raise ScheduleError(f"internal: fused {z.describe()} lost its send")
    return InstrDAG(instrs=fused, succs=succs, preds=preds, send_to=send_to, recv_from=recv_from, plan=dag.plan)


def _break_impossible_chains(dag: InstrDAG, partner: List[int], absorbed: List[bool]) -> None:
    """Undo fusions that no channel could hold.

    Fused instructions forward along chains (send -> fused -> ... ->
    receive) that run on one channel.  A chain that passes a rank twice,
    forwarding to the same peer from two different peers (or from one peer to
    two), would need two threadblocks owning one connection; a chain whose
    ops ask for different `ch=` cannot sit on one channel either.  The chain
    is cut before the instruction that clashes, and the cut-off send starts a
    chain of its own.
    """
    instrs, send_to = dag.instrs, dag.send_to
    work = deque(x.id for x in instrs if x.type == "s" and not absorbed[x.id])
    while work:
        s = work.popleft()
        seen = {}
        chan = instrs[s].ch
        while True:
            y = send_to[s]
            p = partner[y]
            if p < 0:
                break
            x, fwd = instrs[y], instrs[p]
            ch = x.ch if x.ch is not None else fwd.ch
            send_key, recv_key = (x.rank, "send", fwd.send_peer), (x.rank, "recv", x.recv_peer)
            if ((ch is not None and chan is not None and ch != chan)
                    or seen.get(send_key, x.recv_peer) != x.recv_peer
                    or seen.get(recv_key, fwd.send_peer) != fwd.send_peer):
                partner[y] = -1
                absorbed[p] = False
                work.append(p)
                break
            seen[send_key] = x.recv_peer
            seen[recv_key] = fwd.send_peer
            if ch is not None:
                chan = ch
            s = p


def _renumber(x: Instr, new: int) -> Instr:
    return replace(x, id=new)
