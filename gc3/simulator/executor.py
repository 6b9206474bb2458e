"""Runs an IR program: every threadblock of every rank is an agent.

Semantics, as the interpreter kernel implements them:
* a threadblock runs its steps in order;
* a step with `depid >= 0` first waits until step `deps` of threadblock
  `depid` on the same rank has completed;
* each (sender rank, receiver rank, channel) is one connection with a bounded
  FIFO of `slots` entries: a sending step needs a free slot, a receiving step a
  message; the receiver consuming a message frees its slot;
* a step is atomic once its waits are satisfied; it moves whole tiles of
  `cnt` chunks (see `memory.RankMemory`).

Agents are scheduled round-robin (or in a seeded random order) from a ready
queue; an agent that cannot proceed sleeps on what it waits for and is woken
when that changes.  When the ready queue empties before every agent has
finished, that is a deadlock, and each blocked agent says what it waits for.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..ir.opcodes import STEP_VALUE
from ..ir import Program, Step, Threadblock, local_input, local_output, step_reads
from .memory import RankMemory
from .races import Access, Race, RaceDetector

ConnId = Tuple[int, int, int]  # (sender rank, receiver rank, channel)


@dataclass
class Executed:
    """One completed step, with what it waited on (indices into the trace);
    the cost model replays these edges with durations."""
    rank: int
    tb: int
    step: int
    type: str
    cnt: int
    dep: Optional[int] = None        # the step this one waited on (depid/deps)
    msg_from: Optional[int] = None   # the send whose message it received
    conn_out: Optional[ConnId] = None
    slot_from: Optional[int] = None  # the receive that freed the FIFO slot it used


@dataclass
class Message:
    tile: np.ndarray
    cnt: int
    vc: Optional[np.ndarray]
    record: int
    where: str


class _Connection:
    __slots__ = ("key", "queue", "consumers", "sender", "receiver")

    def __init__(self, key: ConnId):
        self.key = key
        self.queue: deque = deque()
        self.consumers: List[int] = []   # record index of the step that consumed message k
        self.sender: Optional["_Agent"] = None
        self.receiver: Optional["_Agent"] = None


class _Agent:
    __slots__ = ("rank", "tb", "gid", "steps", "pc", "vc", "send", "recv", "records", "snapshots",
                 "needs_snapshot", "mem")

    def __init__(self, rank: int, tb: Threadblock, gid: int, mem: RankMemory):
        self.rank = rank
        self.tb = tb
        self.gid = gid
        self.steps: List[Step] = tb.steps
        self.pc = 0
        self.vc: Optional[np.ndarray] = None
        self.send: Optional[_Connection] = None
        self.recv: Optional[_Connection] = None
        self.records: List[int] = []
        self.snapshots: Dict[int, np.ndarray] = {}
        self.needs_snapshot: set = set()
        self.mem = mem

    def where(self, k: int) -> str:
        return f"rank {self.rank} tb {self.tb.id} step {k} ({self.steps[k].type})"


class _Fatal(Exception):
    pass


@dataclass
class Execution:
    records: List[Executed] = field(default_factory=list)
    races: List[Race] = field(default_factory=list)
    races_truncated: int = 0
    deadlock: List[str] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        return not self.deadlock and not self.errors


def static_errors(prog: Program, memories: Dict[int, RankMemory]) -> List[str]:
    """Structural faults that make a program unrunnable, each naming rank/TB/step."""
    errs: List[str] = []
    ids = sorted(g.id for g in prog.gpus)
    if not prog.ranks_complete():
        errs.append(f"program declares ngpus={prog.ngpus} but has <gpu> ids {ids}")
        return errs
    conv = prog.convention
    for g in prog.gpus:
        r = g.id
        mem = memories[r]
        tbs = {}
        for tb in g.threadblocks:
            if tb.id in tbs:
                errs.append(f"rank {r}: two threadblocks with id {tb.id}")
            tbs[tb.id] = tb
        used: Dict[Tuple[str, int, int], int] = {}
        for tb in g.threadblocks:
            if not 0 <= tb.chan < prog.nchannels:
                errs.append(f"rank {r} tb {tb.id}: chan={tb.chan} outside 0..{prog.nchannels - 1} "
                            f"(nchannels={prog.nchannels}); the runtime opens no such channel")
            for role, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer == -1:
                    continue
                if not 0 <= peer < prog.ngpus or peer == r:
                    errs.append(f"rank {r} tb {tb.id}: {role}={peer} is not another rank of {prog.ngpus}")
                    continue
                key = (role, peer, tb.chan)
                if key in used:
                    errs.append(f"rank {r}: tb {used[key]} and tb {tb.id} both {role} "
                                f"{'to' if role == 'send' else 'from'} rank {peer} on channel {tb.chan}")
                used[key] = tb.id
            for st in tb.steps:
                here = f"rank {r} tb {tb.id} step {st.s} ({st.type})"
                info = st.info
                if info.recv and tb.recv == -1:
                    errs.append(f"{here}: receives but the threadblock has recv=-1")
                if info.send and tb.send == -1:
                    errs.append(f"{here}: sends but the threadblock has send=-1")
                if st.type != "nop" and st.cnt < 1:
                    errs.append(f"{here}: cnt={st.cnt}; a data step moves at least one chunk")
                operands = step_reads(st, conv)
                out = local_output(st, conv)
                if out is not None:
                    operands.append(out)
                for buf, off in operands:
                    n = mem.nchunks(buf)
                    if off < 0 or off + st.cnt > n:
                        errs.append(f"{here}: chunks {buf}[{off}:{off + st.cnt}] out of range; "
                                    f"rank {r} buffer {buf!r} has {n} chunks")
                if st.depid >= 0:
                    dep = tbs.get(st.depid)
                    if dep is None:
                        errs.append(f"{here}: depid={st.depid} names no threadblock of rank {r}")
                    elif not 0 <= st.deps < len(dep.steps):
                        errs.append(f"{here}: deps={st.deps} but rank {r} tb {st.depid} has "
                                    f"{len(dep.steps)} steps")
                elif st.depid != -1:
                    errs.append(f"{here}: depid={st.depid} is neither -1 nor a threadblock id")
    return errs


def hasdep_warnings(prog: Program) -> List[str]:
    """Steps others wait on must carry hasdep=1: MSCCL-style runtimes only
    signal completion of those steps, so a waiter on any other step would hang."""
    warns = []
    for g in prog.gpus:
        tbs = {tb.id: tb for tb in g.threadblocks}
        for tb in g.threadblocks:
            for st in tb.steps:
                if st.depid >= 0 and st.depid in tbs and 0 <= st.deps < len(tbs[st.depid].steps):
                    target = tbs[st.depid].steps[st.deps]
                    if not target.hasdep:
                        warns.append(f"rank {g.id} tb {tb.id} step {st.s} waits on tb {st.depid} step {st.deps}, "
                                     "which has hasdep=0")
    return warns


class Simulator:
    def __init__(self, prog: Program, memories: Dict[int, RankMemory], ufunc: np.ufunc, slots: int,
                 interleave_seed: Optional[int] = None, detect_races: bool = True, on_step=None):
        """`on_step(1)` is called after each executed step (progress reports)."""
        self.prog = prog
        self.on_step = on_step
        self.conv = prog.convention
        self.ufunc = ufunc
        self.slots = slots
        self.rng = np.random.default_rng(interleave_seed) if interleave_seed is not None else None
        self.races = RaceDetector() if detect_races else None
        self.result = Execution()
        self.conns: Dict[ConnId, _Connection] = {}
        self.agents: List[_Agent] = []
        self.by_id: Dict[Tuple[int, int], _Agent] = {}
        for g in sorted(prog.gpus, key=lambda g: g.id):
            for tb in g.threadblocks:
                a = _Agent(g.id, tb, len(self.agents), memories[g.id])
                self.agents.append(a)
                self.by_id[(g.id, tb.id)] = a
                if tb.send >= 0:
                    a.send = self._conn((g.id, tb.send, tb.chan))
                    a.send.sender = a
                if tb.recv >= 0:
                    a.recv = self._conn((tb.recv, g.id, tb.chan))
                    a.recv.receiver = a
        for a in self.agents:
            if self.races is not None:
                a.vc = np.zeros(len(self.agents), dtype=np.int64)
            for st in a.steps:
                if st.depid >= 0:
                    self.by_id[(a.rank, st.depid)].needs_snapshot.add(st.deps)

    def _conn(self, key: ConnId) -> _Connection:
        c = self.conns.get(key)
        if c is None:
            c = self.conns[key] = _Connection(key)
        return c

    # --- scheduling ------------------------------------------------------
    def run(self) -> Execution:
        ready = [a for a in self.agents if a.steps]
        queue = deque(ready)
        waiting: Dict[tuple, List[_Agent]] = defaultdict(list)
        blocked: Dict[int, tuple] = {}
        try:
            while queue:
                if self.rng is None:
                    a = queue.popleft()
                else:
                    i = int(self.rng.integers(len(queue)))
                    queue.rotate(-i)
                    a = queue.popleft()
                wait = self._wait_for(a)
                if wait is not None:
                    waiting[wait].append(a)
                    blocked[a.gid] = wait
                    continue
                blocked.pop(a.gid, None)
                for key in self._execute(a):
                    sleepers = waiting.pop(key, None)
                    if sleepers:
                        queue.extend(sleepers)
                if self.on_step is not None:
                    self.on_step(1)
                if a.pc < len(a.steps):
                    queue.append(a)
        except _Fatal as exc:
            self.result.errors.append(str(exc))
            return self._finish()
        stuck = [a for a in self.agents if a.pc < len(a.steps)]
        if stuck:
            self.result.deadlock = [f"{a.where(a.pc)}: {self._describe(a)}" for a in stuck]
        else:
            for c in self.conns.values():
                if c.queue:
                    self.result.errors.append(
                        f"{len(c.queue)} message(s) from rank {c.key[0]} to rank {c.key[1]} on channel "
                        f"{c.key[2]} were never received (first sent by {c.queue[0].where})")
        return self._finish()

    def _finish(self) -> Execution:
        if self.races is not None:
            self.result.races = self.races.races
            self.result.races_truncated = self.races.truncated
        return self.result

    def _wait_for(self, a: _Agent) -> Optional[tuple]:
        """What `a`'s next step is waiting for, or None if it can run now."""
        st = a.steps[a.pc]
        if st.depid >= 0 and self.by_id[(a.rank, st.depid)].pc <= st.deps:
            return ("done", a.rank, st.depid)
        info = st.info
        if info.recv and not a.recv.queue:
            return ("push", a.recv.key)
        if info.send and len(a.send.queue) >= self.slots:
            return ("pop", a.send.key)
        return None

    def _describe(self, a: _Agent) -> str:
        st = a.steps[a.pc]
        if st.depid >= 0:
            dep = self.by_id[(a.rank, st.depid)]
            if dep.pc <= st.deps:
                state = f"blocked at {dep.where(dep.pc)}" if dep.pc < len(dep.steps) else "finished"
                return (f"waits for rank {a.rank} tb {st.depid} step {st.deps} to complete "
                        f"(tb {st.depid} has completed {dep.pc} step(s), {state})")
        info = st.info
        if info.recv and not a.recv.queue:
            src, dst, ch = a.recv.key
            s = a.recv.sender
            if s is None:
                return (f"waits for a message from rank {src} on channel {ch}, "
                        f"but no threadblock of rank {src} sends to rank {dst} on channel {ch}")
            state = f"blocked at {s.where(s.pc)}" if s.pc < len(s.steps) else "finished"
            return (f"waits for a message from rank {src} on channel {ch} "
                    f"(FIFO empty; {len(a.recv.consumers)} received so far; sender tb {s.tb.id} {state})")
        if info.send and len(a.send.queue) >= self.slots:
            src, dst, ch = a.send.key
            r = a.send.receiver
            who = (f"receiver blocked at {r.where(r.pc)}" if r and r.pc < len(r.steps)
                   else "no threadblock receives" if r is None else "receiver finished")
            return (f"waits for a free slot in the FIFO to rank {dst} on channel {ch} "
                    f"(all {self.slots} slot(s) full; {who})")
        return "runnable (internal error: scheduler lost it)"

    # --- one step --------------------------------------------------------
    def _execute(self, a: _Agent) -> List[tuple]:
        k = a.pc
        st = a.steps[k]
        info = st.info
        mem = a.mem
        rec = Executed(a.rank, a.tb.id, k, st.type, st.cnt)
        where = a.where(k)
        wake = [("done", a.rank, a.tb.id)]
        vc = a.vc
        if st.depid >= 0:
            dep = self.by_id[(a.rank, st.depid)]
            rec.dep = dep.records[st.deps]
            if vc is not None:
                np.maximum(vc, dep.snapshots[st.deps], out=vc)
        msg = None
        if info.recv:
            msg = a.recv.queue.popleft()
            if msg.cnt != st.cnt:
                raise _Fatal(f"{where} receives cnt={st.cnt} but the matched send {msg.where} sent "
                             f"cnt={msg.cnt} on channel {a.tb.chan}")
            rec.msg_from = msg.record
            a.recv.consumers.append(len(self.result.records))
            wake.append(("pop", a.recv.key))
            if vc is not None:
                np.maximum(vc, msg.vc, out=vc)
        if vc is not None:
            vc[a.gid] = k + 1
            acc = Access(a.gid, k + 1, where)
            for buf, off in step_reads(st, self.conv):
                for j in range(off, off + st.cnt):
                    self.races.read((a.rank,) + mem.location(buf, j), acc, vc)
            out = local_output(st, self.conv)
            if out is not None:
                for j in range(out[1], out[1] + st.cnt):
                    self.races.write((a.rank,) + mem.location(out[0], j), acc, vc)

        tile = self._compute(st, mem, msg)

        if info.send:
            conn = a.send
            q = len(conn.consumers) + len(conn.queue)
            if q >= self.slots:
                rec.slot_from = conn.consumers[q - self.slots]
            rec.conn_out = conn.key
            conn.queue.append(Message(tile, st.cnt, None if vc is None else vc.copy(),
                                      len(self.result.records), where))
            wake.append(("push", conn.key))
        a.records.append(len(self.result.records))
        self.result.records.append(rec)
        if vc is not None and k in a.needs_snapshot:
            a.snapshots[k] = vc.copy()
        a.pc = k + 1
        return wake

    def _computed(self, st: Step, mem: RankMemory, operand: Optional[np.ndarray] = None) -> np.ndarray:
        from .compute import compute_tile

        if self.prog.compute is None or st.compute is None or mem.compute_inputs is None:
            raise _Fatal(f"rank {mem.rank}: a {st.type} step in an IR without a <compute> operator")
        tile, why = compute_tile(self.prog.compute, mem.compute_inputs, st, mem.cs, operand)
        if tile is None:
            raise _Fatal(f"rank {mem.rank}: {st.type} step {st.s}: {why}")
        return tile

    def _compute(self, st: Step, mem: RankMemory, msg: Optional[Message]) -> Optional[np.ndarray]:
        """Move the data of one step; returns the tile it sends, if any."""
        value = STEP_VALUE[st.type]
        if value is None:
            return None
        src = local_input(st, self.conv)
        dst = local_output(st, self.conv)
        val = value(self.ufunc, lambda buf, off: mem.read(buf, off, st.cnt), src, dst,
                    msg and msg.tile, lambda *operand: self._computed(st, mem, *operand))
        if dst is not None:
            mem.write(dst[0], dst[1], st.cnt, val if st.epilogue is None else self._epilogue(st, mem, dst, val))
        return val if st.info.send else None

    def _epilogue(self, st: Step, mem: RankMemory, dst, val: np.ndarray) -> np.ndarray:
        from ..ir.epilogue import EpilogueError, apply

        index = mem.output_index(dst[0], dst[1], st.cnt)
        if index is None:
            raise _Fatal(f"rank {mem.rank}: {st.type} step {st.s} applies an epilogue to {dst[0]}[{dst[1]}], "
                         f"which is not memory of the output buffer")
        try:
            return apply(st.epilogue, val, index, self.prog.ngpus, mem.epilogue_inputs or {},
                         where=f"rank {mem.rank} {st.type} step {st.s}")
        except EpilogueError as exc:
            raise _Fatal(str(exc)) from None
