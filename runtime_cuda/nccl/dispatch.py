"""Routing calls, alone or in a group, to gc3 or to NCCL.

A group goes to gc3 only when gc3 serves every call in it; one call it cannot
serve (or any send/recv, which gc3 does not implement) sends the whole group
to NCCL as one NCCL group, because NCCL progresses a group's operations
together and a gc3 kernel spinning on its peers beside a half-issued NCCL group
could wait forever.
"""
from __future__ import annotations

from typing import List, Optional, Protocol, Sequence, Tuple

from runtime_cuda.core.streams import owner

from .call import Call
from .catalog import Candidate
from .selection import Decision, Rejection, Selector

P2P = ("send", "recv")


class Gc3Runner(Protocol):
    def check(self, candidate: Candidate, call: Call) -> Optional[str]:
        """None when the runtime can run this candidate for this call, else why not."""

    def prepare(self, decision: Decision) -> Optional[str]:
        """Collective set-up for the selected algorithm; None when ready, else why not
        (the same answer on every rank)."""

    def run(self, decision: Decision) -> None:
        """Enqueue the selected algorithm on the call's stream."""


class NcclRunner(Protocol):
    def run(self, call: Call) -> None: ...
    def group_start(self) -> None: ...
    def group_end(self) -> None: ...


class Dispatcher:
    """One communicator's router: its selector, its gc3 runner and its NCCL fallback."""

    def __init__(self, selector: Selector, nccl: NcclRunner, gc3: Optional[Gc3Runner], order=None):
        self.selector = selector
        self.nccl = nccl
        self.gc3 = gc3
        # runtime_cuda.core.streams.StreamOrder: the communicator's calls, gc3's and
        # NCCL's alike, run in issue order whatever streams they come on.
        self.order = order

    def decide(self, call: Call) -> Optional[Decision]:
        """The selection for a collective; None for a send/recv (always NCCL)."""
        if call.coll in P2P:
            return None
        decision = self.selector.choose(call)
        if decision.uses_gc3:
            reason = self.gc3.prepare(decision)
            if reason:
                self.selector.forget()
                name = decision.candidate.name
                self.selector.report_fallback(call, f"gc3 algorithm {name} could not be set up: {reason}")
                return Decision(call, rejections=decision.rejections + [Rejection(name, "runtime", reason)])
        return decision

    def enter(self, stream: int, nccl: bool = False) -> None:
        if self.order is not None:
            self.order.enter(stream, None, nccl)

    def leave(self, stream: int, nccl: bool = False) -> None:
        if self.order is not None:
            self.order.leave(stream, None, owner(stream), nccl)

    def run(self, call: Call) -> Decision:
        decision = self.decide(call)
        nccl = decision is None or not decision.uses_gc3
        # What NCCL's own order does not cover is ordered as gc3's calls are.
        self.enter(call.stream, nccl and call.nccl_ordered)
        if nccl:
            self.nccl.run(call)
        else:
            self.gc3.run(decision)
        self.leave(call.stream, nccl and call.nccl_launches)
        return decision


def run_group(items: Sequence[Tuple[Dispatcher, Call]]) -> List[Optional[Decision]]:
    """Run the calls recorded between groupStart and groupEnd, all on gc3 or all on NCCL."""
    decisions = [disp.decide(call) for disp, call in items]
    blocker = next((call for (_, call), d in zip(items, decisions) if d is None or not d.uses_gc3), None)
    if blocker is None:
        for (disp, call), d in zip(items, decisions):
            disp.enter(call.stream)
            disp.gc3.run(d)
            disp.leave(call.stream)
        return decisions
    reason = (f"its group also holds {blocker.describe()}, which gc3 cannot serve; "
              "the whole group goes to NCCL")
    for (disp, call), d in zip(items, decisions):
        if d is not None and d.uses_gc3:
            disp.selector.report_fallback(call, reason)
    if not items:
        return decisions
    nccl = items[0][0].nccl
    # The group's launch waits for and ends every stream of it, but a call NCCL skips may leave
    # its stream out, and a call may do work before it: such a group is ordered (and marked) as
    # gc3's calls are.
    launches = all(call.nccl_launches for _, call in items)
    ordered = all(call.nccl_ordered for _, call in items)
    for disp, call in items:   # before the group: NCCL launches a group's work at groupEnd
        disp.enter(call.stream, ordered)
    nccl.group_start()
    try:
        for disp, call in items:
            disp.nccl.run(call)
    finally:
        nccl.group_end()
    for disp, call in items:
        disp.leave(call.stream, launches)
    return [None] * len(items)
