"""An indexed view of a scheduled IR that the verification passes share.

Threadblocks get a dense index so the passes can keep per-TB state in lists;
every send and receive step is filed under its connection so matching is a
zip of two lists.  Built only after `structure.check` has accepted the
program, so ids are unique and peers are in range.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

from ..ir import Program, Step, Threadblock


class Conn(NamedTuple):
    """A one-way FIFO: rank `src` sends to rank `dst` on channel `chan`."""

    src: int
    dst: int
    chan: int

    def __str__(self) -> str:
        return f"{self.src}->{self.dst} chan {self.chan}"


def where(rank: int, tb: int, step: Optional[int] = None, st: Optional[Step] = None) -> str:
    """How every verification message names a place in the IR."""
    text = f"rank {rank} tb {tb}"
    if step is not None:
        text += f" step {step}"
        if st is not None:
            text += f" ({st.type})"
    return text


@dataclass
class TB:
    rank: int
    tb: Threadblock
    send_conn: Optional[Conn]
    recv_conn: Optional[Conn]

    @property
    def id(self) -> int:
        return self.tb.id

    @property
    def steps(self) -> List[Step]:
        return self.tb.steps

    def at(self, step: Optional[int] = None) -> str:
        st = self.tb.steps[step] if step is not None and step < len(self.tb.steps) else None
        return where(self.rank, self.tb.id, step, st)


@dataclass
class Model:
    prog: Program
    tbs: List[TB] = field(default_factory=list)
    index: Dict[Tuple[int, int], int] = field(default_factory=dict)  # (rank, tb id) -> position in tbs
    # Per connection, the (tb position, step number) of each send / receive in program order.
    sends: Dict[Conn, List[Tuple[int, int]]] = field(default_factory=dict)
    recvs: Dict[Conn, List[Tuple[int, int]]] = field(default_factory=dict)
    sender: Dict[Conn, int] = field(default_factory=dict)    # the TB that owns each direction
    receiver: Dict[Conn, int] = field(default_factory=dict)

    @property
    def connections(self) -> List[Conn]:
        return sorted(set(self.sends) | set(self.recvs))


def build_model(prog: Program) -> Model:
    m = Model(prog)
    for g in prog.gpus:
        for tb in g.threadblocks:
            send = Conn(g.id, tb.send, tb.chan) if tb.send >= 0 else None
            recv = Conn(tb.recv, g.id, tb.chan) if tb.recv >= 0 else None
            pos = len(m.tbs)
            m.index[(g.id, tb.id)] = pos
            m.tbs.append(TB(g.id, tb, send, recv))
            if send is not None:
                m.sender[send] = pos
            if recv is not None:
                m.receiver[recv] = pos
            for k, st in enumerate(tb.steps):
                if st.info.send:
                    m.sends.setdefault(send, []).append((pos, k))
                if st.info.recv:
                    m.recvs.setdefault(recv, []).append((pos, k))
    return m
