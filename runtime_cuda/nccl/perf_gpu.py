"""The measuring half of `gc3 bench` (its sweep: bench_gpu.run_bench) and of first-use tuning:
one process per GPU (under mpirun), nccl-tests' method.

For each collective and size, each implementation (gc3's communicator, NCCL
through cupy.cuda.nccl, and with `nccl-sym` NCCL on buffers of its own that
ncclMemAlloc allocated and a communicator of its own registered as symmetric
windows: runtime_cuda.nccl.symmetric) is first *checked*, at every size: inputs are
generated on the GPU from (rank, index), outputs are pre-filled with NaN/0xFF
so a missed write shows, one call runs, and every output element is compared
on the GPU with the value it must hold (runtime_cuda.nccl.datacheck: small
integers, compared exactly; #wrong summed over ranks, and the first wrong
element reported). Then `warmup` calls, and `rounds` rounds of `iters` calls
back to back, timed with CUDA events between the rounds (nothing else between
the calls): a case's time is the median of its rounds' per-call times, averaged
over ranks as nccl-tests does.  With `graph_max`, cases up to that size are
also replayed from CUDA graphs, two ways: a graph holding `GRAPH_CALLS` calls
(per call = its replay time / GRAPH_CALLS) and a graph of one call replayed back
to back; GPU time alone, no launch path on either side.

Before the first case of each implementation, `warm_s` seconds of its calls run
untimed: an idle GPU and CPU take that long to reach their clocks, and without it
the first sizes of a sweep read 2-3 us slow for every implementation alike.

The caller's current CuPy stream is never changed for longer than the data
set-up and check, and is restored afterwards (runtime_cuda.core.streams.current).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from runtime_cuda.core import streams
from runtime_cuda.core.perf import ROUNDS, time_rounds

from . import datacheck
from .call import REDUCING, Call
from .constants import DTYPE_CODES, ITEMSIZE, OP_CODES
from .perf import element_count, nccl_count


@dataclass
class BenchConfig:
    collectives: Sequence[str]
    sizes: Sequence[int]
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    warmup: int = 5
    iters: int = 20
    check: bool = True
    impls: Sequence[str] = ("gc3", "nccl")
    hang_s: float = 60.0          # a case still running after this ends the process, naming it (0: never)
    rounds: int = ROUNDS          # timed rounds of `iters` calls; the case's time is their median
    graph_max: int = 0            # also time CUDA-graph replay for sizes up to this (0: never)
    warm_s: float = 0.0           # untimed calls before an implementation's first case


GRAPH_CALLS = 100                 # calls captured in the many-call graph


class Host:
    """Rank, size and host-side reductions: mpi4py when launched by mpirun, else one rank."""

    def __init__(self):
        try:
            from mpi4py import MPI
            self.comm = MPI.COMM_WORLD
        except ImportError:
            self.comm = None
        self.rank = self.comm.Get_rank() if self.comm else 0
        self.size = self.comm.Get_size() if self.comm else 1

    @classmethod
    def over(cls, exchange) -> "Host":
        """A Host over a communicator's rendezvous (rendezvous.*Exchange) instead of MPI:
        for measuring inside a communicator's own processes (GC3_AUTOTUNE)."""
        host = cls.__new__(cls)
        host.comm, host.rank, host.size = _Summing(exchange), exchange.Get_rank(), exchange.Get_size()
        return host

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0) if self.comm else obj

    def mean(self, x: float) -> float:
        return self.comm.allreduce(x) / self.size if self.comm else x

    def total(self, x: int) -> int:
        return self.comm.allreduce(x) if self.comm else x

    def first(self, text: str) -> str:
        """The first non-empty `text` in rank order (every rank gets it)."""
        texts = self.comm.allgather(text) if self.comm else [text]
        return next((t for t in texts if t), "")

    def barrier(self) -> None:
        if self.comm:
            self.comm.Barrier()


class _Summing:
    """An exchange with the one mpi4py reduction a Host uses, a sum (`Host.over`)."""

    def __init__(self, exchange):
        self._exchange = exchange

    def allreduce(self, value, op=None):
        if op is not None:
            raise NotImplementedError("a rendezvous exchange reduces by sum only")
        return sum(self._exchange.allgather(value))

    def __getattr__(self, name):
        return getattr(self._exchange, name)


def local_device(rank: int) -> int:
    import cupy
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var]) % cupy.cuda.runtime.getDeviceCount()
    return rank % cupy.cuda.runtime.getDeviceCount()


# --- one implementation on one buffer pair ---------------------------------------------

