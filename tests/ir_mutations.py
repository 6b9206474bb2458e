"""Single mutations of a valid IR, and rewrites that keep its meaning.

Shared by the property tests (`test_semantics_properties.py`): a mutant may
be right or wrong, and `gc3 check` accepting it must mean `gc3 simulate` finds
it right; a rewrite never changes what the program computes, so `check`
must keep accepting it.
"""
from __future__ import annotations

import copy
import random
from typing import Callable, Dict, List, Optional, Tuple

from gc3.ir import BUFFERS, Program, Step, Threadblock

REDUCE_TO_COPY = {"re": "cpy", "rrc": "r", "rrcs": "rcs", "rrs": "s"}


def _steps(prog: Program) -> List[Tuple[int, int, int]]:
    return [(gi, ti, k) for gi, g in enumerate(prog.gpus) for ti, tb in enumerate(g.threadblocks)
            for k in range(len(tb.steps))]


def _at(prog: Program, where) -> Step:
    gi, ti, k = where
    return prog.gpus[gi].threadblocks[ti].steps[k]


def mutate(prog: Program, rng: random.Random) -> Tuple[Program, str]:
    """A copy of `prog` with one random mutation, and what it was."""
    p = copy.deepcopy(prog)
    places = _steps(p)
    while True:
        where = rng.choice(places)
        st = _at(p, where)
        kind = rng.choice(("offset", "buffer", "reduce", "count", "dep", "swap"))
        if kind == "offset":
            field = rng.choice(("srcoff", "dstoff"))
            delta = rng.choice((-1, 1))
            setattr(st, field, getattr(st, field) + delta)
            return p, f"{where} {field}{delta:+d}"
        if kind == "buffer":
            field = rng.choice(("srcbuf", "dstbuf"))
            new = rng.choice([b for b in BUFFERS if b != getattr(st, field)])
            setattr(st, field, new)
            return p, f"{where} {field}={new}"
        if kind == "reduce" and st.type in REDUCE_TO_COPY:
            st.type = REDUCE_TO_COPY[st.type]
            return p, f"{where} reduce->copy"
        if kind == "count":
            delta = rng.choice((-1, 1))
            st.cnt += delta
            return p, f"{where} cnt{delta:+d}"
        if kind == "dep" and st.depid >= 0:
            st.depid = st.deps = -1
            return p, f"{where} dependency dropped"
        if kind == "swap":
            gi, ti, k = where
            steps = p.gpus[gi].threadblocks[ti].steps
            if k + 1 < len(steps):
                a, b = steps[k], steps[k + 1]
                for f in ("type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"):
                    va, vb = getattr(a, f), getattr(b, f)
                    setattr(a, f, vb)
                    setattr(b, f, va)
                return p, f"{where} swapped with the next step"


# --- rewrites that keep the meaning ---------------------------------------------------
def renumber_threadblocks(prog: Program, rng: random.Random) -> Program:
    """Permute every rank's threadblock ids (and the deps naming them)."""
    p = copy.deepcopy(prog)
    for g in p.gpus:
        ids = [tb.id for tb in g.threadblocks]
        new = ids[:]
        rng.shuffle(new)
        m = dict(zip(ids, new))
        for tb in g.threadblocks:
            tb.id = m[tb.id]
            for st in tb.steps:
                if st.depid >= 0:
                    st.depid = m[st.depid]
        rng.shuffle(g.threadblocks)
    return p


def renumber_channels(prog: Program, rng: random.Random) -> Program:
    """Permute the channel numbers, the same permutation on every rank."""
    p = copy.deepcopy(prog)
    perm = list(range(p.nchannels))
    rng.shuffle(perm)
    for g in p.gpus:
        for tb in g.threadblocks:
            tb.chan = perm[tb.chan]
    return p


def add_nop(prog: Program, rng: random.Random) -> Program:
    """Insert a nop step somewhere (renumbering the steps after it and the deps on them)."""
    p = copy.deepcopy(prog)
    g = rng.choice(p.gpus)
    if not g.threadblocks:
        return p
    tb = rng.choice(g.threadblocks)
    k = rng.randrange(len(tb.steps) + 1)
    _insert(g, tb, k, Step(s=k, type="nop", srcbuf="i", srcoff=0, dstbuf="i", dstoff=0, cnt=1))
    return p


def _insert(g, tb: Threadblock, k: int, st: Step) -> None:
    for other in g.threadblocks:
        for s in other.steps:
            if s.depid == tb.id and s.deps >= k:
                s.deps += 1
    tb.steps.insert(k, st)
    for i, s in enumerate(tb.steps):
        s.s = i


def swap_independent(prog: Program, rng: random.Random) -> Optional[Program]:
    """Swap two adjacent steps of a threadblock that touch disjoint slots, neither
    sends nor receives nor waits and neither is waited on; None if there is none."""
    p = copy.deepcopy(prog)
    from gc3.ir import local_output, step_reads

    def slots(st):
        out = set()
        ops = step_reads(st, p.convention) + ([local_output(st, p.convention)] if local_output(st, p.convention) else [])
        for buf, off in ops:
            out.update((buf, off + j) for j in range(st.cnt))
        return out, ({(b, o + j) for b, o in [local_output(st, p.convention)] for j in range(st.cnt)}
                     if local_output(st, p.convention) else set())

    candidates = []
    for g in p.gpus:
        waited = {(s.depid, s.deps) for tb in g.threadblocks for s in tb.steps if s.depid >= 0}
        for tb in g.threadblocks:
            for k in range(len(tb.steps) - 1):
                a, b = tb.steps[k], tb.steps[k + 1]
                if any(x.info.send or x.info.recv or x.depid >= 0 or x.hasdep for x in (a, b)):
                    continue
                if (tb.id, k) in waited or (tb.id, k + 1) in waited:
                    continue
                (ta, wa), (tb_, wb) = slots(a), slots(b)
                if wa & tb_ or wb & ta:
                    continue
                candidates.append((tb, k))
    if not candidates:
        return None
    tb, k = rng.choice(candidates)
    tb.steps[k], tb.steps[k + 1] = tb.steps[k + 1], tb.steps[k]
    for i, s in enumerate(tb.steps):
        s.s = i
    return p


REWRITES: Dict[str, Callable] = {"renumber_threadblocks": renumber_threadblocks,
                                 "renumber_channels": renumber_channels, "add_nop": add_nop,
                                 "swap_independent": swap_independent}
