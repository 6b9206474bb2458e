"""Production mode: one process per GPU (mpirun + mpi4py).  Each process
runs its own rank's threadblocks; FIFOs and credit words live in the
receiver's/sender's memory as in `connections`, and peers map them through
CUDA IPC, so the kernel signals with plain peer stores."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from gc3.errors import GC3Error
from gc3.ir import Program

from ..core import streams, tables as tables_mod
from ..core.connections import CONTROL_ABORT, control_words, rank_layout, records
from ..core.group import LaunchGroup
from ..core.launcher import Executor, runtime_protocol

_LAZY_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess


class _RawBuffer:
    """A whole cudaMalloc allocation (an IPC handle names an allocation, so
    pool sub-allocations would not do), zeroed."""

    def __init__(self, nbytes: int):
        import cupy

        self.nbytes = max(nbytes, 256)
        self.ptr = cupy.cuda.runtime.malloc(self.nbytes)
        # Zeroed on the set-up stream, which the owner synchronizes: a plain
        # cudaMemset runs on the legacy stream and waits for the caller's work.
        cupy.cuda.runtime.memsetAsync(self.ptr, 0, self.nbytes, streams.setup_stream().ptr)

    def array(self, dtype, count: int):
        import cupy

        mem = cupy.cuda.UnownedMemory(self.ptr, self.nbytes, self)
        return cupy.ndarray((count,), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def free(self) -> None:
        import cupy

        if self.ptr:
            cupy.cuda.runtime.free(self.ptr)
            self.ptr = 0


def agree(gathered, name: str, phase: str, release: Callable[[], None]) -> List:
    """`gathered`: every rank's (failure or None, payload), from one allgather that
    every rank reaches whether its phase failed or not.  Raise on every rank
    (after `release`) if any failed; else return what each rank sent."""
    failures = [f for f, _ in gathered if f is not None]
    if failures:
        release()
        raise GC3Error(f"{name}: set-up failed while {phase}: " + "; ".join(failures))
    return [payload for _, payload in gathered]


def open_peers(handles: Sequence[Sequence], rank: int, own: Sequence[_RawBuffer],
               opened: List[int]) -> Dict[int, Tuple[int, ...]]:
    """Per rank, the addresses of its buffers in this process: our own, and the
    peers' opened from their IPC handles (appended to `opened`, which the
    caller closes)."""
    import cupy

    bases: Dict[int, Tuple[int, ...]] = {}
    for r, hs in enumerate(handles):
        if r == rank:
            bases[r] = tuple(b.ptr for b in own)
        else:
            ptrs = tuple(cupy.cuda.runtime.ipcOpenMemHandle(h, _LAZY_PEER_ACCESS) for h in hs)
            opened.extend(ptrs)
            bases[r] = ptrs
    return bases


class IpcRanks(LaunchGroup):
    def __init__(self, prog: Program, comm=None, *, proto: Optional[str] = None, timeout: Optional[float] = None,
                 device: Optional[int] = None):
        import cupy

        if comm is None:
            from mpi4py import MPI   # only when no communicator is given: importing it starts MPI

            comm = MPI.COMM_WORLD
        if comm.size != prog.ngpus:
            raise GC3Error(f"{prog.name} is a {prog.ngpus}-rank program but {comm.size} processes were started "
                           f"(mpirun -np {prog.ngpus})")
        self.comm = comm
        self.rank = rank = comm.rank
        self.prog = prog
        self._own, self._opened = [], []
        # Set-up runs in two local phases, each closed by a collective that every
        # rank reaches whether its phase failed or not: a rank that failed alone
        # would otherwise leave its peers waiting in the next collective forever.
        failure, handles = None, None
        try:
            ndev = cupy.cuda.runtime.getDeviceCount()
            cupy.cuda.Device(device if device is not None else rank % ndev).use()
            self.proto = runtime_protocol(prog.proto, proto)
            self.tables = tables_mod.build(prog, ranks=[rank])
            layouts = {r: rank_layout(prog, r, self.proto) for r in range(prog.ngpus)}
            mine = layouts[rank]
            self._own = [_RawBuffer(mine.fifo_bytes), _RawBuffer(8 * mine.sync_words),
                         _RawBuffer(8 * control_words(self.tables.nblocks))]
            handles = [cupy.cuda.runtime.ipcGetMemHandle(b.ptr) for b in self._own]
        except Exception as exc:  # reported to every rank below, then raised everywhere
            failure = f"rank {rank}: {type(exc).__name__}: {exc}"
        handles = self._agree(comm.allgather((failure, handles)), "allocating its buffers")
        failure = None
        try:
            bases = open_peers(handles, rank, self._own, self._opened)
            sends, recvs = records(self.tables, layouts, lambda r: bases[r][0], lambda r: bases[r][1])
            aborts = [bases[r][2] + 8 * CONTROL_ABORT for r in range(prog.ngpus) if r != rank]
            control = self._own[2].array(cupy.uint64, control_words(self.tables.nblocks))
            self.executor = Executor(self.tables, self.proto, sends, recvs, control, abort_peers=aborts,
                                     timeout=timeout)
            self._init_calls()
            streams.setup_stream().synchronize()
        except Exception as exc:
            failure = f"rank {rank}: {type(exc).__name__}: {exc}"
        # Every peer's memory is zeroed and mapped before anyone signals into it.
        self._agree(comm.allgather((failure, None)), "mapping its peers' memory")

    def _agree(self, gathered, phase: str):
        return agree(gathered, self.prog.name, phase, self._release)

    def _release(self, between=lambda: None) -> None:
        import cupy

        for p in self._opened:
            cupy.cuda.runtime.ipcCloseMemHandle(p)
        self._opened = []
        between()
        for b in self._own:
            b.free()

    def close(self) -> None:
        import cupy

        cupy.cuda.Device().synchronize()
        self.comm.Barrier()
        self._release(between=self.comm.Barrier)   # no peer still maps our memory when we free it
