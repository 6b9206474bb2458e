"""Deadlock freedom under bounded FIFOs, by abstract execution.

Model: each threadblock runs its steps in order.  A step may start once
  * its cross-TB dependency (depid, deps) has completed,
  * if it receives: a tile is in flight on its recv connection,
  * if it sends: fewer than `slots` tiles are in flight on its send connection,
and it then completes at once (a fused receive-and-send needs both).
Each connection has exactly one sending and one receiving TB (checked by
`structure`), so once a step's conditions hold no other TB can falsify them:
the system is persistent, every maximal execution ends in the same state, and
one greedy run decides deadlock for all interleavings.  The run is an event
loop: a blocked TB is parked on the one event that can unblock it, so the
whole check is linear in the number of steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..errors import DeadlockError
from .model import Conn, Model

Key = Tuple  # ("dep", tb position, step) | ("data", Conn) | ("space", Conn)


@dataclass(frozen=True)
class Blocked:
    tb: int          # position in Model.tbs
    step: int
    key: Key


def run(m: Model, slots: int) -> List[Blocked]:
    """Execute abstractly; return the TBs left blocked (empty when everything completes)."""
    pc = [0] * len(m.tbs)
    inflight: Dict[Conn, int] = dict.fromkeys(m.connections, 0)
    parked: Dict[Key, List[int]] = {}
    blocked: Dict[int, Key] = {}
    work = list(range(len(m.tbs) - 1, -1, -1))

    def wake(key: Key) -> None:
        waiters = parked.pop(key, None)
        if waiters:
            work.extend(waiters)

    while work:
        t = work.pop()
        tb = m.tbs[t]
        steps = tb.steps
        while pc[t] < len(steps):
            st = steps[pc[t]]
            info = st.info
            key: Optional[Key] = None
            if st.depid >= 0:
                d = m.index[(tb.rank, st.depid)]
                if pc[d] <= st.deps:
                    key = ("dep", d, st.deps)
            if key is None and info.recv and inflight[tb.recv_conn] == 0:
                key = ("data", tb.recv_conn)
            if key is None and info.send and inflight[tb.send_conn] >= slots:
                key = ("space", tb.send_conn)
            if key is not None:
                parked.setdefault(key, []).append(t)
                blocked[t] = key
                break
            blocked.pop(t, None)
            if info.recv:
                inflight[tb.recv_conn] -= 1
                wake(("space", tb.recv_conn))
            if info.send:
                inflight[tb.send_conn] += 1
                wake(("data", tb.send_conn))
            wake(("dep", t, pc[t]))
            pc[t] += 1
    return [Blocked(t, pc[t], key) for t, key in sorted(blocked.items())]


def check(m: Model, slots: int) -> None:
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    stuck = run(m, slots)
    if stuck:
        raise DeadlockError(_describe(m, slots, stuck))


def min_slots(m: Model) -> Optional[int]:
    """The fewest FIFO slots with which the schedule completes, or None if none suffices."""
    hi = max([len(v) for v in m.sends.values()] + [1])
    if run(m, hi):
        return None  # unbounded FIFOs behave like `hi` slots: a cycle of dependencies, not of buffering
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if run(m, mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _waits_on(m: Model, b: Blocked) -> int:
    kind = b.key[0]
    if kind == "dep":
        return b.key[1]
    if kind == "data":
        return m.sender[b.key[1]]
    return m.receiver[b.key[1]]


def _wait_text(m: Model, slots: int, b: Blocked) -> str:
    kind = b.key[0]
    other = m.tbs[_waits_on(m, b)]
    if kind == "dep":
        what = f"waits for {other.at(b.key[2])} to complete (depid/deps)"
    elif kind == "data":
        what = f"waits to receive on {b.key[1]} from {other.at()}, which has not sent the tile yet"
    else:
        what = f"waits for a free slot on {b.key[1]}: its {slots} slot(s) hold tiles {other.at()} has not received"
    return f"{m.tbs[b.tb].at(b.step)} {what}"


def _describe(m: Model, slots: int, stuck: List[Blocked]) -> str:
    by_tb = {b.tb: b for b in stuck}
    # Every blocked TB waits on another blocked one (matched counts guarantee
    # that a finished peer leaves nothing to wait for), so following the
    # waits from any blocked TB must come back round.
    seen: Dict[int, int] = {}
    path: List[Blocked] = []
    b = stuck[0]
    while b.tb not in seen:
        seen[b.tb] = len(path)
        path.append(b)
        b = by_tb[_waits_on(m, b)]
    cycle = path[seen[b.tb]:]
    lines = [f"deadlock with slots={slots} FIFO slots per connection; these threadblocks wait for each other in a cycle:"]
    lines += [f"  {_wait_text(m, slots, c)}" for c in cycle]
    rest = [x for x in stuck if x.tb not in {c.tb for c in cycle}]
    if rest:
        lines.append(f"  ({len(rest)} more threadblocks are blocked behind it, e.g. {_wait_text(m, slots, rest[0])})")
    return "\n".join(lines)
