"""`gc3 bench --fused` and `gc3 tune --fused`: the fused operators timed against
what a PyTorch user runs, in one job, one process per GPU (torchrun, or mpirun).
The GEMM operators come first; GEMV + all_reduce, embedding-bag + all_to_all and
all_reduce + epilogue (the memory-bound operators) have their own section at the end.

Every time is a CUDA-event median of `rounds` rounds of `calls` back-to-back
calls, the maximum over ranks, in microseconds per call (fused, auto, seq_nccl and fused_ce
with their rounds taken in turn, Timer.devices):

    seq_nccl   torch.matmul then the NCCL collective on an NCCL group, one stream
    symm       PyTorch's own fused op (torch.ops.symm_mem) on that NCCL group, where it exists
    fused      gc3's fused path, forced, on a gc3 group (the tile-store GEMM storing the peers'
               tiles itself, unless GC3_FUSED_PEER_TILES says otherwise)
    fused_ce   the same with the copy engines carrying the peers' tiles (GEMM + reduce-scatter,
               all-reduce, all-to-all); auto takes whichever the catalog's entry names
    auto       what a gc3 group does by default (the measured table, else sequential)
    gemm       the matmul alone;  comm_nccl: the NCCL collective alone
    comm_fused the fused path's exchange alone (its chunked collectives, no GEMM)
    host       host time per call, a timer around `calls` calls with no synchronisation
               (host: the fused path; seq_host: the sequential path on the NCCL group)
    graph_*    the same calls replayed from a CUDA graph

`check` compares sampled output rows of the fused path with an fp32 reference
built from every rank's inputs (each rank regenerates them from the seed) and
requires its error to be no larger than the sequential path's (+ a rounding
allowance), and the all-reduce's result to be bit-identical on every rank.

Each shape's result is one line of the measured-lines schema, appended to the
record file (rank 0).  `tune` times the sequential path and the fused path at
several chunk counts on the gc3 group (the tile-store GEMM: with its stores and with
the copy engines) and writes the faster into a catalog's `fused` section
(runtime_cuda.fused.choice reads it).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from runtime_cuda.fused import choice, records

from .process_group import _DTYPES as DTYPE_NAME

# The grid: (K, N) of the full layer, sharded over the G ranks as tensor parallelism does.
AG_KN = ((4096, 14336), (8192, 28672), (16384, 53248))
RS_KN = ((14336, 4096), (28672, 8192), (53248, 16384))
GRID_M = (1024, 2048, 4096, 8192, 16384)
AR_M = (256, 1024, 4096, 8192)
A2A_KN = ((4096, 4096), (7168, 2048))
A2A_M = (2048, 8192, 16384)
OPS = choice.OPS[:4]          # the GEMM family; the memory-bound operators follow below
# Each GEMM operator's function in the fused pipelines (ops._pipeline).
PIPELINE_RUNS = {"ag_gemm": "all_gather_matmul", "gemm_rs": "matmul_reduce_scatter", "gemm_ar": "matmul_all_reduce",
                 "gemm_a2a": "matmul_all_to_all"}
# The M at which the benchmark also traces one fused call and reports its overlap.
TRACE_M = 8192
TUNE_CHUNKS = (2, 4, 8)
# auto goes fused only where fused beat the sequential path by this much.
FUSED_MARGIN = 0.98
# The copy engines carry an eager call's peer tiles only where they beat the GEMM's own stores
# by this much (they take more driver work, and a graph a shape).
PEER_TILES_MARGIN = 0.99
# The tune times the paths of a shape again where fused and sequential came out closer than
# this, and keeps each path's faster median: one slow round of the sequential path (166 us
# against 132 in a later job) once sent a shape to the fused path that lost to NCCL by 6%.
RETIME_WITHIN = 0.10
FIELDS = records.FIELDS


def grid(ops: Sequence[str], quick: bool) -> List[Tuple[str, int, int, int]]:
    shapes = []
    for op in ops:
        if op == "ag_gemm":
            shapes += [(op, M, K, N) for K, N in AG_KN for M in GRID_M]
        elif op == "gemm_rs":
            shapes += [(op, M, K, N) for K, N in RS_KN for M in GRID_M]
        elif op == "gemm_ar":
            shapes += [(op, M, K, N) for K, N in RS_KN for M in AR_M]
        elif op == "gemm_a2a":
            shapes += [(op, M, K, N) for K, N in A2A_KN for M in A2A_M]
        else:
            raise ValueError(f"unknown fused op {op!r}; choose from {', '.join(OPS)}")
    return shapes[::3] if quick else shapes


@dataclass
class Job:
    rank: int
    size: int
    device: torch.device
    gc3: dist.ProcessGroup
    nccl: Optional[dist.ProcessGroup]
    hw: str


def start() -> Job:
    """Both groups of the job: the default group is gc3's, an NCCL group beside it."""
    import runtime_cuda.torch_dist as gc3_torch

    env = os.environ
    if "RANK" not in env and "OMPI_COMM_WORLD_RANK" in env:      # mpirun instead of torchrun
        env["RANK"], env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
        env["LOCAL_RANK"] = env.get("OMPI_COMM_WORLD_LOCAL_RANK", env["RANK"])
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", "29517")
    if "RANK" not in env:
        raise RuntimeError("gc3 bench --fused runs one process per GPU under torchrun or mpirun")
    local = int(env.get("LOCAL_RANK", env["RANK"]))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    gc3_torch.register()
    dist.init_process_group("cpu:gloo,cuda:gc3", timeout=datetime.timedelta(seconds=300))
    rank, size = dist.get_rank(), dist.get_world_size()
    nccl = None
    if torch.cuda.device_count() >= size:
        nccl = dist.new_group(backend="nccl")
    name = torch.cuda.get_device_name(device).replace("NVIDIA ", "").split()[0]
    return Job(rank, size, device, dist.group.WORLD, nccl, f"{size}x{name}")


class DistDriven:
    """A torch.distributed group (NCCL) driven the way overlap.py drives a gc3 group
    (`_cuda`, `_submit`), so that the overlap pipeline can run on it for comparison."""

    def __init__(self, pg, device: torch.device):
        self.pg, self._device = pg, device

    def size(self) -> int:
        return self.pg.size()

    def _cuda(self, tensors, what):
        return None

    def _submit(self, comm, coll, send, recv, count, op):
        if coll == "reducescatter":
            dist.reduce_scatter_tensor(recv, send, group=self.pg)
        elif coll == "allreduce":
            dist.all_reduce(recv, group=self.pg)
        elif coll == "allgather":
            dist.all_gather_into_tensor(recv, send, group=self.pg)
        else:
            dist.all_to_all_single(recv, send, group=self.pg)


# --- inputs and references ---------------------------------------------------------
def _seed(key: Tuple) -> int:
    """The same number in every process: Python's hash() of a string differs between
    processes, and every rank must be able to rebuild any rank's operands."""
    return zlib.crc32(repr(key).encode()) & 0x7FFFFFFF


