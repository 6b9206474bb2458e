"""Exchanging small host objects between the ranks of a communicator over
NCCL itself.

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


class NcclExchange:
    def __init__(self, nccl_comm, rank: int, size: int):
        self._comm = nccl_comm
        self._rank = rank
        self._size = size

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

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        import cupy
        import numpy as np
        # A private stream, synchronized before returning: the exchange is a
        # blocking host operation and must not wait behind the user's work.
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            lengths = cupy.zeros(self._size, dtype=cupy.int64)
            mine = cupy.asarray(np.array([len(data)], dtype=np.int64))
            self._comm.allGather(mine.data.ptr, lengths.data.ptr, 1, NCCL_INT64, stream.ptr)
            stream.synchronize()
            sizes = [int(n) for n in lengths.get()]
            width = max(max(sizes), 1)
            send = cupy.zeros(width, dtype=cupy.uint8)
            if data:
                send[: len(data)] = cupy.asarray(np.frombuffer(data, dtype=np.uint8))
            recv = cupy.empty(width * self._size, dtype=cupy.uint8)
            self._comm.allGather(send.data.ptr, recv.data.ptr, width, NCCL_UINT8, stream.ptr)
            stream.synchronize()
            host = recv.get().tobytes()
        return [host[r * width: r * width + n] for r, n in enumerate(sizes)]

    def allgather(self, obj: Any) -> List[Any]:
        return [pickle.loads(b) for b in self.allgather_bytes(pickle.dumps(obj))]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.allgather(obj if self._rank == root else None)[root]

    def barrier(self) -> None:
        self.allgather_bytes(b"")

    Barrier = barrier

    def all_agree(self, ok: bool, why: str = "") -> List[str]:
        """Every rank's failure reason ('' where it succeeded), so all ranks take the same path."""
        return self.allgather("" if ok else (why or "failed"))
