"""Pass 5: threadblock assignment and the order of steps inside each threadblock.

Following the GC3 paper (section 5.2):

* one threadblock per unique (send peer, receive peer, channel) of the
  rank's communicating instructions; a threadblock has at most one send peer
  and one receive peer, and a (peer, channel) connection belongs to exactly
  one threadblock per direction, so a lone send joins the threadblock that
  already owns its connection;
* instructions are taken in one global topological order, from a heap keyed
  by (dependency depth, -reverse depth): shallow first, then the longest
  remaining path first (if that greedy order gets stuck on a connection's
  FIFO order, the order the program was traced in is tried instead);
* local instructions (`cpy`, `re`) go to the threadblock of their rank and
  channel whose last instruction is earliest in that order;
* a compute instruction (`gemv`) is a producer with no inputs, so depth alone
  would take every one of them first and make a threadblock's first send wait
  (in program order) for all of them.  Instead it takes the place of its
  earliest consumer, just before it, and joins that consumer's threadblock
  when it has one: each chunk is computed right where it is sent, and the
  first send waits for the first chunk only (the epilogue, without a fused
  opcode).

The global order also plays the FIFOs: a receive is taken only after the
receives of all earlier sends on its connection (so receives match sends in
order on both sides), and a send only while its connection has a free slot
(so the order is an execution that never blocks, which makes the schedule
deadlock-free with that many slots).  Every threadblock lists its
instructions in this order.

`sendtb`/`recvtb` (manual assignment) put an instruction on the user's
threadblock (one per parallel copy and instance); an assignment that breaks
the rules above raises ScheduleError naming the op and the conflict.

Only the first instance is scheduled: the others are the same schedule on
their own channels and chunks, stamped out when the IR is emitted.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Dict, List, Optional, Tuple

from .channels import ChannelAssignment
from ..errors import ScheduleError, TooManyThreadblocks
from ..ir.opcodes import OPCODES, RECVS, SENDS
from .instruction_dag import Instr, InstrDAG, depths

__all__ = ["PlannedTB", "BlockSchedule", "assign_threadblocks"]


@dataclass
class PlannedTB:
    rank: int
    send: int
    recv: int
    chan: int
    user: Optional[int] = None       # the user's sendtb/recvtb, if manual
    part: int = 0                    # parallel copy it serves (manual threadblocks)
    instrs: List[int] = field(default_factory=list)

    def describe(self) -> str:
        who = f"threadblock {self.user}" if self.user is not None else "threadblock"
        return f"{who} of rank {self.rank} (send {self.send}, recv {self.recv}, channel {self.chan})"


@dataclass
class BlockSchedule:
    dag: InstrDAG
    chan: List[int]
    nchannels: int
    per_instance: int                # channels per instance
    tbs: List[List[PlannedTB]]              # per rank, first instance
    tb_of: List[int]                 # instruction -> index in tbs[rank]
    order: List[int]                 # the global topological order


class _Shapes:
    """Threadblocks of each rank and which one owns each connection."""

    def __init__(self, dag: InstrDAG, chan: List[int]):
        self.dag = dag
        self.chan = chan
        self.tbs: List[List[PlannedTB]] = [[] for _ in range(dag.plan.nranks)]
        self.owner: Dict[Tuple[int, str, int, int], int] = {}   # (rank, dir, peer, ch) -> tb
        self.claimed_by: Dict[Tuple[int, str, int, int], int] = {}   # ... -> instr that claimed it
        self.manual: Dict[Tuple[int, int, int], int] = {}       # (rank, user tb, part) -> tb
        self.by_chan: Dict[Tuple[int, int], List[int]] = {}     # (rank, ch) -> tbs
        self.tb_of = [-1] * len(dag.instrs)

    def snapshot(self):
        return [len(t) for t in self.tbs], {k: list(v) for k, v in self.by_chan.items()}, list(self.tb_of)

    def restore(self, saved) -> None:
        """Undo what ordering did since `snapshot()`: local placements and TBs it opened."""
        counts, by_chan, tb_of = saved
        for tbs, c in zip(self.tbs, counts):
            del tbs[c:]
            for tb in tbs:
                tb.instrs.clear()
        self.by_chan = by_chan
        self.tb_of[:] = tb_of

    def new(self, rank: int, send: int, recv: int, ch: int, user=None, part=0) -> int:
        tbs = self.tbs[rank]
        tbs.append(PlannedTB(rank, send, recv, ch, user, part))
        self.by_chan.setdefault((rank, ch), []).append(len(tbs) - 1)
        return len(tbs) - 1

    def _fail(self, x: Instr, why: str):
        hint = ""
        if x.tb is not None:
            role = "recvtb" if x.type in RECVS and x.type not in SENDS else "sendtb"
            hint = f" (illegal manual threadblock assignment {role}={x.tb})"
        raise ScheduleError(f"{x.where}: cannot schedule {x.describe()}{hint}: {why}")

    def claim(self, t: int, x: Instr, direction: str, peer: int) -> None:
        ch = self.chan[x.id]
        tb = self.tbs[x.rank][t]
        key = (x.rank, direction, peer, ch)
        owner = self.owner.get(key)
        if owner is not None and owner != t:
            other = self.dag.instrs[self.claimed_by[key]]
            self._fail(x, f"the {direction} connection to rank {peer} on channel {ch} already belongs to "
                          f"{self.tbs[x.rank][owner].describe()}, used by {other.describe()}")
        current = tb.send if direction == "send" else tb.recv
        if current not in (-1, peer):
            self._fail(x, f"{tb.describe()} already {direction}s {'to' if direction == 'send' else 'from'} "
                          f"rank {current}; a threadblock has one {direction} peer")
        if tb.chan != ch:
            self._fail(x, f"{tb.describe()} is on channel {tb.chan}, the instruction on channel {ch}")
        if direction == "send":
            tb.send = peer
        else:
            tb.recv = peer
        if owner is None:
            self.owner[key] = t
            self.claimed_by[key] = x.id

    def place_manual(self, x: Instr) -> None:
        key = (x.rank, x.tb, x.part)
        t = self.manual.get(key)
        comm = x.type in SENDS or x.type in RECVS
        if t is None:
            t = self.new(x.rank, -1, -1, self.chan[x.id], user=x.tb, part=x.part)
            self.manual[key] = t
        tb = self.tbs[x.rank][t]
        if comm and tb.send == -1 and tb.recv == -1 and tb.chan != self.chan[x.id] and not tb.instrs:
            # a TB first met through a local instruction takes the channel of its first connection
            self.by_chan[(x.rank, tb.chan)].remove(t)
            tb.chan = self.chan[x.id]
            self.by_chan.setdefault((x.rank, tb.chan), []).append(t)
        self._connect(t, x)

    def place_auto(self, x: Instr) -> None:
        ch = self.chan[x.id]
        so = self.owner.get((x.rank, "send", x.send_peer, ch)) if x.type in SENDS else None
        ro = self.owner.get((x.rank, "recv", x.recv_peer, ch)) if x.type in RECVS else None
        if so is None and ro is None:
            t = self.new(x.rank, -1, -1, ch)
        elif so is not None and ro is not None and so != ro:
            tbs = self.tbs[x.rank]
            self._fail(x, f"its send connection belongs to {tbs[so].describe()} and its receive connection to "
                          f"{tbs[ro].describe()}")
        else:
            t = so if so is not None else ro
        self._connect(t, x)

    def _connect(self, t: int, x: Instr) -> None:
        if x.type in SENDS:
            self.claim(t, x, "send", x.send_peer)
        if x.type in RECVS:
            self.claim(t, x, "recv", x.recv_peer)
        self.tb_of[x.id] = t


def assign_threadblocks(channels: ChannelAssignment, *, slots: int, max_tbs: Optional[int] = None) -> BlockSchedule:
    dag, chan = channels.dag, channels.chan
    instrs = dag.instrs
    n = len(instrs)
    shapes = _Shapes(dag, chan)
    # Manual placements first: they fix connections that automatic ones must respect.
    for x in instrs:
        if x.tb is not None:
            shapes.place_manual(x)
    # Fused instructions before lone sends and receives: they decide which
    # receive peer shares a threadblock with which send peer.
    for x in instrs:
        if x.tb is None and x.type in SENDS and x.type in RECVS:
            shapes.place_auto(x)
    for x in instrs:
        if x.tb is None and (x.type in SENDS) != (x.type in RECVS):
            shapes.place_auto(x)

    depth, rdepth = depths(dag)
    key1, key2 = list(depth), [-d for d in rdepth]
    _compute_at_consumer(dag, shapes, key1, key2)
    saved = shapes.snapshot()
    try:
        order = _global_order(dag, chan, shapes, slots, key1, key2)
    except ScheduleError as first:
        # The depth heuristic fixes each connection's FIFO order greedily: it
        # may send a tile early whose receive must wait (e.g. to reuse a slot)
        # for a tile sent later on the same connection.  The order the user
        # traced never does that, so it is the fallback before giving up.
        shapes.restore(saved)
        trace = [min((op.id for op in x.ops), default=0) for x in instrs]
        try:
            order = _global_order(dag, chan, shapes, slots, trace, [0] * n)
        except ScheduleError:
            raise first from None
    k = dag.plan.instances
    for rank, rank_tbs in enumerate(shapes.tbs):
        if max_tbs is not None and len(rank_tbs) * k > max_tbs:
            raise TooManyThreadblocks(
                f"rank {rank} needs {len(rank_tbs) * k} threadblocks ({len(rank_tbs)} per instance x {k} "
                f"instances) but max_tbs={max_tbs}; use fewer instances, channels or peers per rank, "
                f"or raise --max-tbs", len(rank_tbs), max_tbs)
    return BlockSchedule(dag=dag, chan=chan, nchannels=channels.nchannels, per_instance=channels.per_instance,
                    tbs=shapes.tbs, tb_of=shapes.tb_of, order=order)


def _compute_at_consumer(dag: InstrDAG, shapes: _Shapes, key1: List[int], key2: List[int]) -> None:
    """Give each compute instruction its earliest consumer's keys (it has a smaller id,
    having been made first, so it pops just before that consumer), and its threadblock
    when the consumer communicates (it has one by now).  A producer with no consumer (it
    computes a final output: the rank's own block) waits for nothing and nothing waits for
    it, so it goes after everything else: it must not make a threadblock's first send wait
    for it.  One that reads a chunk (agemm) keeps its own keys: it follows that chunk."""
    last = max(key1, default=0) + 1
    for x in dag.instrs:
        if OPCODES[x.type].compute and not OPCODES[x.type].local_in and not dag.succs[x.id]:
            key1[x.id] = last
        if OPCODES[x.type].compute and OPCODES[x.type].local_in:
            # It reads a chunk: it runs right after the receive that brought it, in that receive's
            # threadblock, so it waits for that arrival (and, FIFO, the earlier ones of that
            # connection) only, not for other peers' chunks queued before it elsewhere.
            recvs = [p for p in dag.preds[x.id] if dag.instrs[p].type in RECVS and shapes.tb_of[p] >= 0]
            if len(recvs) == 1 and x.tb is None:
                (p,) = recvs
                key1[x.id], key2[x.id] = key1[p], key2[p]
                shapes.tb_of[x.id] = shapes.tb_of[p]
        if not OPCODES[x.type].compute or not dag.succs[x.id]:
            continue
        first = min(dag.succs[x.id], key=lambda v: (key1[v], key2[v], v))
        key1[x.id], key2[x.id] = key1[first], key2[first]
        if x.tb is None and shapes.tb_of[first] >= 0:
            shapes.tb_of[x.id] = shapes.tb_of[first]


def _global_order(dag: InstrDAG, chan: List[int], shapes: _Shapes, slots: int,
                  key1: List[int], key2: List[int]) -> List[int]:
    """Ready instructions are taken smallest (key1, key2) first."""
    instrs = dag.instrs
    n = len(instrs)
    succs, send_to = dag.succs, dag.send_to
    pending = [len(p) for p in dag.preds]
    # Connection of each send / receive, as a dense index.
    conn_index: Dict[Tuple[int, int, int], int] = {}
    sconn = [-1] * n
    rconn = [-1] * n
    for x in instrs:
        if x.type in SENDS:
            sconn[x.id] = conn_index.setdefault((x.rank, x.send_peer, chan[x.id]), len(conn_index))
        if x.type in RECVS:
            rconn[x.id] = conn_index.setdefault((x.recv_peer, x.rank, chan[x.id]), len(conn_index))
            pending[x.id] += 1
    nconn = len(conn_index)
    inflight = [0] * nconn
    queue = [deque() for _ in range(nconn)]          # receives of sent, unreceived tiles, in send order
    blocked_send: List[List[int]] = [[] for _ in range(nconn)]
    waiting_recv = [False] * n                       # ready, but not the head of its connection

    heap: List[Tuple[int, int, int]] = []

    def offer(i: int) -> None:
        c = rconn[i]
        if c >= 0 and queue[c][0] != i:
            waiting_recv[i] = True
            return
        heappush(heap, (key1[i], key2[i], i))

    for i in range(n):
        if pending[i] == 0:
            offer(i)

    tbs = shapes.tbs
    tb_of = shapes.tb_of
    last = {}                                        # (rank, tb) -> position of its last instruction
    order: List[int] = []
    while heap:
        _, _, i = heappop(heap)
        sc = sconn[i]
        if sc >= 0 and inflight[sc] >= slots:
            blocked_send[sc].append(i)
            continue
        x = instrs[i]
        t = tb_of[i]
        if t < 0:
            t = _pick_local(shapes, x, chan[i], last)
            tb_of[i] = t
        tbs[x.rank][t].instrs.append(i)
        last[(x.rank, t)] = len(order)
        order.append(i)
        rc = rconn[i]
        if rc >= 0:
            queue[rc].popleft()
            inflight[rc] -= 1
            if queue[rc] and waiting_recv[queue[rc][0]]:
                waiting_recv[queue[rc][0]] = False
                offer(queue[rc][0])
            if blocked_send[rc]:
                for j in blocked_send[rc]:
                    heappush(heap, (key1[j], key2[j], j))
                blocked_send[rc] = []
        if sc >= 0:
            inflight[sc] += 1
            queue[sc].append(send_to[i])
        for j in succs[i]:
            pending[j] -= 1
            if not pending[j]:
                offer(j)
        j = send_to[i]
        if j >= 0:
            pending[j] -= 1
            if not pending[j]:
                offer(j)
    if len(order) != n:
        _explain_stuck(dag, chan, order, waiting_recv, blocked_send, queue, conn_index, slots)
    return order


def _pick_local(shapes: _Shapes, x: Instr, ch: int, last) -> int:
    """The threadblock on x's rank and channel whose last instruction is earliest."""
    candidates = shapes.by_chan.get((x.rank, ch))
    if not candidates:
        return shapes.new(x.rank, -1, -1, ch, part=x.part)
    return min(candidates, key=lambda t: (last.get((x.rank, t), -1), t))


def _explain_stuck(dag, chan, order, waiting_recv, blocked_send, queue, conn_index, slots) -> None:
    instrs = dag.instrs
    names = {v: k for k, v in conn_index.items()}
    lines = []
    for i, flag in enumerate(waiting_recv):
        if flag:
            conn = names[next(k for k, q in enumerate(queue) if i in q)]
            head = next(q[0] for q in queue if i in q)
            lines.append(f"{instrs[i].describe()} must wait on connection {conn[0]}->{conn[1]} channel {conn[2]} "
                         f"behind {instrs[head].describe()}, which cannot run before it")
            if len(lines) >= 3:
                break
    for c, items in enumerate(blocked_send):
        for i in items[:1]:
            conn = names[c]
            lines.append(f"{instrs[i].describe()} finds all {slots} FIFO slots of {conn[0]}->{conn[1]} channel "
                         f"{conn[2]} full")
    if not lines:
        done = set(order)
        rest = [x for x in instrs if x.id not in done][:3]
        lines = [f"{x.describe()} never becomes ready" for x in rest]
    raise ScheduleError(
        "no order of the instructions respects FIFO order on every connection: " + "; ".join(lines) +
        "; put these operations on different channels (ch=) or reorder them")


def merge_lone_pairs(sched: BlockSchedule) -> BlockSchedule:
    """Where a rank has, on one channel, exactly one threadblock that only
    sends and one that only receives, and a step of one waits for a step of
    the other, make them one threadblock.

    For the latency-bound LL protocol such a wait costs a progress flag
    between blocks (an in-place one-shot AllReduce's receive-reduce
    overwrites what its send reads), and one block does the same work in
    order without it.  Pairs that do not wait on each other stay apart:
    there the two blocks overlap their send and their receive (measured on
    2x H200: a 2-rank AllToAll merged took 7.5 us per call instead of 5.6).
    The merged threadblock runs both lists in the global order, of which
    each was already a subsequence, so that order remains an execution that
    never blocks and the schedule stays free of deadlock.  Threadblocks the
    user placed by hand are left alone.
    """
    pos = {i: k for k, i in enumerate(sched.order)}
    tbs: List[List[PlannedTB]] = []
    tb_of = list(sched.tb_of)
    for rank_tbs in sched.tbs:
        by_chan: Dict[int, Tuple[List[int], List[int]]] = {}
        for t, tb in enumerate(rank_tbs):
            if tb.user is not None:
                continue
            sends, recvs = by_chan.setdefault(tb.chan, ([], []))
            if tb.send >= 0 and tb.recv < 0:
                sends.append(t)
            elif tb.recv >= 0 and tb.send < 0:
                recvs.append(t)
        absorbed: Dict[int, int] = {}     # receive-only tb -> the send-only tb it joins
        for sends, recvs in by_chan.values():
            if len(sends) == 1 and len(recvs) == 1 and _waits_between(sched, rank_tbs, sends[0], recvs[0]):
                absorbed[recvs[0]] = sends[0]
        if not absorbed:
            tbs.append(rank_tbs)
            continue
        new_index: Dict[int, int] = {}
        kept: List[PlannedTB] = []
        for t, tb in enumerate(rank_tbs):
            if t in absorbed:
                continue
            new_index[t] = len(kept)
            kept.append(PlannedTB(tb.rank, tb.send, tb.recv, tb.chan, tb.user, tb.part, list(tb.instrs)))
        for r, s in absorbed.items():
            into = kept[new_index[s]]
            into.recv = rank_tbs[r].recv
            into.instrs = sorted(into.instrs + rank_tbs[r].instrs, key=pos.__getitem__)
            new_index[r] = new_index[s]
        for t, tb in enumerate(rank_tbs):
            for i in tb.instrs:
                tb_of[i] = new_index[t]
        tbs.append(kept)
    return BlockSchedule(dag=sched.dag, chan=sched.chan, nchannels=sched.nchannels, per_instance=sched.per_instance,
                    tbs=tbs, tb_of=tb_of, order=sched.order)


def _waits_between(sched: BlockSchedule, rank_tbs: List[PlannedTB], a: int, b: int) -> bool:
    """Does a step of threadblock a or b depend on a step of the other?"""
    preds, tb_of = sched.dag.preds, sched.tb_of
    return any(tb_of[p] == other for t, other in ((a, b), (b, a)) for i in rank_tbs[t].instrs for p in preds[i])
