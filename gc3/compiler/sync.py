"""Pass 6: synchronization between threadblocks of a rank, and the IR's steps.

A processing edge between instructions on different threadblocks of a rank
becomes a cross-TB dependency: the later step waits (`depid`, `deps`) for the
earlier one, which signals completion (`hasdep`).  Dependencies that are
already guaranteed are dropped:

* by program order: an earlier step of the same threadblock already waited
  for that step or a later one of the same threadblock;
* by transitivity: another dependency of the step (or of its threadblock's
  earlier steps) already finished after it.

Both are the same test on a per-step "knowledge" vector (for each other TB of
the rank, the last step known to be complete when this step starts), kept as
sparse dicts shared between steps until a new dependency changes them.

A step keeps at most one dependency, as the runtimes require; the others go
to `nop` steps inserted just before it, written as msccl-tools writes them.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..ir import Gpu, Step, Threadblock
from .buffers import BufferPlan
from .threadblocks import BlockSchedule

__all__ = ["insert_sync"]

_EMPTY: Dict[int, int] = {}


def _dependencies(sched: BlockSchedule) -> List[List[Tuple[int, int]]]:
    """Per instruction, the (tb, position) pairs it must wait for; positions before nops."""
    dag = sched.dag
    instrs, preds = dag.instrs, dag.preds
    tb_of, tbs = sched.tb_of, sched.tbs
    n = len(instrs)
    pos = [0] * n
    for rank_tbs in tbs:
        for tb in rank_tbs:
            for k, i in enumerate(tb.instrs):
                pos[i] = k
    deps: List[List[Tuple[int, int]]] = [[] for _ in range(n)]
    snap: List[Dict[int, int]] = [_EMPTY] * n
    running: Dict[Tuple[int, int], Dict[int, int]] = {}
    for i in sched.order:
        rank = instrs[i].rank
        t = tb_of[i]
        known = running.get((rank, t), _EMPTY)
        wanted: Dict[int, int] = {}
        for p in preds[i]:
            tp = tb_of[p]
            if tp == t:
                continue
            kp = pos[p]
            if known.get(tp, -1) >= kp or wanted.get(tp, -1) >= kp:
                continue
            wanted[tp] = kp
        if wanted:
            rank_tbs = tbs[rank]
            items = sorted(wanted.items())
            keep = []
            for tp, kp in items:
                implied = any(tq != tp and snap[rank_tbs[tq].instrs[kq]].get(tp, -1) >= kp for tq, kq in items)
                if not implied:
                    keep.append((tp, kp))
            known = dict(known)
            for tq, kq in keep:
                for a, b in snap[rank_tbs[tq].instrs[kq]].items():
                    if known.get(a, -1) < b:
                        known[a] = b
                if known.get(tq, -1) < kq:
                    known[tq] = kq
            running[(rank, t)] = known
            deps[i] = keep
        snap[i] = known
    return deps


def insert_sync(sched: BlockSchedule, plan: BufferPlan) -> List[Gpu]:
    """The scheduled first instance as IR GPUs of all instances: nops in, deps resolved.

    Instance i is instance 0 with every threadblock on channel
    `chan + i * per_instance` and every operand moved by `plan.shift`
    chunks per instance; dependencies stay inside their instance.
    Threadblocks are numbered as msccl-tools numbers them: manual ones by
    (user id, copy), the others by (send peer, receive peer, channel).
    """
    instrs = sched.dag.instrs
    deps = _dependencies(sched)
    k, copies, per = plan.instances, plan.copies, sched.per_instance
    gpus = []
    for rank, rank_tbs in enumerate(sched.tbs):
        # Step numbers once nops are in, and which steps others wait for.
        final: Dict[Tuple[int, int], int] = {}
        signals = set()
        for t, tb in enumerate(rank_tbs):
            s = 0
            for k_, i in enumerate(tb.instrs):
                s += max(len(deps[i]) - 1, 0)
                final[(t, k_)] = s
                s += 1
                signals.update(deps[i])
        # Instance 0's steps as rows; `None` marks operands that do not move
        # between instances (a nop's placeholders).
        templates = []
        for t, tb in enumerate(rank_tbs):
            rows = []
            for k_, i in enumerate(tb.instrs):
                x = instrs[i]
                waits = [(tq, final[(tq, kq)]) for tq, kq in deps[i]]
                for tq, sq in waits[:-1]:
                    rows.append(("nop", "i", -1, None, "o", -1, None, 0, tq, sq, False, None))
                depid, depstep = waits[-1] if waits else (-1, -1)
                rows.append((x.type, x.srcbuf, x.srcoff, x.srcbuf, x.dstbuf, x.dstoff, x.dstbuf, x.cnt,
                             depid, depstep, (t, k_) in signals, x.compute))
            templates.append(rows)
        order = sorted(((0, tb.user, i * copies + tb.part, 0) if tb.user is not None
                        else (1, tb.send, tb.recv, tb.chan + i * per), i, t)
                       for i in range(k) for t, tb in enumerate(rank_tbs))
        number = [[0] * len(rank_tbs) for _ in range(k)]
        for n, (_, i, t) in enumerate(order):
            number[i][t] = n
        out_tbs = []
        for n, (_, i, t) in enumerate(order):
            tb = rank_tbs[t]
            ids = number[i]
            shift = {buf: i * plan.shift(rank, buf) for buf in ("i", "o", "s")}
            shift[None] = 0
            steps = [Step(s, typ, sb, so + shift[ks], db, do + shift[kd], cnt, ids[depid] if depid >= 0 else -1,
                          depstep, signal, comp)
                     for s, (typ, sb, so, ks, db, do, kd, cnt, depid, depstep, signal, comp)
                     in enumerate(templates[t])]
            out_tbs.append(Threadblock(id=n, send=tb.send, recv=tb.recv, chan=tb.chan + i * per, steps=steps))
        gpus.append(Gpu(id=rank, i_chunks=plan.ir_chunks(rank, "i"), o_chunks=plan.ir_chunks(rank, "o"),
                        s_chunks=plan.ir_chunks(rank, "s"), threadblocks=out_tbs))
    return gpus
