"""Pass 4: channel assignment.

A fused instruction (`rcs`/`rrs`/`rrcs`) receives and sends in one step, so
its receive connection and its send connection must belong to the same
threadblock, hence the same channel.  Following communication edges through
fused instructions gives *chains* (send -> fused -> ... -> fused -> receive)
that must each sit on one channel.  On a channel, a rank can pair a given
send peer with only one receive peer (one TB per connection and direction),
so two chains forwarding through a rank in incompatible ways go to different
channels.  Each chain takes the user's `ch=` if given (fusion never chains ops
that ask for different ones), otherwise the lowest channel where its pairings fit.  Unfused sends
and receives carry no such constraint and take channel 0 (or `ch=`).

Channels are chosen once, on the first parallel copy; copy q of an
instruction under `parallelize` (see `replication.py`) gets `channel + q*C`,
where C is the number of channels one copy uses, and instance i adds
`i * per_instance` when the IR is emitted, so copies never share a channel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..errors import ScheduleError
from ..ir.opcodes import FUSED
from .instruction_dag import InstrDAG

__all__ = ["ChannelAssignment", "assign_channels"]

_FUSED = FUSED          # receive and send in one step


@dataclass
class ChannelAssignment:
    dag: InstrDAG
    chan: List[int]          # per instruction, first instance
    nchannels: int           # all instances
    per_instance: int        # channels one instance uses; instance i adds i * per_instance


def _chains(dag: InstrDAG):
    """Chains of the first copy, each a list of instruction ids from send to final receive."""
    instrs, send_to = dag.instrs, dag.send_to
    for x in instrs:
        if x.part != 0 or x.type != "s":
            continue
        chain = [x.id]
        y = send_to[x.id]
        while y >= 0:
            chain.append(y)
            if instrs[y].type not in _FUSED:
                break
            y = send_to[y]
        yield chain


def assign_channels(dag: InstrDAG) -> ChannelAssignment:
    instrs = dag.instrs
    base: Dict[int, int] = {}              # origin id -> channel (first copy)
    pair_send: Dict[Tuple[int, int, int], Tuple[int, int]] = {}   # (rank, ch, send peer) -> (recv peer, instr)
    pair_recv: Dict[Tuple[int, int, int], Tuple[int, int]] = {}   # (rank, ch, recv peer) -> (send peer, instr)
    tb_chan: Dict[Tuple[int, int], Tuple[int, int]] = {}          # (rank, user tb) -> (ch, instr)

    def conflict(chain, c):
        """None if `chain` fits on channel c, else (instr, the instr it clashes with, why)."""
        for i in chain:
            x = instrs[i]
            if x.type in _FUSED:
                got = pair_send.get((x.rank, c, x.send_peer))
                if got is not None and got[0] != x.recv_peer:
                    return x, got[1], (f"on channel {c}, rank {x.rank}'s send connection to rank {x.send_peer} "
                                       f"already forwards data received from rank {got[0]}")
                got = pair_recv.get((x.rank, c, x.recv_peer))
                if got is not None and got[0] != x.send_peer:
                    return x, got[1], (f"on channel {c}, rank {x.rank}'s receive connection from rank "
                                       f"{x.recv_peer} already forwards to rank {got[0]}")
            if x.tb is not None:
                got = tb_chan.get((x.rank, x.tb))
                if got is not None and got[0] != c:
                    return x, got[1], f"threadblock {x.tb} of rank {x.rank} is on channel {got[0]}"
        return None

    def reserve(chain, c):
        for i in chain:
            x = instrs[i]
            base[x.origin] = c
            if x.type in _FUSED:
                pair_send.setdefault((x.rank, c, x.send_peer), (x.recv_peer, i))
                pair_recv.setdefault((x.rank, c, x.recv_peer), (x.send_peer, i))
            if x.tb is not None:
                tb_chan.setdefault((x.rank, x.tb), (c, i))

    pinned, free = [], []
    for chain in _chains(dag):
        # fusion cut every chain whose ops ask for two different channels
        wanted = {instrs[i].ch for i in chain} - {None}
        (pinned if wanted else free).append((chain, min(wanted) if wanted else None))
    for chain, c in pinned:
        clash = conflict(chain, c)
        if clash is not None:
            x, other, why = clash
            raise ScheduleError(f"{x.where}: cannot use ch={c} for {x.describe()}: {why} "
                                f"({instrs[other].describe()})")
        reserve(chain, c)
    for chain, _ in free:
        fused = any(instrs[i].type in _FUSED or instrs[i].tb is not None for i in chain)
        c = 0
        while fused and conflict(chain, c) is not None:
            c += 1
        reserve(chain, c)
    # Local instructions: the user's channel, else their threadblock's, else 0.
    for x in instrs:
        if x.part != 0 or x.origin in base:
            continue
        if x.ch is not None:
            c = x.ch
        elif x.tb is not None and (x.rank, x.tb) in tb_chan:
            c = tb_chan[(x.rank, x.tb)][0]
        else:
            c = 0
        base[x.origin] = c
        if x.tb is not None:
            tb_chan.setdefault((x.rank, x.tb), (c, x.id))
    per_copy = max(base.values(), default=0) + 1
    chan = [base[x.origin] + x.part * per_copy for x in instrs]
    per_instance = per_copy * dag.plan.copies
    used = max(chan, default=0) + 1
    return ChannelAssignment(dag=dag, chan=chan, nchannels=(dag.plan.instances - 1) * per_instance + used,
                             per_instance=per_instance)
