"""How much memory `simulate` will need, estimated from the IR and the call size
before anything is allocated, and the limit it is held to.

The estimate adds what stays alive through a run (the IR as read; every rank's
input, kept for the check; the rank buffers; the expected outputs; the race detector's vector
clocks and per-chunk access records; the trace of executed steps; the tiles
in flight in the FIFOs) to the largest short-lived allocation of one phase
(drawing one rank's inputs, the reference's float64 accumulator, the
comparison's float64 copies).  It errs high: a run it accepts fits, which is
what lets the limit be enforced rather than hoped for (tests/test_sim_memory.py
runs both sides of it under RLIMIT_AS).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Sequence

from .. import settings
from ..ir import Program
from ..ir.layout import Layout

ENV = "GC3_SIM_MAX_BYTES"

# Collectives whose every rank expects the same buffer: the reference keeps one (reference._shared).
SHARED_EXPECTATION = ("allreduce", "allgather", "broadcast", "reduce")

# Output elements compared per slice (driver._mismatches): a slice's float64 copies are the check's
# only temporaries.
CHECK_SLICE = 1 << 20

# Python objects per unit, measured on CPython 3.11 with some headroom: an executed-step record
# (driver.Executed and its list slot), a race-detector cell with its last write and a read, an
# agent's fixed part.
RECORD_BYTES = 400
CELL_BYTES = 700
AGENT_BYTES = 1024
# The IR itself per step: its Step object, and what reading the XML (lxml's tree, the text) left
# behind in the allocator; measured 2.7 KB per step on a 65024-step ring.
IR_STEP_BYTES = 3000


def max_bytes() -> int:
    """The limit: GC3_SIM_MAX_BYTES (a size such as 1GiB or 8589934592), default
    gc3.limits.MAX_SIMULATED_BYTES (8 GiB)."""
    return settings.get(ENV)


def format_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


@dataclass
class Footprint:
    """Bytes by what needs them; `total` is the estimated peak."""
    lasting: Dict[str, int] = field(default_factory=dict)
    transient: Dict[str, int] = field(default_factory=dict)   # phases that do not overlap: the largest counts

    @property
    def total(self) -> int:
        return sum(self.lasting.values()) + max(self.transient.values(), default=0)

    def describe(self) -> str:
        parts = sorted(self.lasting.items(), key=lambda kv: -kv[1])
        if self.transient:
            what, n = max(self.transient.items(), key=lambda kv: kv[1])
            parts.append((f"{what} (at its peak)", n))
        return ", ".join(f"{what} {format_bytes(n)}" for what, n in parts if n)


def _in_flight(prog: Program, slots: int):
    """(chunks, messages) that can sit in the FIFOs at once: per connection, its
    `slots` largest sends (a send needs a free slot, so no more are ever queued)."""
    sends: Dict[tuple, list] = {}
    for g in prog.gpus:
        for tb in g.threadblocks:
            if tb.send < 0:
                continue
            for st in tb.steps:
                if st.info.send:
                    sends.setdefault((g.id, tb.send, tb.chan), []).append(st.cnt)
    return sum(sum(sorted(c, reverse=True)[:slots]) for c in sends.values()), \
        sum(min(len(c), slots) for c in sends.values())


def estimate(prog: Program, layouts: Sequence[Layout], itemsize: int, *, aliased: bool, slots: int,
             detect_races: bool = True, op: str = "sum") -> Footprint:
    n = prog.ngpus
    fp = Footprint()
    ins = [L.in_elems for L in layouts]
    outs = [L.out_elems for L in layouts]
    cs = max((L.cs for L in layouts), default=0)
    in_e, out_e = max(ins, default=0), max(outs, default=0)
    fp.lasting["inputs"] = sum(ins) * itemsize
    fp.lasting["rank buffers"] = sum((max(i, o) if aliased else i + o) + L.scratch_elems
                                     for i, o, L in zip(ins, outs, layouts)) * itemsize
    shared = prog.coll in SHARED_EXPECTATION and prog.compute is None
    fp.lasting["expected outputs"] = out_e * itemsize * (1 if shared else n)
    if prog.compute is not None:
        # operator inputs per rank, and the fused reference's float64 value and tolerance per rank
        per_rank = sum(_prod(shape) for _, shape in prog.compute.inputs)
        fp.lasting["operator inputs"] = n * per_rank * 8
        fp.lasting["expected outputs"] = n * out_e * 16
    if prog.epilogue is not None:
        fp.lasting["epilogue inputs"] = 2 * n * out_e * itemsize
    chunks, messages = _in_flight(prog, slots)
    fp.lasting["messages in flight"] = chunks * cs * itemsize
    steps = sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks)
    agents = sum(len(g.threadblocks) for g in prog.gpus)
    fp.lasting["the IR"] = steps * IR_STEP_BYTES
    fp.lasting["trace"] = steps * RECORD_BYTES + agents * AGENT_BYTES
    if detect_races:
        total_chunks = sum(g.i_chunks + g.o_chunks + g.s_chunks for g in prog.gpus)
        cells = sum(L.blocks_in * L.chunks_per_block + L.blocks_out * L.chunks_per_block + L.s_chunks
                    for L in layouts) or total_chunks
        # one vector clock per agent, per message in flight and per step another waits on
        snapshots = sum(1 for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.depid >= 0)
        fp.lasting["race detection"] = cells * CELL_BYTES + (agents + messages + snapshots) * agents * 8
    tile = max((st.cnt for g in prog.gpus for tb in g.threadblocks for st in tb.steps), default=0) * cs
    # a step reads a tile, reduces into a new one and may copy it into a message
    fp.transient["step temporaries"] = 3 * tile * itemsize
    # one rank's int64 draw (prod: float64 draw, int16 count, masks) beside its converted copy
    fp.transient["drawing inputs"] = in_e * (8 + 8 + 2 + 2 + itemsize if op == "prod" else 8 + itemsize)
    # the float64 accumulator and one converted rank; allgather/alltoall concatenate whole outputs
    fp.transient["reference"] = 2 * max(in_e, out_e) * 8 + out_e * itemsize
    # float64 copies of a slice of both sides and isclose's temporaries
    fp.transient["check"] = 6 * min(max(out_e, in_e), CHECK_SLICE) * 8
    return fp


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out
