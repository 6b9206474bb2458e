"""The ranks a GEMM fusion runs over, as seen from one process: where every
rank's buffers and flags are, which streams and cuBLAS handle each local rank
uses, and the watchdog of its waits.

* `VirtualGemmGroup(n)`: all n ranks in this process on one GPU; a "peer
  buffer" is simply another rank's array.
* `IpcGemmGroup(comm)`: one rank per process (mpi4py communicator, or
  anything with its allgather/Barrier, such as rendezvous.MpiExchange);
  buffers are whole cudaMalloc allocations mapped by the peers through CUDA
  IPC, registered once per operator shape (`key`) and kept.

Every operator shape gets two copies (parities) of each buffer, used by
alternate calls, and one flag block per rank; see gemm.py for what they hold.
"""
from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional

from gc3.errors import GC3Error

from runtime_cuda.core import streams
from runtime_cuda.ranks.ipc import _LAZY_PEER_ACCESS, _RawBuffer

from .gemm_signal import Trace, Watchdog, trace_enabled

LANES = 2           # independent exchanges in one call (GEMM+AR uses 2: reduce-scatter, then all-gather)
ARRIVE, DONE = 0, 1  # flag kinds: "source s's data for this epoch has landed", "dest d has consumed it"


class ShapeState:
    """One operator shape's registered buffers and flags on every rank."""

    def __init__(self, n: int, sizes: Dict[str, int], bases: Dict[str, Dict[int, int]], flags: Dict[int, int]):
        self.n = n
        self.sizes = sizes
        self.bases = bases
        self.flags = flags
        self.epoch = 0   # calls made on this shape; every rank counts the same
        # A device kernel's own call counters, kept with the flags whose values they give.
        self.counts = None
        # The other tensors a device kernel addresses on these buffers (its table, its scratch),
        # kept as long as the buffers: a captured launch still addresses them.
        self.kept: Dict[Hashable, Any] = {}

    def buf(self, name: str, rank: int, parity: int) -> int:
        return self.bases[name][rank] + parity * self.sizes[name]

    def flag(self, rank: int, lane: int, kind: int, slot: int) -> int:
        """Address of the flag in `rank`'s block: (lane, kind) about peer `slot`."""
        return self.flags[rank] + 4 * ((lane * 2 + kind) * self.n + slot)


def flag_words(n: int) -> int:
    return LANES * 2 * n


class _LocalRank:
    """Streams, cuBLAS handle and reusable events of one rank driven here."""

    def __init__(self, rank: int):
        import cupy

        self.rank = rank
        self.compute = cupy.cuda.Stream(non_blocking=True)
        # One transfer stream per destination: copies on one stream run one after another on
        # one copy engine, while copies to different peers on their own streams run at once
        # and keep every link busy.
        self._transfers: List = []
        # A handle per rank: cuBLAS's workspace belongs to the handle, and the
        # ranks' GEMMs run concurrently on their own streams.
        self.cublas = cupy.cuda.cublas.create()
        rt = cupy.cuda.runtime
        self._events: Dict[str, int] = {}
        self._rt = rt

    def transfers(self, n: int) -> List:
        """The transfer streams to ranks 0..n-1 (made on first use, then kept)."""
        import cupy

        while len(self._transfers) < n:
            self._transfers.append(cupy.cuda.Stream(non_blocking=True))
        return self._transfers[:n]

    def event(self, name: str) -> int:
        """A named event of this rank; cudaStreamWaitEvent captures its latest
        record, so one event serves every record/wait pair issued in order."""
        ev = self._events.get(name)
        if ev is None:
            ev = self._events[name] = self._rt.eventCreateWithFlags(self._rt.eventDisableTiming)
        return ev

    def order(self, after: int, before: int, name: str) -> None:
        """Work queued on stream `before` from now on waits for what `after` holds now."""
        ev = self.event(name)
        self._rt.eventRecord(ev, after)
        self._rt.streamWaitEvent(before, ev, 0)

    def close(self) -> None:
        import cupy

        cupy.cuda.cublas.destroy(self.cublas)
        for ev in self._events.values():
            self._rt.eventDestroy(ev)
        self._events = {}


class _Group:
    n: int
    local: List[int]

    def _start(self, where: str, trace: Optional[bool]) -> None:
        self.where = where
        self.watchdog = Watchdog(where)
        # Device timestamps of each call (gemm_signal.Trace), when asked for.
        self.trace: Optional[Trace] = Trace() if (trace_enabled() if trace is None else trace) else None
        self.ranks: Dict[int, _LocalRank] = {r: _LocalRank(r) for r in self.local}
        self._shapes: Dict[Hashable, ShapeState] = {}
        self.last_events: List[int] = []

    def shape(self, key: Hashable, sizes: Dict[str, int]) -> ShapeState:
        """The buffers of one operator shape, registered on first use (a
        collective step in IPC mode: every rank must make the same call)."""
        st = self._shapes.get(key)
        if st is None:
            st = self._shapes[key] = self._register(key, dict(sizes))
        return st

    def synchronize(self) -> None:
        """Wait for the last call's work on every local rank; raise the
        watchdog's error (naming flag, chunk and rank) if a wait failed."""
        self.watchdog.synchronize(self.last_events)

    def check(self) -> None:
        self.watchdog.check()

    def _register(self, key, sizes) -> ShapeState:
        raise NotImplementedError