def _tensor(seed: Tuple, shape, device, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(_seed(seed))
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(torch.bfloat16)


@dataclass
class Case:
    op: str
    M: int
    K: int
    N: int
    G: int
    device: torch.device
    inputs: Dict[str, torch.Tensor] = field(default_factory=dict)

    def operands(self, r: int):
        """Rank r's (A, B) as the operator takes them."""
        op, M, K, N, G, dev = self.op, self.M, self.K, self.N, self.G, self.device
        if op == "ag_gemm":
            return _tensor((op, M, K, N, "A", r), (M // G, K), dev), _tensor((op, M, K, N, "B", r), (K, N // G), dev,
                                                                              K ** -0.5)
        if op in ("gemm_rs", "gemm_ar"):
            return _tensor((op, M, K, N, "A", r), (M, K // G), dev), _tensor((op, M, K, N, "B", r), (K // G, N), dev,
                                                                             K ** -0.5)
        return _tensor((op, M, K, N, "A", r), (M, K), dev), _tensor((op, M, K, N, "B", 0), (K, N), dev, K ** -0.5)

    def reference_rows(self, rank: int, rows: torch.Tensor) -> torch.Tensor:
        """fp32 reference of output rows `rows` of this rank's result."""
        op, G = self.op, self.G
        if op == "ag_gemm":
            _, B = self.operands(rank)
            A = torch.cat([self.operands(s)[0].float() for s in range(G)])
            return A[rows] @ B.float()
        if op in ("gemm_rs", "gemm_ar"):
            base = rank * (self.M // G) if op == "gemm_rs" else 0
            total = None
            for s in range(G):
                A, B = self.operands(s)
                part = A[rows + base].float() @ B.float()
                total = part if total is None else total + part
            return total
        mp = self.M // G         # gemm_a2a: rows block q of the result came from rank q's rows block `rank`
        blocks = []
        for q in range(G):
            A, B = self.operands(q)
            blocks.append(A[rank * mp:(rank + 1) * mp].float() @ B.float())
        return torch.cat(blocks)[rows]


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# --- the calls -----------------------------------------------------------------------
def _ops():
    from . import ops
    return ops


def fused_call(case: Case, A, B, pg, path: Optional[str], chunks: Optional[int] = None) -> Callable:
    ops = _ops()
    if case.op == "ag_gemm":
        return lambda: ops.fused_all_gather_matmul(A, [B], 0, pg, path=path, chunks=chunks)[1][0]
    if case.op == "gemm_rs":
        return lambda: ops.fused_matmul_reduce_scatter(A, B, "sum", 0, pg, path=path, chunks=chunks)
    if case.op == "gemm_ar":
        return lambda: ops.fused_matmul_all_reduce(A, B, pg, path=path, chunks=chunks)
    return lambda: ops.fused_matmul_all_to_all(A, B, pg, path=path, chunks=chunks)


def seq_call(case: Case, A, B, pg) -> Callable:
    """What a PyTorch user runs: torch.matmul, then the group's collective."""
    G = case.G
    if case.op == "ag_gemm":
        def run():
            full = A.new_empty((A.shape[0] * G, A.shape[1]))
            dist.all_gather_into_tensor(full, A, group=pg)
            return full @ B
    elif case.op == "gemm_rs":
        def run():
            C = A @ B
            out = C.new_empty((C.shape[0] // G, C.shape[1]))
            dist.reduce_scatter_tensor(out, C, group=pg)
            return out
    elif case.op == "gemm_ar":
        def run():
            C = A @ B
            dist.all_reduce(C, group=pg)
            return C
    else:
        def run():
            C = A @ B
            out = torch.empty_like(C)
            dist.all_to_all_single(out, C, group=pg)
            return out
    return run


def comm_call(case: Case, A, B, pg, chunks: int = 1, fused: bool = False) -> Callable:
    """The operator's exchange alone: `chunks` collectives of the bytes the GEMM's
    chunks produce (1: one collective of the whole).  `fused`: the fused path's own
    exchange on the gc3 group `pg`: the tile-store GEMM with K = 8, or under
    GC3_FUSED_EXCHANGE=copy-engine the copy-engine pipeline on a GEMM emptied of work
    (K = 0, or B of no columns for AG+GEMM), so that the same bytes move."""
    from . import ops
    from .overlap import _pieces, bounds

    run = ops._pipeline(PIPELINE_RUNS[case.op])
    if fused and not ops.tile_store_refusal(pg, case.op, A, B):
        if case.op == "ag_gemm":
            # Its exchange is the push of A: a B of 8 columns leaves the GEMM almost nothing.
            B8 = [torch.randn((B.shape[0], 8), device=B.device).to(B.dtype)]
            return lambda: run(pg, A, B8, 1, False, "comm_fused")
        # The tile-store GEMM's exchange is its tiles' stores: a GEMM of K = 8 stores the same tiles.
        A8 = torch.randn((A.shape[0], 8), device=A.device).to(A.dtype)
        B8 = torch.randn((8, B.shape[1]), device=B.device).to(B.dtype)
        return lambda: run(pg, A8, B8, 1, "comm_fused")
    if fused and run.__module__.endswith("copy_engine"):
        if case.op == "ag_gemm":
            none = [B.new_zeros((B.shape[0], 0))]
            return lambda: run(pg, A, none, 1, False, "comm_fused")
        A0, B0 = A.new_zeros((A.shape[0], 0)), B.new_zeros((0, B.shape[1]))
        return lambda: run(pg, A0, B0, 1, "comm_fused")
    G = case.G
    if case.op == "ag_gemm":
        pieces = _pieces(bounds(A.shape[0], chunks))
        outs = [A.new_empty((G, hi - lo, A.shape[1])) for lo, hi in pieces]
        return lambda: [dist.all_gather_into_tensor(o, A[lo:hi], group=pg) for (lo, hi), o in zip(pieces, outs)]
    M, N = A.shape[0], B.shape[1]
    if case.op == "gemm_ar":
        C = A.new_zeros((M, N))
        pieces = _pieces(bounds(M, chunks))
        return lambda: [dist.all_reduce(C[lo:hi], group=pg) for lo, hi in pieces]
    pieces = _pieces(bounds(N, chunks))
    src = [A.new_zeros((M, hi - lo)) for lo, hi in pieces]
    if case.op == "gemm_rs":
        dst = [A.new_empty((M // G, hi - lo)) for lo, hi in pieces]
        return lambda: [dist.reduce_scatter_tensor(d, s, group=pg) for s, d in zip(src, dst)]
    dst = [torch.empty_like(s) for s in src]
    return lambda: [dist.all_to_all_single(d, s, group=pg) for s, d in zip(src, dst)]


def symm_call(case: Case, A, B, pg) -> Optional[Callable]:
    if pg is None or case.op not in ("ag_gemm", "gemm_rs"):
        return None
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(pg.group_name)
        symm = torch.ops.symm_mem
    except Exception:       # this torch has no symmetric memory: the column says n/a
        return None
    if case.op == "ag_gemm":
        return lambda: symm.fused_all_gather_matmul(A, [B], 0, pg.group_name)[1][0]
    return lambda: symm.fused_matmul_reduce_scatter(A, B, "sum", 0, pg.group_name)


# --- timing ----------------------------------------------------------------------------
class Timer:
    def __init__(self, job: Job, calls: int, rounds: int, warmup: int = 2):
        self.job, self.calls, self.rounds, self.warmup = job, calls, rounds, warmup

    def _max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.job.gc3)   # CPU tensor: the group's gloo half
        return float(t.item())

    def _sync(self):
        torch.cuda.synchronize()
        self._max(0.0)          # a CPU all-reduce: every rank starts the round together

    def device(self, fn: Optional[Callable]) -> Optional[float]:
        return self.devices([fn])[0]

    def devices(self, fns: Sequence[Optional[Callable]],
                settings: Optional[Sequence[Optional[str]]] = None) -> List[Optional[float]]:
        """Each path's time, their rounds taken in turn (A B C A B C ...): a GPU's clock drifts
        over a job (it heats up), and paths timed one after the other then differ by where
        they stood in the job (4-7% between two runs of one path on 2x H200).  `settings`: a
        path's GC3_FUSED_PEER_TILES, around its calls (None: as it is)."""
        settings = settings or [None] * len(fns)
        live = [(i, fn, m) for i, (fn, m) in enumerate(zip(fns, settings)) if fn is not None]
        per: List[List[float]] = [[] for _ in fns]
        for _, fn, m in live:
            with _peer_tiles(m):
                for _ in range(self.warmup):
                    fn()
        for _ in range(self.rounds):
            for i, fn, m in live:
                with _peer_tiles(m):
                    self._sync()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(self.calls):
                        fn()
                    e.record()
                    e.synchronize()
                per[i].append(s.elapsed_time(e) * 1000.0 / self.calls)
        return [self._max(statistics.median(p)) if p else None for p in per]

    def host(self, fn: Optional[Callable]) -> Optional[float]:
        if fn is None:
            return None
        fn()
        per = []
        for _ in range(self.rounds):
            self._sync()
            t0 = time.perf_counter()
            for _ in range(self.calls):
                fn()
            per.append((time.perf_counter() - t0) * 1e6 / self.calls)
            torch.cuda.synchronize()
        return self._max(statistics.median(per))

    def graph(self, fn: Optional[Callable], what: str) -> Optional[float]:
        if fn is None:
            return None
        try:
            # Warm up on the stream the capture will use: the fused pipeline keeps its buffers per
            # stream, so the capture then finds them and allocates nothing.
            cap, user = torch.cuda.Stream(), torch.cuda.current_stream()
            cap.wait_stream(user)
            torch.cuda.set_stream(cap)
            try:
                fn()
            finally:
                torch.cuda.set_stream(user)
            user.wait_stream(cap)
            g = torch.cuda.CUDAGraph()
            # torch.cuda.graph switches torch's current stream and restores it on exit; CuPy's stream
            # stack (which a `with` on a CuPy stream would reset) is not involved.
            capture = torch.cuda.graph(g, stream=cap)
            with capture:
                for _ in range(self.calls):
                    fn()
        except Exception as exc:        # a path that cannot be captured: its column says n/a, stderr why
            print(f"# rank {dist.get_rank()}: no CUDA graph of the {what} path: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            torch.cuda.synchronize()
            return None
        t = self.device(g.replay)
        return None if t is None else t / self.calls


def line(case: Case, values: Dict[str, Optional[float]], path: str, check: str, hw: str) -> str:
    return records.format_line(case.op, case.G, {"M": case.M, "K": case.K, "N": case.N}, "bfloat16", values, path,
                               check, hw)


def _check(job: Job, case: Case, got: torch.Tensor, seq: torch.Tensor) -> str:
    """'ok', or what was wrong."""
    rows_total = got.shape[0]
    idx = torch.linspace(0, rows_total - 1, min(rows_total, 64), device=job.device).long()
    ref = case.reference_rows(job.rank, idx)
    e_fused, e_seq = _error(got[idx], ref), _error(seq[idx], ref)
    # bf16 keeps 8 bits: rounding alone may move an element by 2^-8 of the largest.
    bad = e_fused > max(1.25 * e_seq, e_seq + 2 ** -8)
    if case.op == "gemm_ar":
        sig = torch.tensor([int(got.view(torch.int16).to(torch.int64).sum())], dtype=torch.int64)
        sigs = [torch.zeros_like(sig) for _ in range(job.size)]
        dist.all_gather(sigs, sig, group=job.gc3)
        if len({int(s) for s in sigs}) != 1:
            return "ranks-differ"
    flags = torch.tensor([1 if bad else 0], dtype=torch.int64)
    dist.all_reduce(flags, group=job.gc3)
    if int(flags.item()):
        return f"error({e_fused:.2e}>seq {e_seq:.2e})"
    return "ok"


def _overlap(fused: Callable) -> Optional[float]:
    """The share of the fused call's transfer time inside its GEMM chunks (GC3_FUSED_TRACE's timing
    events, or the tile-store all-gather's stamps); None where the path that ran traces nothing."""
    from . import overlap

    before = os.environ.get("GC3_FUSED_TRACE")
    os.environ["GC3_FUSED_TRACE"] = "1"
    overlap.last_trace = None
    try:
        fused()
        trace = overlap.last_trace
        return None if trace is None else trace.overlap()
    finally:
        if before is None:
            del os.environ["GC3_FUSED_TRACE"]
        else:
            os.environ["GC3_FUSED_TRACE"] = before


def measure(job: Job, case: Case, timer: Timer, chunks: Optional[int]) -> Tuple[Dict[str, Optional[float]], str, str]:
    A, B = case.operands(job.rank)
    nccl = job.nccl
    fused = fused_call(case, A, B, job.gc3, "fused", chunks)
    auto = fused_call(case, A, B, job.gc3, None)
    seq = seq_call(case, A, B, nccl) if nccl is not None else None
    # auto's other choice on the gc3 group: where auto loses to seq-nccl, this says whether
    # the fused path or gc3's own collective is what loses.
    seq_gc3 = fused_call(case, A, B, job.gc3, "sequential")
    shape = {"M": case.M, "K": A.shape[1], "N": B.shape[1]}
    auto()          # the group's communicator exists from here on: its machine catalog decides auto
    machine = getattr(getattr(job.gc3, "_comm", None), "machine", None)
    pick = choice.choose(case.op, case.G, "bfloat16", shape, catalog=getattr(machine, "path", None))
    n = chunks or pick.chunks
    # The GEMM half: all-gather + GEMM multiplies the gathered [M, K], the others their own A.
    G_A = torch.randn((case.M, A.shape[1]), device=A.device).to(A.dtype) if case.op == "ag_gemm" else A
    # fused and host: the GEMM's own stores of the peers' tiles, unless GC3_FUSED_PEER_TILES
    # says otherwise (a measured catalog may pick the copy engines for auto); fused_ce: the copy
    # engines.  The headline's paths are timed in turn.
    mode = os.environ.get("GC3_FUSED_PEER_TILES") or "store"
    ce = case.op in choice.PEER_TILE_OPS
    fused_us, auto_us, seq_us, gc3_us, ce_us = timer.devices([fused, auto, seq, seq_gc3, fused if ce else None],
                                                             [mode, None, None, None, "copy-engine"])
    with _peer_tiles(mode):
        host_us = timer.host(fused)
    v = {
        "fused_us": fused_us,
        "auto_us": auto_us,
        "seq_nccl_us": seq_us,
        "seq_gc3_us": gc3_us,
        "symm_us": timer.device(symm_call(case, A, B, nccl)),
        "gemm_us": timer.device(lambda: G_A @ B),
        "comm_nccl_us": timer.device(comm_call(case, A, B, nccl) if nccl is not None else None),
        "comm_fused_us": timer.device(comm_call(case, A, B, job.gc3, n, fused=True)),
        "host_us": host_us,
        "seq_host_us": timer.host(seq),
        "graph_fused_us": timer.graph(fused, "fused"),
        "graph_seq_nccl_us": timer.graph(seq, "seq-nccl"),
        "graph_auto_us": timer.graph(auto, "auto"),     # what auto decides for a captured call (choice.decided)
    }
    reference = (seq or seq_call(case, A, B, job.gc3))()
    checks = []
    if ce:
        v["fused_ce_us"] = ce_us
        with _peer_tiles("copy-engine"):
            v["host_ce_us"] = timer.host(fused)
            checks.append(_check(job, case, fused(), reference))
    v["overlap"] = _overlap(fused) if case.M == TRACE_M else None
    checks.insert(0, _check(job, case, fused(), reference))
    return v, ("fused" if pick.fused else "sequential"), next((c for c in checks if c != "ok"), "ok")


@contextlib.contextmanager
def _peer_tiles(mode: Optional[str]):
    """GC3_FUSED_PEER_TILES=mode inside (read by every call; None: as it is), as it was after."""
    if mode is None:
        yield
        return
    before = os.environ.get("GC3_FUSED_PEER_TILES")
    os.environ["GC3_FUSED_PEER_TILES"] = mode
    try:
        yield
    finally:
        if before is None:
            del os.environ["GC3_FUSED_PEER_TILES"]
        else:
            os.environ["GC3_FUSED_PEER_TILES"] = before


def header() -> str:
    return (f"{'op':9} {'G':>2} {'M':>6} {'K':>6} {'N':>6} {'seq_nccl':>9} {'symm':>8} {'fused':>8} {'auto':>8} "
            f"{'seq_gc3':>8} "
            f"{'gemm':>8} {'c_nccl':>8} {'c_fused':>8} {'host':>7} {'s_host':>7} {'seq/auto':>8} {'seq/fused':>9} "
            f"{'E':>5} {'ovl':>4} {'f_ce':>8} {'h_ce':>7} {'path':>10} check")


def row(case: Case, v: Dict[str, Optional[float]], path: str, check: str) -> str:
    def f(k, w=8):
        x = v.get(k)
        return f"{'n/a':>{w}}" if x is None else f"{x:{w}.1f}"

    seq, fused, auto = v.get("seq_nccl_us"), v.get("fused_us"), v.get("auto_us")
    limit = None if v.get("gemm_us") is None or v.get("comm_nccl_us") is None else max(v["gemm_us"], v["comm_nccl_us"])
    ratio = lambda a, b: f"{a / b:8.2f}x" if a and b else f"{'n/a':>9}"
    eff = f"{(seq - fused) / (seq - limit):5.2f}" if seq and fused and limit and seq - limit > 1e-9 else "  n/a"
    ovl = v.get("overlap")
    ovl = f"{ovl:4.2f}" if ovl is not None else " n/a"
    return (f"{case.op:9} {case.G:>2} {case.M:>6} {case.K:>6} {case.N:>6} {f('seq_nccl_us', 9)} {f('symm_us')} "
            f"{f('fused_us')} {f('auto_us')} {f('seq_gc3_us')} {f('gemm_us')} {f('comm_nccl_us')} {f('comm_fused_us')} "
            f"{f('host_us', 7)} {f('seq_host_us', 7)} {ratio(seq, auto)} {ratio(seq, fused)} {eff} {ovl} "
            f"{f('fused_ce_us')} {f('host_ce_us', 7)} {path:>10} {check}")


def parse_shape(spec: str) -> Tuple[str, Dict[str, str]]:
    """`op` or `op:field=value,...` (a --shape of `gc3 bench --fused`): the operator and the
    fields a grid case must have, as its record line writes them (GEMM: M, K, N of the full
    layer; gemv_ar: b, K, N; ebag_a2a: T, rows, dim, pooling, samples; ar_epilogue: bytes;
    the memory-bound ones also dtype and out_dtype).  ValueError saying what is wrong."""
    op, _, rest = spec.partition(":")
    op = op.strip()
    if op not in OPS + MEMORY_OPS:
        raise ValueError(f"{spec!r}: unknown operator {op!r}; choose from {', '.join(OPS + MEMORY_OPS)}")
    fields = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"{spec!r}: {part!r} is not field=value")
        fields[key.strip()] = value.strip()
    return op, fields


def case_fields(case: Tuple) -> Tuple[str, Dict[str, str]]:
    """A grid case (grid's or memory_grid's) as (operator, its fields as text)."""
    if case[0] in OPS:
        op, M, K, N = case
        return op, {"M": str(M), "K": str(K), "N": str(N)}
    op, dims, dtype, out_dtype = case
    fields = {k: str(v) for k, v in dims}
    fields["dtype"] = DTYPE_NAME[dtype]
    if out_dtype is not None:
        fields["out_dtype"] = DTYPE_NAME[out_dtype]
    return op, fields


def pick(cases: Sequence[Tuple], specs: Sequence[str]) -> List[Tuple]:
    """The cases that some spec of `specs` (parse_shape) names; ValueError for a spec that names
    a field its operator's cases lack, or that names none of `cases`."""
    wanted = [parse_shape(s) for s in specs]
    keep = []
    for spec, (op, fields) in zip(specs, wanted):
        own = [c for c in cases if c[0] == op]
        known = set(case_fields(own[0])[1]) if own else set()
        unknown = sorted(set(fields) - known)
        if own and unknown:
            raise ValueError(f"{spec!r}: {op} has no field {', '.join(unknown)} (its fields: {', '.join(sorted(known))})")
        hits = [c for c in own if all(case_fields(c)[1].get(k) == v for k, v in fields.items())]
        if not hits:
            raise ValueError(f"{spec!r} names no shape of the grid of the operators measured")
        keep += [c for c in hits if c not in keep]
    return [c for c in cases if c in keep]


def cases(ops: Sequence[str], quick: bool, shapes: Sequence[str] = ()) -> Tuple[List[Tuple], List[Tuple]]:
    """(grid's cases, memory_grid's cases) of `ops`; with `shapes` (parse_shape's specs), only
    those of the whole grid they name (ValueError where one names none)."""
    gemm, memory = _split_ops(ops)
    if not shapes:
        return grid(gemm, quick), memory_grid(memory, quick)
    chosen = pick(grid(gemm, False) + memory_grid(memory, False), shapes)
    return [c for c in chosen if c[0] in OPS], [c for c in chosen if c[0] in MEMORY_OPS]


def bench(ops: Sequence[str], quick: bool, record: Optional[Path], calls: int, rounds: int, chunks: Optional[int],
          echo: Callable[[str], None], shapes: Sequence[str] = ()) -> int:
    """Returns the number of shapes whose check failed.  `shapes`: as `cases`, checked before
    anything runs."""
    gemm_cases, mem_cases = cases(ops, quick, shapes)
    memory = _split_ops(ops)[1]
    job = start()
    timer = Timer(job, calls, rounds)
    lead = job.rank == 0
    if lead:
        echo(f"# gc3 bench --fused: {job.hw}, torch {torch.__version__}, bf16, CUDA-event medians of {rounds} "
             f"rounds x {calls} calls, max over ranks (us per call)")
        echo(header())
    failed = 0
    for op, M, K, N in gemm_cases:
        case = Case(op, M, K, N, job.size, job.device)
        v, path, check = measure(job, case, timer, chunks)
        failed += check != "ok"
        if lead:
            echo(row(case, v, path, check))
            if record is not None:
                with open(record, "a") as fh:
                    fh.write(line(case, v, path, check, job.hw) + "\n")
        torch.cuda.empty_cache()
    failed += bench_memory(job, timer, memory, quick, record, echo, mem_cases)
    dist.destroy_process_group()
    return failed


def _faster(fused_us: Optional[float], seq_us: float) -> str:
    return "fused" if fused_us is not None and fused_us < FUSED_MARGIN * seq_us else "sequential"


def _peer_tiles_faster(ce_us: Optional[float], store_us: float) -> str:
    """The copy engines where they beat the GEMM's own stores by PEER_TILES_MARGIN."""
    return "copy-engine" if ce_us is not None and ce_us < PEER_TILES_MARGIN * store_us else "store"


def _us(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:9.1f} us"


def _graph_decision(timer: Timer, entry: dict, seq: Callable, fused: Callable) -> str:
    """Time both paths replayed in a CUDA graph and, where both could be captured, add the
    entry's graph_path (what a captured call takes: choice.decided) and its times; returns
    the words for the tune's line."""
    g_seq = timer.graph(seq, "sequential")
    g_fused = None if g_seq is None else timer.graph(fused, "fused")
    if g_seq is None or g_fused is None:
        return ""
    entry.update(graph_path=_faster(g_fused, g_seq), graph_fused_us=round(g_fused, 1),
                 graph_sequential_us=round(g_seq, 1))
    return f"; in a graph sequential {_us(g_seq)}, fused {_us(g_fused)}: {entry['graph_path']}"


def entries_from_records(rows: Sequence[dict], gpus: int, ops: Sequence[str]) -> Tuple[List[dict], List[str]]:
    """The fused section's entries of `ops` at `gpus` from `gc3 bench --fused` records that timed
    the sequential path on the gc3 group, as the tune's sequential_us does: seq_gc3_us, or in lines
    without it auto_us where the catalog sent the shape to the sequential path.  Fused where
    fused_us beat it by FUSED_MARGIN; a graph_path from the graph columns where auto ran the
    sequential path (a line has no captured sequential call of gc3's otherwise).  Returns
    (entries, the rows skipped and why)."""
    entries, skipped = [], []
    for r in rows:
        if r["op"] not in ops or r["gpus"] != gpus or r.get("dtype") != "bfloat16":
            continue
        d = dict(r["shape"])
        where = f"{r['op']} M={d['M']} K={d['K']} N={d['N']}"
        seq_us = r.get("seq_gc3_us") or (r.get("auto_us") if r["path"] == "sequential" else None)
        if not seq_us or not r.get("fused_us") or r["check"] != "ok":
            skipped.append(f"{where}: path={r['path']} check={r['check']} (the sequential path on gc3 was not timed)")
            continue
        # The catalog keys a shape by the operands one rank holds (the tune's A and B).
        shape = {"M": d["M"], "K": d["K"] // gpus if r["op"] in ("gemm_rs", "gemm_ar") else d["K"],
                 "N": d["N"] // gpus if r["op"] == "ag_gemm" else d["N"]}
        fused_us = r["fused_us"]
        e = {"op": r["op"], "gpus": gpus, "dtype": "bfloat16", "shape": shape}
        if r.get("fused_ce_us"):
            e.update(peer_tiles=_peer_tiles_faster(r["fused_ce_us"], fused_us), fused_store_us=fused_us,
                     fused_ce_us=r["fused_ce_us"])
            fused_us = r["fused_ce_us"] if e["peer_tiles"] == "copy-engine" else fused_us
        e.update(path=_faster(fused_us, seq_us), chunks=1, fused_us=fused_us, sequential_us=seq_us)
        if r["path"] == "sequential" and r.get("graph_fused_us") and r.get("graph_auto_us"):
            e.update(graph_path=_faster(r["graph_fused_us"], r["graph_auto_us"]), graph_fused_us=r["graph_fused_us"],
                     graph_sequential_us=r["graph_auto_us"])
        entries.append(e)
    return entries, skipped


def _chunk_counts(case: Case, A, B, pg) -> Sequence[int]:
    """The chunk counts the tune times the fused path at: one where the tile-store GEMM serves the
    call (it takes none), else TUNE_CHUNKS."""
    from . import ops
    return TUNE_CHUNKS if ops.tile_store_refusal(pg, case.op, A, B) else (1,)


def tune(ops: Sequence[str], quick: bool, output: Optional[Path], calls: int, rounds: int,
         echo: Callable[[str], None], shapes: Sequence[str] = ()) -> None:
    """The fused section of `output` (a catalog JSON, created or updated; None: the
    catalog the gc3 group's communicator serves on these GPUs): per shape, the faster
    of the sequential path and the fused path at TUNE_CHUNKS, on the gc3 group.  `shapes`
    (as `cases`): only those shapes, whose entries replace theirs alone (an edit line says so)."""
    gemm_cases, mem_cases = cases(ops, quick, shapes)
    job = start()
    timer = Timer(job, calls, rounds)
    if output is None:
        probe = torch.zeros(1, device=job.device)
        dist.all_reduce(probe, group=job.gc3)        # builds the communicator, which knows its machine catalog
        machine = getattr(getattr(job.gc3, "_comm", None), "machine", None)
        if getattr(machine, "path", None) is None:
            dist.destroy_process_group()
            raise RuntimeError("no measured catalog serves these GPUs (the unknown-machine rule): measure one "
                               "first with `gc3 tune --install`, or name the catalog to write with -o")
        output = Path(machine.path)
    entries = []
    memory = _split_ops(ops)[1]
    for op, M, K, N in gemm_cases:
        case = Case(op, M, K, N, job.size, job.device)
        A, B = case.operands(job.rank)
        seq = fused_call(case, A, B, job.gc3, "sequential")
        counts = _chunk_counts(case, A, B, job.gc3)
        e = {"op": op, "gpus": job.size, "dtype": "bfloat16", "shape": {"M": M, "K": A.shape[1], "N": B.shape[1]}}
        tiles = ""
        if op in choice.PEER_TILE_OPS and counts == (1,):
            # The tile-store GEMM (it takes no chunks): its peers' tiles stored, or carried by
            # the copy engines, timed in turn with the sequential path.
            one = fused_call(case, A, B, job.gc3, "fused", 1)
            seq_us, store, ce = timed_again_if_close(timer, [seq, one, one], [None, "store", "copy-engine"])
            e.update(peer_tiles=_peer_tiles_faster(ce, store), fused_store_us=round(store, 1),
                     fused_ce_us=round(ce, 1))
            tiles = f"; stores {_us(store)}, copy engines {_us(ce)}: {e['peer_tiles']}"
            best = (ce if e["peer_tiles"] == "copy-engine" else store, 1)
        else:
            seq_us = timer.device(seq)
            best = min(((timer.device(fused_call(case, A, B, job.gc3, "fused", c)), c) for c in counts))
        e.update(path=_faster(best[0], seq_us), chunks=best[1], fused_us=round(best[0], 1),
                 sequential_us=round(seq_us, 1))
        said = f"sequential {_us(seq_us)}, fused {_us(best[0])} ({best[1]} chunks{tiles}): {e['path']}"
        # Replayed at the eager call's best chunk count.
        said += _graph_decision(timer, e, seq, fused_call(case, A, B, job.gc3, "fused", best[1]))
        entries.append(e)
        if job.rank == 0:
            echo(f"{op:9} M={M:<6} K={K:<6} N={N:<6} {said}")
        torch.cuda.empty_cache()
    entries += tune_memory(job, timer, memory, quick, echo, mem_cases if shapes else None)
    if job.rank == 0:
        today = datetime.date.today().isoformat()
        if shapes:
            write_section(output, entries, None, f"{today}: gc3 tune --fused --shape {' --shape '.join(shapes)} "
                                                 f"on {job.hw}", by_shape=True)
        else:
            write_section(output, entries, {"hw": job.hw, "date": today, "torch": torch.__version__, "calls": calls,
                                            "rounds": rounds, "margin": FUSED_MARGIN, "chunks": list(TUNE_CHUNKS)})
        echo(f"wrote the fused section of {output}: {len(entries)} shapes, "
             f"{sum(e['path'] == 'fused' for e in entries)} fused")
    dist.destroy_process_group()


def timed_again_if_close(timer: Timer, fns: Sequence[Callable], modes: Sequence[Optional[str]]) -> List[float]:
    """Timer.devices of `fns` (the sequential path first, then the fused ways); where the fastest
    fused way and the sequential path are within RETIME_WITHIN of each other, timed once more
    in turn, each path keeping the lower of its two medians."""
    first = timer.devices(fns, modes)
    if abs(min(first[1:]) / first[0] - 1) >= RETIME_WITHIN:
        return first
    return [min(a, b) for a, b in zip(first, timer.devices(fns, modes))]


def write_section(output: Path, entries: List[dict], provenance: Optional[dict], edit: Optional[str] = None,
                  by_shape: bool = False) -> None:
    """Replace the entries of the same (op, gpus) in `output`'s fused section (`by_shape`: of the
    same shape only), atomically; with `provenance`, the tune's for its machine, with `edit`, a
    line added to the section's edits."""
    data = json.loads(output.read_text()) if output.exists() else {}
    section = data.setdefault("fused", {"provenance": {}, "entries": []})
    which = (lambda e: choice.entry_key(e["op"], e["gpus"], e["dtype"], e["shape"])) if by_shape else \
        (lambda e: (e["op"], e["gpus"]))
    done = {which(e) for e in entries}
    section["entries"] = [e for e in section.get("entries", []) if which(e) not in done] + entries
    if provenance is not None:
        section.setdefault("provenance", {})[f"{provenance['hw']}"] = provenance
    if edit is not None:
        section.setdefault("edits", []).append(edit)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, output)
    choice.forget()   # groups of this process that kept a choice read the new section


# --- the memory-bound operators: GEMV + all_reduce, embedding-bag + all_to_all, all_reduce + epilogue ---------
# Their record lines carry their own shape fields in place of M K N (the full layer's K for
# the GEMV, T tables per rank, samples per rank, the bytes of x), and n/a in the columns that
# do not apply: symm (PyTorch has no such op), comm_fused (each fused path is one launch or one
# program, not separable) and graph_fused for the embedding-bag program (it sets up on the host).  gemm is the compute alone (the GEMV,
# the pooling, the elementwise epilogue).
MEMORY_OPS = ("gemv_ar", "ebag_a2a", "ar_epilogue")
# Those whose fused path a CUDA graph can hold (the GEMV's kernel, the epilogue's launches; the
# embedding-bag program sets up on the host).
CAPTURED_OPS = ("gemv_ar", "ar_epilogue")
GEMV_B = (1, 4, 8, 32)
GEMV_KN = ((8192, 8192), (14336, 4096), (28672, 8192))
EBAG_T = (8, 26)
EBAG_ROWS = 1_000_000          # 1M as DLRM counts rows: 26 fp32 tables of dim 128 are 13.3 GB per GPU
EBAG_DIM = (64, 128)
EBAG_POOLING = (1, 32)
EBAG_SAMPLES = (2048, 8192)
EBAG_DTYPES = (torch.float32, torch.bfloat16)
EPILOGUE_BYTES = tuple((16 << 10) << i for i in range(13))      # 16 KiB .. 64 MiB of x per rank
# (x's dtype, out_dtype): bf16 throughout, and fp32 partial sums cast to bf16.
EPILOGUE_DTYPES = ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16))
# x is [bytes / (cols * itemsize), cols]: bias has a hidden size's elements.
EPILOGUE_COLS = 4096


@dataclass
class MemoryCase:
    op: str
    dims: Tuple[Tuple[str, int], ...]     # the record's shape fields, in order
    dtype: torch.dtype
    out_dtype: Optional[torch.dtype]
    G: int
    device: torch.device

    @property
    def d(self) -> Dict[str, int]:
        return dict(self.dims)

    def record_shape(self) -> Dict[str, object]:
        """The record's shape fields: the dims, and the epilogue's out_dtype (which, unlike
        dtype, is not a field of every operator)."""
        out = {} if self.out_dtype is None else {"out_dtype": DTYPE_NAME[self.out_dtype]}
        return dict(self.dims, **out)

    def shape_cells(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.record_shape().items()) + f" dtype={DTYPE_NAME[self.dtype]}"

    def table_shape(self) -> Dict[str, int]:
        """The shape the operator looks up in the measured table (ops.py): this rank's K for the GEMV."""
        d = self.d
        return {"b": d["b"], "K": d["K"] // self.G, "N": d["N"]} if self.op == "gemv_ar" else d


def memory_grid(ops: Sequence[str], quick: bool) -> List[Tuple[str, Tuple[Tuple[str, int], ...], torch.dtype,
                                                               Optional[torch.dtype]]]:
    cases = []
    for op in ops:
        if op == "gemv_ar":
            cases += [(op, (("b", b), ("K", K), ("N", N)), torch.bfloat16, None) for K, N in GEMV_KN for b in GEMV_B]
        elif op == "ebag_a2a":
            cases += [(op, (("T", T), ("rows", EBAG_ROWS), ("dim", dim), ("pooling", p), ("samples", s)), dt, None)
                      for dt in EBAG_DTYPES for T in EBAG_T for dim in EBAG_DIM for p in EBAG_POOLING
                      for s in EBAG_SAMPLES]
        elif op == "ar_epilogue":
            cases += [(op, (("bytes", n),), dt, out) for dt, out in EPILOGUE_DTYPES for n in EPILOGUE_BYTES]
        else:
            raise ValueError(f"unknown memory-bound op {op!r}; choose from {', '.join(MEMORY_OPS)}")
    return cases[::3] if quick else cases


def _split_ops(ops: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the GEMM operators, the memory-bound ones) of `ops`, in order."""
    return [o for o in ops if o not in MEMORY_OPS], [o for o in ops if o in MEMORY_OPS]


def _ebag_rows(rank: int, t: int, rows: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows `rows` of rank `rank`'s table t: a formula of (rank, t, row, column), so a
    reference needs only the rows it reads, never another rank's whole tables."""
    cols = torch.arange(dim, device=rows.device)
    k = (rows.long().unsqueeze(-1) * 977 + cols * 131 + (t * 7919 + rank * 104729)) % 1021
    return (k.float() / 1021 - 0.5).to(dtype)


def _ebag_indices(case: MemoryCase, r: int) -> torch.Tensor:
    d = case.d
    g = torch.Generator(device=case.device)
    g.manual_seed(_seed((case.dims, DTYPE_NAME[case.dtype], "indices", r)))
    return torch.randint(0, d["rows"], (d["T"], d["samples"] * case.G * d["pooling"]), generator=g,
                         device=case.device, dtype=torch.int32)


def memory_operands(case: MemoryCase, r: int) -> Dict[str, object]:
    """Rank r's inputs (every rank can rebuild any rank's from the case)."""
    d, dev, G = case.d, case.device, case.G
    seed = (case.op, case.dims, DTYPE_NAME[case.dtype])
    if case.op == "gemv_ar":
        return {"x": _tensor(seed + ("x", r), (d["b"], d["K"] // G), dev),
                "w": _tensor(seed + ("w", r), (d["K"] // G, d["N"]), dev, d["K"] ** -0.5)}
    if case.op == "ebag_a2a":
        T, rows, dim, B = d["T"], d["rows"], d["dim"], d["samples"] * G
        tables = torch.empty((T, rows, dim), dtype=case.dtype, device=dev)
        every = torch.arange(rows, device=dev)
        for t in range(T):          # a table at a time: the formula's intermediates are 4x a table
            tables[t] = _ebag_rows(r, t, every, dim, case.dtype)
        offsets = (torch.arange(B + 1, device=dev, dtype=torch.int32) * d["pooling"]).expand(T, B + 1).contiguous()
        return {"tables": tables, "indices": _ebag_indices(case, r), "offsets": offsets}
    cols = min(EPILOGUE_COLS, d["bytes"] // case.dtype.itemsize)
    shape = (d["bytes"] // case.dtype.itemsize // cols, cols)
    # bias and residual are the same on every rank, as a tensor-parallel layer holds them.
    return {"x": _tensor(seed + ("x", r), shape, dev).to(case.dtype), "scale": 1.0 / G,
            "bias": _tensor(seed + ("bias",), (cols,), dev).to(case.dtype),
            "residual": _tensor(seed + ("residual",), shape, dev).to(case.dtype)}


def memory_call(case: MemoryCase, t: Dict[str, object], pg, path: Optional[str]) -> Callable:
    """The operator as a user calls it (path None: auto)."""
    ops = _ops()
    if case.op == "gemv_ar":
        return lambda: ops.fused_gemv_all_reduce(t["x"], t["w"], pg, path=path)
    if case.op == "ebag_a2a":
        return lambda: ops.fused_embedding_bag_all_to_all(t["tables"], t["indices"], t["offsets"], pg, path=path,
                                                          pooling=case.d["pooling"])
    return lambda: ops.fused_all_reduce_epilogue(t["x"], pg, t["scale"], t["bias"], t["residual"], case.out_dtype,
                                                 path=path)


def memory_seq_call(case: MemoryCase, t: Dict[str, object], pg) -> Callable:
    """What a careful PyTorch user runs, which is the operators' own sequential path
    (ops.py) called directly: the torch ops, then the group's collective."""
    ops = _ops()
    if case.op == "gemv_ar":
        return lambda: ops.gemv_sequential(t["x"], t["w"], pg)
    if case.op == "ebag_a2a":
        return lambda: ops.embedding_bag_sequential(t["tables"], t["indices"], t["offsets"], pg)
    return lambda: ops.epilogue_sequential(t["x"], pg, t["scale"], t["bias"], t["residual"], case.out_dtype)


def memory_parts(case: MemoryCase, t: Dict[str, object], pg) -> Tuple[Callable, Optional[Callable]]:
    """(the compute alone, the collective alone on `pg`, None without a group)."""
    ops = _ops()
    if case.op == "gemv_ar":
        x, w = t["x"], t["w"]
        y = x.new_zeros((x.shape[0], w.shape[1]))
        return (lambda: x @ w), (None if pg is None else lambda: dist.all_reduce(y, group=pg))
    if case.op == "ebag_a2a":
        pool = lambda: ops.embedding_bag_pool(t["tables"], t["indices"], t["offsets"])
        if pg is None:
            return pool, None
        src = pool()
        dst = torch.empty_like(src)
        return pool, lambda: dist.all_to_all_single(dst, src, group=pg)
    y = torch.zeros_like(t["x"])     # overwritten by every call, as the sequential path's own copy is
    apply = lambda: ops.epilogue_apply(y, t["scale"], t["bias"], t["residual"], case.out_dtype)
    return apply, (None if pg is None else lambda: dist.all_reduce(y, group=pg))


def memory_reference(case: MemoryCase, rank: int, t: Dict[str, object]) -> Tuple[Callable, torch.Tensor]:
    """(the part of an output the check compares, its fp32 reference on this rank)."""
    d, G = case.d, case.G
    if case.op == "gemv_ar":
        parts = [memory_operands(case, r) for r in range(G)]
        return (lambda y: y), sum(p["x"].float() @ p["w"].float() for p in parts)
    if case.op == "ebag_a2a":
        b, pooling = d["samples"], d["pooling"]
        picked = torch.linspace(0, b - 1, min(b, 16), device=case.device).long()
        reach = (rank * b + picked).unsqueeze(1) * pooling + torch.arange(pooling, device=case.device)
        blocks = []
        for q in range(G):      # out[q]: rank q's tables pooled over this rank's samples
            idx = _ebag_indices(case, q)
            blocks.append(torch.cat([_ebag_rows(q, tt, idx[tt][reach].reshape(-1), d["dim"], case.dtype).float()
                                     .view(len(picked), pooling, d["dim"]).sum(1) for tt in range(d["T"])], dim=1))
        return (lambda out: out[:, picked]), torch.stack(blocks)
    total = sum(memory_operands(case, r)["x"].float() for r in range(G))
    return (lambda y: y), total * t["scale"] + t["bias"].float() + t["residual"].float()


def _same_bits(job: Job, t: torch.Tensor) -> bool:
    sig = torch.tensor([int(t.contiguous().view(torch.uint8).to(torch.int64).sum()),
                        int((t.contiguous().view(torch.uint8).to(torch.int64) * 7919).remainder(65521).sum())])
    sigs = [torch.zeros_like(sig) for _ in range(job.size)]
    dist.all_gather(sigs, sig, group=job.gc3)
    return all(torch.equal(s, sigs[0]) for s in sigs)


def memory_check(job: Job, case: MemoryCase, t: Dict[str, object], got: torch.Tensor, seq: torch.Tensor) -> str:
    """'ok', or what was wrong: got's error against the fp32 reference no larger than the
    sequential path's (+ a rounding of the output's type), and, for the all-reduces, the
    same bits on every rank."""
    part, ref = memory_reference(case, job.rank, t)
    e_got, e_seq = _error(part(got), ref), _error(part(seq), ref)
    eps = 2 ** -8 if (case.out_dtype or case.dtype) == torch.bfloat16 else 2 ** -20
    flags = torch.tensor([int(e_got > max(1.25 * e_seq, e_seq + eps))], dtype=torch.int64)
    dist.all_reduce(flags, group=job.gc3)
    if case.op != "ebag_a2a" and not _same_bits(job, got):
        return "ranks-differ"
    return f"error({e_got:.2e}>seq {e_seq:.2e})" if int(flags.item()) else "ok"


def _fused_or_none(fn: Callable, measure: Callable[[Callable], Optional[float]]) -> Optional[float]:
    """`measure(fn)`, or None where the fused program cannot serve the shape (every rank
    learns so at set-up, together)."""
    from gc3.errors import GC3Error
    try:
        return measure(fn)
    except GC3Error:
        torch.cuda.synchronize()
        return None


def measure_memory(job: Job, case: MemoryCase, timer: Timer) -> Tuple[Dict[str, Optional[float]], str, str]:
    t = memory_operands(case, job.rank)
    nccl = job.nccl
    fused = memory_call(case, t, job.gc3, "fused")
    auto = memory_call(case, t, job.gc3, None)
    seq = memory_seq_call(case, t, nccl) if nccl is not None else None
    compute, comm = memory_parts(case, t, nccl)
    auto()          # the group's communicator exists from here on: its machine catalog decides auto
    machine = getattr(getattr(job.gc3, "_comm", None), "machine", None)
    pick = choice.choose(case.op, case.G, DTYPE_NAME[case.dtype], case.table_shape(),
                         catalog=getattr(machine, "path", None))
    v = {
        "fused_us": _fused_or_none(fused, timer.device),
        "auto_us": timer.device(auto),
        "seq_nccl_us": timer.device(seq),
        # What auto weighs the fused path against (gc3 tune --fused): the same torch ops, then
        # the gc3 group's collective.
        "seq_gc3_us": timer.device(memory_call(case, t, job.gc3, "sequential")),
        "gemm_us": timer.device(compute),
        "comm_nccl_us": timer.device(comm),
        "seq_host_us": timer.host(seq),
        "graph_seq_nccl_us": timer.graph(seq, "seq-nccl"),
        # The GEMV's kernel and the epilogue's are launches a graph can hold (a path that cannot
        # be captured reads n/a); the embedding-bag program sets up on the host.
        "graph_fused_us": timer.graph(fused, "fused") if case.op in CAPTURED_OPS else None,
        "graph_auto_us": timer.graph(auto, "auto"),     # what auto decides for a captured call (choice.decided)
    }
    v["host_us"] = None if v["fused_us"] is None else timer.host(fused)
    reference = (seq or memory_seq_call(case, t, job.gc3))()
    got = (auto if v["fused_us"] is None else fused)()
    return v, ("fused" if pick.fused else "sequential"), memory_check(job, case, t, got, reference)


# (value, heading, width) of the printed table; the ratios follow.
MEMORY_COLUMNS = (("seq_nccl_us", "seq_nccl", 9), ("seq_gc3_us", "seq_gc3", 9), ("fused_us", "fused", 9),
                  ("auto_us", "auto", 9),
                  ("gemm_us", "compute", 9), ("comm_nccl_us", "c_nccl", 9), ("host_us", "host", 7),
                  ("seq_host_us", "s_host", 7), ("graph_seq_nccl_us", "g_seq", 9), ("graph_fused_us", "g_fused", 9),
                  ("graph_auto_us", "g_auto", 9))


def memory_header() -> str:
    cells = " ".join(f"{name:>{w}}" for _, name, w in MEMORY_COLUMNS)
    return f"{'op':11} {'G':>2} {'shape':58} {cells} {'seq/auto':>8} {'seq/fused':>9} {'path':>10} check"


def memory_row(case: MemoryCase, v: Dict[str, Optional[float]], path: str, check: str) -> str:
    cells = " ".join(f"{'n/a' if v.get(k) is None else format(v[k], '.1f'):>{w}}" for k, _, w in MEMORY_COLUMNS)
    seq = v.get("seq_nccl_us")
    ratios = [f"{seq / v[k]:.2f}x" if seq and v.get(k) else "n/a" for k in ("auto_us", "fused_us")]
    return (f"{case.op:11} {case.G:>2} {case.shape_cells():58} {cells} {ratios[0]:>8} {ratios[1]:>9} {path:>10} "
            f"{check}")


def memory_cases(job: Job, ops: Sequence[str], quick: bool, chosen: Optional[Sequence[Tuple]] = None):
    """The MemoryCase of each of `chosen` (memory_grid's tuples), by default memory_grid(ops, quick)'s."""
    for op, dims, dtype, out_dtype in memory_grid(ops, quick) if chosen is None else chosen:
        yield MemoryCase(op, dims, dtype, out_dtype, job.size, job.device)


def memory_line(case: MemoryCase, values: Dict[str, Optional[float]], path: str, check: str, hw: str) -> str:
    return records.format_line(case.op, case.G, case.record_shape(), DTYPE_NAME[case.dtype], values, path, check, hw)


def _emit(job: Job, echo: Callable[[str], None], record: Optional[Path], text: str, record_line: str) -> None:
    """Rank 0 prints a case's row and appends its line to the record file."""
    if job.rank != 0:
        return
    echo(text)
    if record is not None:
        with open(record, "a") as fh:
            fh.write(record_line + "\n")


def bench_memory(job: Job, timer: Timer, ops: Sequence[str], quick: bool, record: Optional[Path],
                 echo: Callable[[str], None], chosen: Optional[Sequence[Tuple]] = None) -> int:
    """The memory-bound operators' part of `bench` (`chosen`: memory_grid tuples instead of the
    grid of `ops`): returns the number of shapes whose check failed."""
    if job.rank == 0 and (ops if chosen is None else chosen):
        echo(memory_header())
    failed = 0
    for case in memory_cases(job, ops, quick, chosen):
        v, path, check = measure_memory(job, case, timer)
        failed += check != "ok"
        _emit(job, echo, record, memory_row(case, v, path, check), memory_line(case, v, path, check, job.hw))
        torch.cuda.empty_cache()
    return failed


def tune_memory(job: Job, timer: Timer, ops: Sequence[str], quick: bool, echo: Callable[[str], None],
                chosen: Optional[Sequence[Tuple]] = None) -> List[dict]:
    """The memory-bound operators' entries of `tune`: per shape (of `chosen`, memory_grid's
    tuples, by default the grid's), the sequential path against the fused one, both on the gc3
    group, called eagerly and, for the operators whose fused path a graph can hold, replayed in
    a CUDA graph (graph_path: what a captured call takes, choice.decided)."""
    entries = []
    for case in memory_cases(job, ops, quick, chosen):
        t = memory_operands(case, job.rank)
        seq, fused = memory_call(case, t, job.gc3, "sequential"), memory_call(case, t, job.gc3, "fused")
        seq_us = timer.device(seq)
        fused_us = _fused_or_none(fused, timer.device)
        e = {"op": case.op, "gpus": job.size, "dtype": DTYPE_NAME[case.dtype], "shape": case.table_shape(),
             "path": _faster(fused_us, seq_us), "fused_us": None if fused_us is None else round(fused_us, 1),
             "sequential_us": round(seq_us, 1)}
        said = f"sequential {_us(seq_us)}, fused {_us(fused_us)}: {e['path']}"
        if case.op in CAPTURED_OPS and fused_us is not None:
            said += _graph_decision(timer, e, seq, fused)
        entries.append(e)
        if job.rank == 0:
            echo(f"{case.op:11} {case.shape_cells():58} {said}")
        del t
        torch.cuda.empty_cache()
    return entries
