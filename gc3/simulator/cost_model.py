"""Predicted run time of an executed schedule, tile by tile, as the runtime runs it.

The executor's trace holds every ordering edge of the run: program order
within a threadblock, depid/deps, the send each receive matched.  The CUDA
runtime moves each chunk in tiles (as many bytes as a FIFO slot holds, see
`CostConfig.slot_data_bytes`) and each threadblock walks, per tile, all of
its steps; so the model replays the trace once per tile (tile-major order is
a valid topological order: every edge points to the same or an earlier tile)
with these costs per (step, tile) of B payload bytes:

* every step but nop pays `step_overhead_s`, a cross-threadblock wait `dep_s` on top
  of the step it waits for, the kernel launch `launch_s` once;
* sending costs B / tb_Bps[proto] on the sender, and its wire bytes
  (B / protocol efficiency) queue on the sending rank's port of that link
  type at port_Bps, so many threadblocks share one link's bandwidth;
* Simple: a receiver sees a tile `alpha` after the sender finished storing
  it (the tail is written after the whole tile); LL: lines are seen `alpha`
  after they are stored, so receiving overlaps sending;
* a receiving step then copies B out of the FIFO at tb_mem_Bps (r, rcs), or
  reduces at tb_reduce_Bps (rrc; rrs/rrcs reduce and then forward), cpy
  copies at tb_mem_Bps and re reduces at tb_reduce_Bps;
* a send needs a free FIFO slot: the receive `slots` messages earlier on the
  same connection must have finished, and its credit travels back in alpha;
* a compute step of a fused IR (gemv, ebag, gemm) costs `compute_seconds` for
  its whole output on its first tile (the operator writes the chunk before any
  tile of it is sent), and a rank's compute steps run one at a time (one
  compute stream per rank, as cuBLAS calls on one stream), while its
  threadblocks keep communicating: that is the overlap a fused program buys.

Compute costs (`compute_seconds`).  gemv and ebag read far more than they
compute: their time is the bytes they read over HBM bandwidth.  A GEMM chunk
of R x N outputs (inner dimension K) runs in waves: ceil(R/tr)*ceil(N/tc)
output tiles over `sms` SMs, each wave taking 2*tr*tc*K flops at the per-SM
share of `gemm_efficiency` x peak (times the tile's efficiency), with the
fastest tile of `gemm_tiles` (a small chunk takes a smaller tile rather than
leave SMs idle), plus `gemm_chunk_s` per chunk (launch and flag release).  Wave quantization is why
chunking costs little at GEMM+RS shapes (M=4096, N=8192 cut into 4 row
blocks: each chunk still fills whole waves, +1-2% measured) and much at an
AG+GEMM shape (N/n = 7168 and 1024-row chunks: 224 tiles, 1.7 waves rounded
up to 2, where the whole GEMM needs 7 waves for 4; +18-28% measured on 2x H200);
`choose_gemm_chunks` uses it to pick a fused program's chunk count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .. import limits
from ..units import bus_factor
from ..ir.opcodes import COMPUTE, REDUCES, SENDS
from .cost_config import PROTOCOL_EFFICIENCY, CostConfig
from .executor import Executed

_SENDS = SENDS
_REDUCES = REDUCES


@dataclass
class Timing:
    start: List[float]      # per trace record: its first tile's start ...
    end: List[float]        # ... and its last tile's end
    total_s: float
    size_bytes: int
    algbw_GBps: float
    busbw_GBps: float
    calibrated: bool
    config_name: str
    calibration: str = "spec figures"   # where the figures come from (or why they are not calibrated)
    tile_bytes: int = 0
    ntiles: int = 0
    spans: Optional[List[List[Tuple[float, float]]]] = None   # per record, (start, end) of each tile

    @property
    def provenance(self) -> str:
        """Which figures predicted this, and whether they were measured."""
        mark = self.calibration if self.calibrated else f"UNCALIBRATED: {self.calibration}"
        return f"{self.config_name}, {mark}"


@dataclass(frozen=True)
class Schedule:
    """The trace's ordering edges as flat arrays, built once per trace and
    reused for every size and configuration (the calibration times each
    program at many sizes)."""
    types: Tuple[str, ...]
    cnt: Tuple[int, ...]
    tb: Tuple[int, ...]              # dense threadblock index of each record
    ntbs: int
    first_of_tb: Tuple[bool, ...]    # record is its threadblock's first step
    dep: Tuple[int, ...]             # -1: none
    msg_from: Tuple[int, ...]        # -1: receives nothing
    send_conn: Tuple[int, ...]       # dense connection index, -1: sends nothing
    send_pos: Tuple[int, ...]        # k: the record is the k-th send of its connection within a tile
    conn_sends: Tuple[int, ...]      # sends per tile on each connection
    conn_recvs: Tuple[Tuple[int, ...], ...]  # per connection, the receiving record of its k-th message
    conn_port: Tuple[Tuple[int, str], ...]   # (sending rank, link type) of each connection
    max_cnt: int

    @classmethod
    def of(cls, records: Sequence[Executed], config: CostConfig) -> "Schedule":
        tbs: Dict[Tuple[int, int], int] = {}
        conns: Dict[tuple, int] = {}
        tb, first, send_conn, send_pos = [], [], [], []
        conn_sends: List[int] = []
        for rec in records:
            key = (rec.rank, rec.tb)
            first.append(key not in tbs)
            tb.append(tbs.setdefault(key, len(tbs)))
            if rec.conn_out is not None and rec.type in _SENDS:
                c = conns.setdefault(rec.conn_out, len(conns))
                if c == len(conn_sends):
                    conn_sends.append(0)
                send_conn.append(c)
                send_pos.append(conn_sends[c])
                conn_sends[c] += 1
            else:
                send_conn.append(-1)
                send_pos.append(-1)
        recvs: List[List[int]] = [[0] * n for n in conn_sends]
        for j, rec in enumerate(records):
            if rec.msg_from is not None:
                i = rec.msg_from
                recvs[send_conn[i]][send_pos[i]] = j
        ports = [None] * len(conns)
        for (src, dst, _chan), c in conns.items():
            ports[c] = (src, config.link_type(src, dst))
        moving = [r.cnt for r in records if r.type != "nop" and (r.msg_from is not None or r.conn_out is not None)]
        return cls(
            types=tuple(r.type for r in records), cnt=tuple(r.cnt for r in records), tb=tuple(tb), ntbs=len(tbs),
            first_of_tb=tuple(first), dep=tuple(-1 if r.dep is None else r.dep for r in records),
            msg_from=tuple(-1 if r.msg_from is None else r.msg_from for r in records),
            send_conn=tuple(send_conn), send_pos=tuple(send_pos), conn_sends=tuple(conn_sends),
            conn_recvs=tuple(tuple(x) for x in recvs), conn_port=tuple(ports), max_cnt=max(moving, default=1))


def tile_of(chunk_bytes: int, itemsize: int, proto: str, max_cnt: int, config: CostConfig) -> Tuple[int, int]:
    """(bytes per chunk-tile, tiles per chunk), the runtime's rule
    (runtime_cuda.core.binding.tile_lanes) in bytes."""
    if chunk_bytes <= 0:
        return 0, 0
    tiles, min_bytes = config.tile_split
    granule = limits.tile_granule_bytes(proto)
    lanes = limits.tile_elems(chunk_bytes // itemsize, itemsize, config.slot_data_bytes[proto], max_cnt,
                              tiles, min_bytes, granule)
    # A slot too small for one granule per chunk: the runtime refuses; model one granule.
    tile = (lanes or max(granule // itemsize, 1)) * itemsize
    return tile, -(-chunk_bytes // tile)


def _gemm_time(rows: int, cols: int, k: int, config: CostConfig) -> float:
    """One GEMM of rows x cols outputs: the fastest of the tile shapes, each running whole waves."""
    per_sm = config.bf16_flops * config.gemm_efficiency / config.sms
    best = None
    for tr, tc, eff in config.gemm_tiles:
        waves = -(-(-(-rows // tr) * -(-cols // tc)) // config.sms)
        t = waves * 2.0 * tr * tc * k / (per_sm * eff)
        best = t if best is None else min(best, t)
    return best


def compute_seconds(spec, out_elems: int, config: CostConfig) -> float:
    """Time of one compute step of operator `spec` (gc3.ir.ComputeSpec) that writes `out_elems`
    elements of the collective's buffer (the model in this module's docstring)."""
    from ..dtypes import dtype_info

    isz = dtype_info(spec.dtype).np.itemsize
    if spec.op in ("gemm", "agemm"):
        _, k, n = spec.gemm_dims()
        per_row = spec.split()[2]           # buffer elements per row of C (agemm: chunk-padded)
        return _gemm_time(max(out_elems // per_row, 1), n, k, config) + config.gemm_chunk_s
    if spec.op == "gemv":
        batch, k, _ = spec.gemv_dims()
        read = (out_elems // batch) * k * isz                  # the weight columns; x is small
    elif spec.op == "ebag":
        t, _, dim, nnz, total = spec.ebag_dims()
        read = out_elems * (nnz / total) * isz + out_elems / dim * (nnz / total) * 4   # rows + int32 indices
    else:
        raise ValueError(f"no cost for compute operator {spec.op!r}")
    return read / config.hbm_Bps


def input_copy_seconds(nbytes: int, config: CostConfig) -> float:
    """The runtime's copy of a call's input into its output before an in-place
    program serves an out-of-place call: one device-to-device copy, HBM-bound
    (every byte read and written once)."""
    return config.copy_launch_s + 2 * nbytes / config.hbm_Bps if nbytes else 0.0


def gemm_seconds(spec, chunks: int, config: CostConfig) -> float:
    """The GEMM of `spec` cut into `chunks` row blocks, run one after another (what a fused
    program's compute stream does); chunks=1 is one cuBLAS call."""
    m = spec.gemm_dims()[0]
    return chunks * compute_seconds(spec, (m // chunks) * spec.split()[2], config)


def predict(records: List[Executed], *, proto: str, coll: str, nranks: int, chunk_bytes: int,
            size_bytes: int, config: CostConfig, itemsize: int = 4, slots: Optional[int] = None,
            schedule: Optional[Schedule] = None, spans: bool = False, compute=None) -> Timing:
    """`spans`: also keep every (step, tile)'s interval, for the timeline.  `compute`: a fused
    IR's gc3.ir.ComputeSpec, which prices its compute steps (without it they cost a step)."""
    sched = Schedule.of(records, config) if schedule is None else schedule
    slots = limits.FIFO_SLOTS[proto] if slots is None else slots
    tile, ntiles = tile_of(chunk_bytes, itemsize, proto, sched.max_cnt, config)
    n = len(sched.types)
    launch = config.launch_s
    start = [launch] * n
    end = [launch] * n
    total = launch
    tile_spans = [[] for _ in range(n)] if spans else None
    comp = [0.0] * n
    if compute is not None:
        for i, rec in enumerate(records):
            if rec.type in COMPUTE:
                comp[i] = compute_seconds(compute, rec.cnt * chunk_bytes // itemsize, config)
    ranks = [rec.rank for rec in records]
    if ntiles:
        total = _replay(sched, config, proto, slots, chunk_bytes, tile, ntiles, start, end, tile_spans,
                        comp, ranks)
    algbw = size_bytes / total / 1e9 if total > 0 else 0.0
    factor = bus_factor(coll, nranks)
    used = {lt for _, lt in sched.conn_port}
    derived = sorted({config.links[lt].derived[proto] for lt in used if proto in config.links[lt].derived})
    calibrated = config.calibrated and all(config.links[lt].calibrated for lt in used) and not derived
    note = config.calibration
    if config.calibrated and not all(config.links[lt].calibrated for lt in used):
        note = f"{', '.join(sorted(lt for lt in used if not config.links[lt].calibrated))} link(s) not measured"
    elif config.calibrated and derived:
        note = "; ".join(derived)
    elif calibrated and config.measured_ranks and nranks != config.measured_ranks:
        note += f"; {nranks} ranks extrapolated from {config.measured_ranks}"
    return Timing(start, end, total, size_bytes, algbw, algbw * factor, calibrated, config.name, note, tile, ntiles,
                  tile_spans)


def _replay(s: Schedule, cfg: CostConfig, proto: str, slots: int, chunk_bytes: int, tile: int, ntiles: int,
            start: List[float], end: List[float], spans: Optional[List[list]], comp: List[float],
            ranks: List[int]) -> float:
    eff = PROTOCOL_EFFICIENCY[proto]
    ll = proto in limits.FLAGGED_PROTOCOLS   # read line by line as it lands, no tail word
    n = len(s.types)
    ports = sorted(set(s.conn_port))
    port_idx = {p: k for k, p in enumerate(ports)}
    conn_port = [port_idx[p] for p in s.conn_port]
    conn_alpha = [cfg.links[lt].alpha_s[proto] for _, lt in s.conn_port]
    conn_tb_rate = [cfg.links[lt].tb_Bps[proto] for _, lt in s.conn_port]
    wire_rate = [cfg.links[lt].port_Bps * eff for _, lt in ports]
    port_free = [0.0] * len(ports)
    mem, red = 1.0 / cfg.tb_mem_Bps, 1.0 / cfg.tb_reduce_Bps
    over, dep_s, launch = cfg.step_overhead_s, cfg.dep_s, cfg.launch_s
    types, cnt, tbi, dep, msg = s.types, s.cnt, s.tb, s.dep, s.msg_from
    send_conn, send_pos, conn_sends, conn_recvs = s.send_conn, s.send_pos, s.conn_sends, s.conn_recvs
    tb_free = [launch] * s.ntbs
    stream_free: Dict[int, float] = {}    # each rank's compute stream
    # Per tile: when each record's tile ended, and when its send began/ended.
    ends: List[List[float]] = []
    xs = [0.0] * n
    xe = [0.0] * n
    total = launch
    for t in range(ntiles):
        B_lane = min(tile, chunk_bytes - t * tile)
        e_t = [0.0] * n
        for i in range(n):
            B = B_lane * cnt[i]
            t0 = tb_free[tbi[i]]
            d = dep[i]
            if d >= 0:
                t0 = max(t0, e_t[d] + dep_s)
            c = send_conn[i]
            if c >= 0:
                m = t * conn_sends[c] + send_pos[i] - slots   # the message whose slot this send reuses
                if m >= 0:
                    mt, mk = divmod(m, conn_sends[c])
                    r = conn_recvs[c][mk]
                    t0 = max(t0, (ends[mt] if mt < t else e_t)[r] + conn_alpha[c])
            now = t0 + over if types[i] != "nop" else t0   # the runtime folds nops into dependencies
            x0 = now
            j = msg[i]
            if j >= 0:                       # receive: wait for the data, copy or reduce it out of the FIFO
                a = conn_alpha[send_conn[j]]
                landed = xe[j] + a
                now = max(now, xs[j] + a if ll else landed)
                x0 = now                     # a forward stores as it reads
                work = B * (red if types[i] in _REDUCES else mem)
                if c < 0:
                    now += work
                    if ll and now < landed:
                        now = landed
            else:
                ty = types[i]
                if ty == "cpy":
                    now += B * mem
                elif ty == "re":
                    now += B * red
                elif comp[i] and t == 0:     # the whole chunk, on the rank's one compute stream
                    now = max(now, stream_free.get(ranks[i], 0.0)) + comp[i]
                    stream_free[ranks[i]] = now
                    t0 = now - comp[i]           # shown from when the stream takes it up
            if c >= 0:
                p = conn_port[c]
                pf = max(port_free[p], x0) + B / wire_rate[p]
                port_free[p] = pf
                busy = B / conn_tb_rate[c]
                if j >= 0:
                    busy = max(work, busy + (B * red if types[i] in _REDUCES else 0.0))
                now = max(x0 + busy, pf)
                if j >= 0 and ll and now < landed:
                    now = landed
                xs[i], xe[i] = x0, now
            e_t[i] = now
            tb_free[tbi[i]] = now
            if t == 0:
                start[i] = t0
            if spans is not None:
                spans[i].append((t0, now))
            if now > total:
                total = now
        ends.append(e_t)
        for i in range(n):
            end[i] = e_t[i]
    return total


def format_time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
