"""Verification of a scheduled IR (pass 7), for gc3's and msccl-tools' XML.

    verify(prog)        raises a VerificationError subclass naming rank/TB/step
    check_report(prog)  verifies, then says in lines what was checked

The checks run cheapest first, and each relies on the ones before it:
structure (ids, peers, deps, operands) -> runtime limits -> send/receive
matching in FIFO order -> deadlock freedom under bounded FIFOs -> semantics
(the collective's postcondition holds on every rank in every interleaving,
for every call size; `semantics.py`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import List, Optional

from .. import limits
from ..ir import Program
from . import deadlock, fifo_order, model, runtime_limits, structure
from . import semantics as _semantics
from .runtime_limits import Limits

__all__ = ["verify", "check_report", "Summary", "Limits"]


@dataclass(frozen=True)
class Summary:
    ranks: int
    threadblocks: int
    steps: int
    connections: int
    pairs: int          # matched send/receive pairs
    deps: int           # cross-TB dependencies
    slots: int
    limits: Limits
    proven: Optional[int] = None   # output chunks proven; None when semantics were not checked


def verify(prog: Program, *, slots: Optional[int] = None, max_tbs: Optional[int] = None,
           max_steps: Optional[int] = None, max_cnt: Optional[int] = None,
           max_channels: Optional[int] = None, max_fanin: Optional[int] = None,
           semantics: bool = True) -> Summary:
    """Raise a VerificationError subclass if `prog` is malformed, beyond the
    runtime's limits, mismatched, can deadlock with `slots` FIFO slots per
    connection, or (`semantics`) does not compute its collective; otherwise
    return what was checked.  Unset limits come from `gc3.limits`.
    `semantics=False` is for schedules that are not meant to compute anything
    (tests of the other passes)."""
    slots = limits.FIFO_SLOTS[prog.proto] if slots is None else slots
    given = dict(max_tbs=max_tbs, max_steps=max_steps, max_cnt=max_cnt,
                 max_channels=max_channels, max_fanin=max_fanin)
    lim = Limits(**{k: v for k, v in given.items() if v is not None})
    structure.check(prog)
    runtime_limits.check(prog, lim)
    m = model.build_model(prog)
    pairs = fifo_order.check(m)
    deadlock.check(m, slots)
    proven = _semantics.check(m) if semantics else None
    return Summary(
        ranks=len(prog.gpus),
        threadblocks=len(m.tbs),
        steps=sum(len(t.steps) for t in m.tbs),
        connections=len(m.connections),
        pairs=pairs,
        deps=sum(st.depid >= 0 for t in m.tbs for st in t.steps),
        slots=slots,
        limits=lim,
        proven=proven,
    )


def check_report(prog: Program, **options) -> List[str]:
    """Verify `prog` (same options as `verify`) and describe what was checked."""
    s = verify(prog, **options)
    m = model.build_model(prog)
    need = deadlock.min_slots(m)
    per_rank = Counter(len(g.threadblocks) for g in prog.gpus)
    lim = s.limits
    return [
        f"program {prog.name!r}: {prog.coll}, {s.ranks} ranks, proto {prog.proto}, "
        f"{prog.convention} operand convention",
        f"structure: {s.threadblocks} threadblocks, {s.steps} steps; ids, peers, channels, "
        f"{s.deps} cross-TB dependencies and all operands in range",
        f"limits: at most {max(per_rank)} TBs per rank (max {lim.max_tbs}), steps per TB <= {lim.max_steps}, "
        f"cnt <= {lim.max_cnt}, nchannels {prog.nchannels} <= {lim.max_channels}, re fan-in <= {lim.max_fanin}",
        f"FIFO order: {s.pairs} send/receive pairs on {s.connections} connections match in order"
        + (" (counts and operands)" if prog.convention == "msccl" else " (counts)"),
        f"deadlock: none with {s.slots} slots per connection"
        + (f" (the schedule needs at least {need})" if need is not None else ""),
    ] + ([] if s.proven is None else [
        f"semantics: {s.proven} output chunks proven to hold the {prog.coll} postcondition in every "
        f"interleaving and for every call size; no unwritten reads, double contributions or races"])
