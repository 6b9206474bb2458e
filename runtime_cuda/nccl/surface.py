"""What `cupy.cuda.nccl.NcclCommunicator` reports about itself, written once.

The drop-in (`communicator.NcclCommunicator`), the host-staged MPI stand-in for
NCCL (`hoststaged.HostStagedNccl`) and the fallback where there is no NCCL at
all (`fallback.Refusing`, which also stands in for the raw NCCL communicator
the drop-in holds) all answer cupy's questions: the NCCL handle, the device,
the rank and size, the asynchronous-error check, destroy and abort.

`NcclHandle` is what the drop-in asks of the NCCL communicator it holds;
`CommunicatorSurface` adds what a whole cupy communicator reports (rank and
size) and `bcast`, which cupy defines as an in-place broadcast.  The defaults
are those of a communicator with no NCCL communicator behind it: handle 0,
nothing to check, free or abandon.  A subclass provides `_device` (and, for a
CommunicatorSurface, `_rank`, `_size` and cupy's pointer-form `broadcast`).
"""
from __future__ import annotations


class NcclHandle:
    """The NCCL handle, the device, and the lifecycle, for a communicator that holds no NCCL."""

    _device: int

    @property
    def comm(self) -> int:
        return 0

    def device_id(self) -> int:
        return self._device

    def check_async_error(self) -> None:
        pass

    def destroy(self) -> None:
        pass

    def abort(self) -> None:
        pass


class CommunicatorSurface(NcclHandle):
    """Rank, size and `bcast` on top of `NcclHandle`, as cupy's communicator has them."""

    _rank: int
    _size: int

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)