@dataclass
class Placement:
    send: int          # pointers for the call
    recv: int
    in_off: int        # where the input lives, in elements, inside `in_buf`
    in_buf: object
    out_off: int
    out_buf: object


def place(coll: str, inplace: bool, sendbuf, recvbuf, count: int, rank: int, itemsize: int) -> Placement:
    """Buffers for a call; in-place ones overlap as NCCL defines (see Call.inplace)."""
    s, r = sendbuf.data.ptr, recvbuf.data.ptr
    if not inplace:
        return Placement(s, r, 0, sendbuf, 0, recvbuf)
    if coll == "allgather":
        return Placement(r + rank * count * itemsize, r, rank * count, recvbuf, 0, recvbuf)
    if coll == "reducescatter":
        return Placement(s, s + rank * count * itemsize, 0, sendbuf, rank * count, sendbuf)
    return Placement(r, r, 0, recvbuf, 0, recvbuf)


Issue = Callable[[str, int, int, int, int, Optional[int], int, int], str]


def graph_us(call: Callable[[], object], calls: int, replays: int, stream, agree: Callable[[bool], bool]) -> float:
    """us per call when `calls` calls captured in one CUDA graph are replayed
    `replays` times back to back (this rank's figure), or nan where some rank
    cannot capture: `agree(ok)` is True only when every rank's `ok` is, so a
    rank never replays collectives its peers did not capture."""
    import math

    import cupy
    graph = None
    try:
        stream.begin_capture()
        try:
            for _ in range(calls):
                call()
        finally:
            graph = stream.end_capture()
    except Exception:  # capture unsupported for this implementation: nan, never half a pair
        graph = None
    if not agree(graph is not None):
        return math.nan
    graph.launch(stream)
    stream.synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(replays):
        graph.launch(stream)
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / (calls * replays)


def run_case(issue: Issue, host: Host, cfg: BenchConfig, coll: str, nbytes: int, inplace: bool,
             sendbuf, recvbuf, stream, graphs: Optional[Dict[str, float]] = None):
    """(time in us averaged over ranks, #wrong summed over ranks or None,
    the first wrong element of the lowest rank that has one, route name).
    With `graphs` (a dict) and nbytes <= cfg.graph_max, it receives the graph
    replay times, us per call averaged over ranks: "graph100" and "graph1"."""
    import cupy
    n, rank = host.size, host.rank
    code = DTYPE_CODES[cfg.dtype]
    es = ITEMSIZE[code]
    total = element_count(coll, nbytes, es, n)
    count = nccl_count(coll, total, n)
    op = OP_CODES[cfg.op] if coll in REDUCING else None
    p = place(coll, inplace, sendbuf, recvbuf, count, rank, es)
    in_elems = count * n if coll in ("reducescatter", "alltoall") else count

    def call():
        return issue(coll, p.send, p.recv, count, code, op, stream.ptr, cfg.root)

    wrong, first, route = None, "", ""
    if cfg.check:
        # Once per size, before the timed calls. The data work runs on `stream`
        # so it is ordered with the collective without a device-wide sync.
        with streams.current(stream):
            recvbuf.fill(0xFF)
            datacheck.fill_input(cupy, p.in_buf, p.in_off, rank, in_elems, cfg.op, cfg.dtype, n)
        stream.synchronize()
        host.barrier()
        route = call()
        with streams.current(stream):
            mine = datacheck.check_output(cupy, coll, rank, n, count, cfg.op, cfg.dtype, cfg.root,
                                          p.out_buf, p.out_off)
        wrong = host.total(mine.wrong)
        first = host.first(mine.describe(rank))
    for _ in range(cfg.warmup):
        route = call()
    stream.synchronize()
    host.barrier()
    elapsed_us, route = time_rounds(call, cfg.iters, cfg.rounds, stream)
    if graphs is not None and nbytes <= cfg.graph_max:
        agree = (lambda ok: host.comm.allreduce(int(ok), op=_mpi_min()) == 1) if host.comm else bool
        host.barrier()
        graphs["graph100"] = host.mean(graph_us(call, GRAPH_CALLS, 5, stream, agree))
        host.barrier()
        graphs["graph1"] = host.mean(graph_us(call, 1, max(cfg.iters, 1), stream, agree))
    return host.mean(elapsed_us), wrong, first, route


def _mpi_min():
    from mpi4py import MPI
    return MPI.MIN


