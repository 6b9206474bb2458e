"""Predicted run time of an executed schedule (alpha-beta, UNCALIBRATED).

The executor's trace already holds every ordering edge of the run: program
order within a threadblock, depid/deps, the send each receive matched and the
receive that freed each FIFO slot.  Replaying it in trace order (a valid
topological order) with a duration per step gives each step's start and end:

* sending `B` bytes over a link costs `B / rate` on the sender, with
  `rate = min(tb_Bps, port_Bps) * protocol efficiency`; the receiver sees the
  first byte `alpha` after the send started and finishes `B / rate` after
  that, so send and receive overlap as NCCL's sliced pipeline does;
* steps that receive and send (rcs, rrs, rrcs) forward while receiving;
* reductions and local copies cost `B / tb_mem_Bps` per extra operand pass;
* each rank's egress port of a link type is shared: transfers from one rank
  queue on it at `port_Bps` (a coarse fluid model, in trace order);
* every step pays `step_overhead_s`; the kernel launch pays `launch_s`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .cost_config import PROTOCOL_EFFICIENCY, CostConfig
from .executor import Executed

# nccl-tests' bus-bandwidth factors: how much data each rank must move
# relative to the buffer size for an optimal algorithm.
_BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


@dataclass
class Timing:
    start: List[float]
    end: List[float]
    total_s: float
    size_bytes: int
    algbw_GBps: float
    busbw_GBps: float
    calibrated: bool
    config_name: str


def predict(records: List[Executed], *, proto: str, coll: str, nranks: int, chunk_bytes: int,
            size_bytes: int, config: CostConfig) -> Timing:
    eff = PROTOCOL_EFFICIENCY[proto]
    start = [0.0] * len(records)
    end = [0.0] * len(records)
    xfer_start: Dict[int, float] = {}
    tb_free: Dict[Tuple[int, int], float] = {}
    port_free: Dict[Tuple[int, str], float] = {}
    t_launch = config.launch_s
    for i, rec in enumerate(records):
        B = rec.cnt * chunk_bytes
        t0 = tb_free.get((rec.rank, rec.tb), t_launch)
        if rec.dep is not None:
            t0 = max(t0, end[rec.dep])
        if rec.slot_from is not None:
            t0 = max(t0, end[rec.slot_from])
        t = t0 + config.step_overhead_s
        local = B / config.tb_mem_Bps
        finish = t
        data_start = t
        if rec.msg_from is not None:
            src = records[rec.msg_from]
            lt = config.link_type(src.rank, rec.rank)
            link = config.links[lt]
            rate = min(link.tb_Bps, link.port_Bps) * eff
            data_start = max(t, xfer_start[rec.msg_from] + link.alpha_s[proto])
            finish = data_start + B / rate
        if rec.type in ("rrc", "rrs", "rrcs", "re"):
            finish += local                      # one extra operand read
        elif rec.type == "cpy":
            finish = t + local
        if rec.conn_out is not None:
            dst = rec.conn_out[1]
            lt = config.link_type(rec.rank, dst)
            link = config.links[lt]
            rate = min(link.tb_Bps, link.port_Bps) * eff
            s0 = data_start
            key = (rec.rank, lt)
            port_done = max(port_free.get(key, 0.0), s0) + B / (link.port_Bps * eff)
            port_free[key] = port_done
            xfer_start[i] = s0
            finish = max(finish, s0 + B / rate, port_done)
        start[i] = t0
        end[i] = finish
        tb_free[(rec.rank, rec.tb)] = finish
    total = max(end, default=t_launch)
    algbw = size_bytes / total / 1e9 if total > 0 else 0.0
    factor = _BUS_FACTOR.get(coll, lambda n: 1.0)(nranks)
    return Timing(start, end, total, size_bytes, algbw, algbw * factor, config.calibrated, config.name)


def format_time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
