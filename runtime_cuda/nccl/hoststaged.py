"""A stand-in for NCCL over MPI, staged through the host, for ranks that
cannot have NCCL: several processes sharing one GPU (NCCL refuses two ranks
on one device).  `NcclCommunicator.from_mpi` uses it as the fallback, so the
drop-in's routing, gc3's launch groups and their ordering against the
caller's CuPy work can all be tested on one GPU; the differential fuzz checks
its results against an exact reference like everything else.

Each call waits for its stream, moves the data through the host and writes
the result before returning: it is ordered with everything before and after
it on that stream (more strictly than NCCL, which does not block the host).
Between group_start and group_end calls are queued and run at group_end, the
sends and receives as non-blocking MPI so that any pairing order completes.
Reductions run in rank order in numpy: exact for the integer-valued data the
tests use.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from gc3.ir.epilogue import avg_divide

from .constants import (DTYPE_NAMES, NCCL_AVG, NCCL_MAX, NCCL_MIN, NCCL_PROD, NCCL_SUM, numpy_dtype)
from .surface import CommunicatorSurface

_REDUCE = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum,
           NCCL_AVG: np.add}


class HostStagedNccl(CommunicatorSurface):
    """cupy.cuda.nccl.NcclCommunicator's pointer methods, over an mpi4py communicator."""

    def __init__(self, mpi_comm, device: int):
        self.mpi = mpi_comm
        self._rank, self._size, self._device = mpi_comm.Get_rank(), mpi_comm.Get_size(), device
        self._queued: Optional[List[Callable[[], None]]] = None
        self._p2p: List[tuple] = []
        self.calls = 0

    # -- host staging --------------------------------------------------------------
    @staticmethod
    def _dtype(code: int) -> np.dtype:
        return numpy_dtype(DTYPE_NAMES[code])

    def _not_capturing(self, stream: int) -> None:
        from gc3.errors import CommunicatorError
        from runtime_cuda.core.streams import is_capturing

        if is_capturing(stream):
            raise CommunicatorError(
                f"rank {self._rank}: a call that gc3 does not serve went to the host-staged stand-in for NCCL "
                f"(NcclCommunicator.from_mpi), which waits on the host and cannot be captured in a CUDA graph")

    def _get(self, ptr: int, count: int, code: int, stream: int) -> np.ndarray:
        import cupy

        self._not_capturing(stream)
        a = np.empty(count, self._dtype(code))
        cupy.cuda.runtime.streamSynchronize(stream)
        if count:
            cupy.cuda.runtime.memcpy(a.ctypes.data, ptr, a.nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        return a

    def _put(self, ptr: int, a: np.ndarray, stream: int) -> None:
        import cupy

        self._not_capturing(stream)
        a = np.ascontiguousarray(a)
        if a.size:
            cupy.cuda.runtime.memcpyAsync(ptr, a.ctypes.data, a.nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                                          stream)
        cupy.cuda.runtime.streamSynchronize(stream)

    def _allgather(self, a: np.ndarray) -> List[np.ndarray]:
        # Buffer-based (no pickling): these carry up to hundreds of MiB per call.
        out = np.empty((self._size, a.size), dtype=a.dtype)
        self.mpi.Allgather(a.view(np.uint8), out.view(np.uint8))
        return list(out)

    def _reduce(self, parts: List[np.ndarray], op: int) -> np.ndarray:
        acc = parts[0].copy()
        for p in parts[1:]:
            acc = _REDUCE[op](acc, p)
        if op == NCCL_AVG:
            # NCCL divides integers toward zero (avg_divide: |x| taken unsigned, so int8's -128 divides right).
            acc = avg_divide(acc, self._size) if acc.dtype.kind in "iu" else (acc / self._size).astype(acc.dtype)
        return acc

    def _run(self, fn: Callable[[], None]) -> None:
        self.calls += 1
        if self._queued is not None:
            self._queued.append(fn)
        else:
            fn()

    # -- collectives, with cupy's parameter names ------------------------------------
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        def go():
            parts = self._allgather(self._get(sendbuf, count, datatype, stream))
            self._put(recvbuf, self._reduce(parts, op), stream)
        self._run(go)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        def go():
            parts = self._allgather(self._get(sendbuf, recvcount * self._size, datatype, stream))
            self._put(recvbuf, self._reduce(parts, op)[self._rank * recvcount:(self._rank + 1) * recvcount], stream)
        self._run(go)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        def go():
            parts = self._allgather(self._get(sendbuf, count, datatype, stream))
            self._put(recvbuf, np.concatenate(parts), stream)
        self._run(go)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        def go():
            buf = (self._get(sendbuff, count, datatype, stream) if self._rank == root
                   else np.empty(count, self._dtype(datatype)))
            self.mpi.Bcast(buf.view(np.uint8), root=root)
            self._put(recvbuff, buf, stream)
        self._run(go)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        def go():
            parts = self._allgather(self._get(sendbuf, count, datatype, stream))
            if self._rank == root:
                self._put(recvbuf, self._reduce(parts, op), stream)
        self._run(go)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._queue_p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._queue_p2p("recv", recvbuf, count, datatype, peer, stream)

    def _queue_p2p(self, kind: str, ptr, count, datatype, peer, stream) -> None:
        self.calls += 1
        self._p2p.append((kind, ptr, count, datatype, peer, stream))
        if self._queued is None:
            self._flush_p2p()

    def _flush_p2p(self) -> None:
        from mpi4py import MPI

        ops, self._p2p = self._p2p, []
        reqs, landing = [], []
        # Tags count per (direction, peer) so that several messages between one
        # pair in one group match in issue order, as NCCL's do.
        seq = {}
        for kind, ptr, count, code, peer, stream in ops:
            k = seq[(kind, peer)] = seq.get((kind, peer), -1) + 1
            if kind == "send":
                a = self._get(ptr, count, code, stream)
                landing.append((None, a, stream))
                reqs.append(self.mpi.Isend(a.view(np.uint8), dest=peer, tag=k))
            else:
                a = np.empty(count, self._dtype(code))
                landing.append((ptr, a, stream))
                reqs.append(self.mpi.Irecv(a.view(np.uint8), source=peer, tag=k))
        MPI.Request.Waitall(reqs)
        for ptr, a, stream in landing:
            if ptr is not None:
                self._put(ptr, a, stream)

    # -- groups ---------------------------------------------------------------------------
    def group_start(self) -> None:
        if self._queued is None:
            self._queued = []

    def group_end(self) -> None:
        queued, self._queued = self._queued or [], None
        for fn in queued:
            fn()
        if self._p2p:
            self._flush_p2p()
