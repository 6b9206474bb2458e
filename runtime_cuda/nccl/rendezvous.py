"""Exchanging small host objects between the ranks of a communicator, over
NCCL itself, over MPI, or over a torch.distributed c10d Store.

`NcclCommunicator(ndev, commId, rank)` gets no MPI communicator, only NCCL's
unique id; the NCCL communicator it opens for fallback is therefore also the
channel through which gc3's runtime trades CUDA IPC handles.  The object looks
like the slice of mpi4py's `Comm` that a rendezvous needs (allgather, bcast,
barrier, Get_rank, Get_size), so runtime code written against mpi4py accepts it.
"""
from __future__ import annotations

import pickle
from typing import Any, List

from .constants import NCCL_INT64, NCCL_UINT8


class _Exchange:
    """What both exchanges share: mpi4py's names for rank and size, and agreement."""
    _rank: int
    _size: int

    def Get_rank(self) -> int:
        return self._rank

    def Get_size(self) -> int:
        return self._size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def all_agree(self, ok: bool, why: str = "") -> List[str]:
        """Every rank's failure reason ('' where it succeeded), so all ranks take the same path."""
        return self.allgather("" if ok else (why or "failed"))


class _BytesExchange(_Exchange):
    """Objects pickled over a channel that only moves bytes (`allgather_bytes`)."""

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        raise NotImplementedError

    def allgather(self, obj: Any) -> List[Any]:
        return [pickle.loads(b) for b in self.allgather_bytes(pickle.dumps(obj))]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.allgather(obj if self._rank == root else None)[root]

    def barrier(self) -> None:
        self.allgather_bytes(b"")

    Barrier = barrier


class NcclExchange(_BytesExchange):
    def __init__(self, nccl_comm, rank: int, size: int, order=None):
        self._comm = nccl_comm
        self._rank = rank
        self._size = size
        # The communicator's StreamOrder: the exchange is an NCCL operation of
        # the same communicator, so it queues behind the calls issued before it.
        self.order = order

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        import cupy
        import numpy as np

        from runtime_cuda.core import streams

        # The private set-up stream, synchronized before returning: the
        # exchange is a blocking host operation.  Never `with stream:` here
        # (core/streams.py says why).
        stream = streams.setup_stream()
        if self.order is not None:   # NCCL orders its own launches (not a one-rank copy): no bridge to them
            self.order.enter(stream.ptr, None, self._size > 1)
        with streams.current(stream):
            lengths = cupy.zeros(self._size, dtype=cupy.int64)
            mine = cupy.asarray(np.array([len(data)], dtype=np.int64))
            self._comm.allGather(mine.data.ptr, lengths.data.ptr, 1, NCCL_INT64, stream.ptr)
            stream.synchronize()
            sizes = [int(n) for n in lengths.get(stream=stream)]
            width = max(max(sizes), 1)
            send = cupy.zeros(width, dtype=cupy.uint8)
            if data:
                send[: len(data)] = cupy.asarray(np.frombuffer(data, dtype=np.uint8))
            recv = cupy.empty(width * self._size, dtype=cupy.uint8)
            self._comm.allGather(send.data.ptr, recv.data.ptr, width, NCCL_UINT8, stream.ptr)
            stream.synchronize()
            host = recv.get(stream=stream).tobytes()
        return [host[r * width: r * width + n] for r, n in enumerate(sizes)]


class MpiExchange(_Exchange):
    """The same exchange over an mpi4py communicator: for ranks that cannot
    open an NCCL communicator (several processes sharing one GPU, which NCCL
    refuses), and for programs that already run under MPI."""

    def __init__(self, mpi_comm):
        self._comm = mpi_comm
        self._rank = mpi_comm.Get_rank()
        self._size = mpi_comm.Get_size()

    def allgather(self, obj: Any) -> List[Any]:
        return self._comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self._comm.Barrier()

    Barrier = barrier


class StoreExchange(_BytesExchange):
    """The same exchange over a c10d Store (TCPStore, FileStore, HashStore, a
    PrefixStore of one): what a torch.distributed backend receives, so ranks
    started by torchrun rendezvous with no MPI and before any NCCL exists.

    Every exchange is numbered; rank r writes key `<n>/<r>` and reads the
    others' with the store's blocking `get` (which waits up to the store's
    timeout, so a missing rank fails instead of hanging).  A last reader
    deletes nothing: keys are small, and a FileStore or TCPStore outlives the
    communicator only as long as the job does.
    """

    def __init__(self, store, rank: int, size: int, prefix: str = "gc3x"):
        self._store = store
        self._rank = rank
        self._size = size
        self._prefix = prefix
        self._seq = 0

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        self._seq += 1
        base = f"{self._prefix}/{self._seq}/"
        self._store.set(base + str(self._rank), data)
        return [data if r == self._rank else bytes(self._store.get(base + str(r))) for r in range(self._size)]