class VirtualGemmGroup(_Group):
    """n ranks in this process on the current GPU.  trace: record device
    timestamps of each call in .trace (default: GC3_FUSED_TRACE=1)."""

    def __init__(self, n: int, trace: Optional[bool] = None):
        if not isinstance(n, int) or n < 1:
            raise GC3Error(f"VirtualGemmGroup: the number of ranks must be an int >= 1, got {n!r}")
        self.n = n
        self.local = list(range(n))
        self._keep: List[Any] = []
        self._start(f"virtual group of {n} ranks", trace)

    def _register(self, key, sizes) -> ShapeState:
        import cupy

        setup = streams.setup_stream()
        bases: Dict[str, Dict[int, int]] = {name: {} for name in sizes}
        flags: Dict[int, int] = {}
        with streams.current(setup):
            for r in self.local:
                for name, size in sizes.items():
                    arr = cupy.zeros(max(2 * size, 256), dtype=cupy.uint8)
                    self._keep.append(arr)
                    bases[name][r] = arr.data.ptr
                f = cupy.zeros(flag_words(self.n), dtype=cupy.uint32)
                self._keep.append(f)
                flags[r] = f.data.ptr
        setup.synchronize()
        return ShapeState(self.n, sizes, bases, flags)

    def exchange(self, obj) -> list:
        raise GC3Error("a virtual group holds every rank's arguments already; nothing to exchange")

    def close(self) -> None:
        import cupy

        cupy.cuda.Device().synchronize()
        for lr in self.ranks.values():
            lr.close()
        self._keep = []
        self._shapes = {}


class IpcGemmGroup(_Group):
    """This process's rank of `comm` (mpi4py-like: rank, size, allgather, Barrier)."""

    def __init__(self, comm=None, trace: Optional[bool] = None):
        if comm is None:
            from mpi4py import MPI   # importing it starts MPI: only when no communicator is given

            comm = MPI.COMM_WORLD
        self.comm = comm
        self.n = comm.Get_size()
        self.rank = comm.Get_rank()
        self.local = [self.rank]
        self._own: List[_RawBuffer] = []
        self._opened: List[int] = []
        self._start(f"rank {self.rank} of {self.n}", trace)

    def exchange(self, obj) -> list:
        return self.comm.allgather(obj)

    def _agree(self, phase: str, failure: Optional[str], payload) -> list:
        gathered = self.comm.allgather((failure, payload))
        failures = [f for f, _ in gathered if f is not None]
        if failures:
            raise GC3Error(f"{self.where}: GEMM fusion set-up failed while {phase}: " + "; ".join(failures))
        return [p for _, p in gathered]

    def _register(self, key, sizes) -> ShapeState:
        import cupy

        # Both phases end in a collective every rank reaches whether its part
        # failed or not, so a rank that failed alone cannot strand its peers.
        failure, handles, mine = None, None, None
        try:
            mine = [_RawBuffer(2 * size) for size in sizes.values()] + [_RawBuffer(4 * flag_words(self.n))]
            self._own.extend(mine)
            streams.setup_stream().synchronize()   # zeroed before any peer may signal into it
            handles = [cupy.cuda.runtime.ipcGetMemHandle(b.ptr) for b in mine]
        except Exception as exc:
            failure = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        gathered = self._agree("allocating buffers", failure, (repr(key), handles))
        keys = {k for k, _ in gathered}
        if len(keys) != 1:
            raise GC3Error(f"{self.where}: the ranks called with different shapes: "
                           + "; ".join(f"rank {r}: {k}" for r, (k, _) in enumerate(gathered)))
        failure, ptrs = None, {}
        try:
            for r, (_, hs) in enumerate(gathered):
                if r == self.rank:
                    ptrs[r] = [b.ptr for b in mine]
                else:
                    opened = [cupy.cuda.runtime.ipcOpenMemHandle(h, _LAZY_PEER_ACCESS) for h in hs]
                    self._opened.extend(opened)
                    ptrs[r] = opened
        except Exception as exc:
            failure = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        self._agree("mapping the peers' buffers", failure, None)
        names = list(sizes)
        bases = {name: {r: p[i] for r, p in ptrs.items()} for i, name in enumerate(names)}
        flags = {r: p[len(names)] for r, p in ptrs.items()}
        return ShapeState(self.n, sizes, bases, flags)

    def close(self) -> None:
        import cupy

        cupy.cuda.Device().synchronize()
        self.comm.Barrier()
        for p in self._opened:
            cupy.cuda.runtime.ipcCloseMemHandle(p)
        self._opened = []
        self.comm.Barrier()   # no peer maps our memory any more when we free it
        for b in self._own:
            b.free()
        self._own = []
        for lr in self.ranks.values():
            lr.close()
        self._shapes = {}