def warm_up(issue: Issue, host: Host, cfg: BenchConfig, coll: str, nbytes: int, sendbuf, recvbuf, stream) -> None:
    """Untimed calls of one case until rank 0 has run them for cfg.warm_s
    seconds (every rank makes the same calls: rank 0 says when to stop)."""
    import time
    quick = BenchConfig((), (), cfg.dtype, cfg.op, cfg.root, warmup=50, iters=1, check=False, rounds=1)
    t0 = time.perf_counter()
    while True:
        run_case(issue, host, quick, coll, nbytes, False, sendbuf, recvbuf, stream)
        if not host.bcast(time.perf_counter() - t0 < cfg.warm_s):
            return


def _nccl_comm(host: Host):
    """A cupy.cuda.nccl communicator of its own over these processes."""
    from .fallback import originals

    uid = host.bcast(originals()["get_unique_id"]() if host.rank == 0 else None)
    return originals()["NcclCommunicator"](host.size, uid, host.rank)


def _issue_on(comm, host: Host, route: str, staging=None) -> Issue:
    from .fallback import NcclFallback

    ref = NcclFallback(comm, staging=staging)
    # A repeat goes straight to NCCL's own method with its arguments bound, as a user's loop
    # calls it: one lookup, as gc3's repeat path has.  Building a Call each time cost NCCL's
    # side about 0.5 µs a call that a user's call does not pay, which flattered gc3 wherever
    # a call is bound by the host.
    bound: Dict[tuple, Callable[[int], object]] = {}

    def issue(coll, send, recv, count, dtype, op, stream, root):
        key = (coll, send, recv, count, dtype, op, stream, root)
        go = bound.get(key)
        if go is None:
            call = Call(coll, send, recv, count, dtype, op, stream, host.size, host.rank, root)
            go = ref.bind(call)
            if go is None:      # no bound form (alltoall: copies and a group of sends and receives)
                ref.run(call)
                return route
            if len(bound) > 4096:
                bound.clear()
            bound[key] = go
        go(stream)
        return route
    return issue


def nccl_issue(host: Host, owned: Optional[list] = None) -> Issue:
    """NCCL through cupy.cuda.nccl, on a communicator of its own in these processes
    (appended to `owned`, for a caller that tears its communicators down itself)."""
    comm = _nccl_comm(host)
    if owned is not None:
        owned.append(comm)
    return _issue_on(comm, host, "NCCL")


class SymmetricPeer:
    """NCCL on a communicator of its own whose send and receive buffers (of
    `nbytes` each) come from ncclMemAlloc and are registered on it as symmetric
    windows: the peer NCCL's symmetric kernels run for.  gc3 and default NCCL
    keep their ordinary CuPy buffers.

    Every rank agrees (over MPI) that windows are available and that both
    buffers were allocated before any rank registers, since registration is
    collective and a rank missing from it would leave its peers waiting."""

    def __init__(self, host: Host, nbytes: int):
        import cupy

        from . import symmetric

        avail = symmetric.availability()
        why = host.first("" if avail else f"rank {host.rank}: {avail.reason}")
        if why:
            raise symmetric.SymmetricError(f"NCCL symmetric windows (--peer symmetric) are not available: {why}")
        api = symmetric.Api.load()
        self.comm = _nccl_comm(host)
        self.buffers: List[symmetric.SymmetricBuffer] = []
        failed = ""
        try:
            for _ in ("send", "recv"):
                self.buffers.append(symmetric.SymmetricBuffer(api, self.comm.comm, nbytes))
        except symmetric.SymmetricError as exc:
            failed = f"rank {host.rank}: {exc}"
        failed = host.first(failed)
        if failed:
            self.close()
            raise symmetric.SymmetricError(f"--peer symmetric: cannot allocate its buffers: {failed}")
        for buf in self.buffers:
            buf.register()
        self.sendbuf, self.recvbuf = (buf.array(cupy) for buf in self.buffers)
        # In place, the bench's calls use recvbuf alone, so an alltoall stages its input in the
        # send window (place() keeps both within the buffers' size).
        self.issue = _issue_on(self.comm, host, "NCCL-sym", staging=self._send_window)

    def _send_window(self, nbytes: int) -> int:
        if nbytes > self.sendbuf.nbytes:
            raise ValueError(f"NCCL-sym staging of {nbytes} bytes exceeds its {self.sendbuf.nbytes}-byte window")
        return self.sendbuf.data.ptr

    def close(self) -> None:
        """Deregister and free (each buffer in turn); the caller has synchronized
        every stream that used them, and every rank calls this at the same point."""
        while self.buffers:
            self.buffers.pop().close()
