"""One collective call as the communicator receives it, and the sizes that
selection and the gc3 layout need from it.

NCCL counts mean different things per collective; `in_elems` converts them to
`gc3.ir.layout`'s convention (elements of each rank's input buffer) and `nbytes`
to nccl-tests' "size" column, which is what minBytes/maxBytes are compared to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .constants import ITEMSIZE, dtype_name, op_name

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
REDUCING = ("allreduce", "reducescatter", "reduce")
ROOTED = ("broadcast", "reduce")


@dataclass(slots=True)
class Call:
    coll: str           # one of COLLECTIVES, or "send"/"recv"
    sendbuf: int        # raw device pointers (0 where the call has none)
    recvbuf: int
    count: int          # NCCL's count argument (per peer for alltoall)
    dtype: int          # NCCL datatype code
    op: Optional[int]   # NCCL op code; None for non-reducing collectives
    stream: int
    nranks: int
    rank: int
    root: int = 0       # broadcast/reduce root, or send/recv peer

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    @property
    def op_name(self) -> Optional[str]:
        return None if self.op is None else op_name(self.op)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def in_elems(self) -> int:
        """Elements of this rank's input buffer (gc3.ir.layout's `in_elems`)."""
        if self.coll in ("reducescatter", "alltoall"):
            return self.count * self.nranks
        return self.count

    @property
    def out_elems(self) -> int:
        if self.coll in ("allgather", "alltoall"):
            return self.count * self.nranks
        return self.count

    @property
    def nbytes(self) -> int:
        """nccl-tests' size column: the bytes of the larger user buffer."""
        return max(self.in_elems, self.out_elems) * self.itemsize

    @property
    def inplace(self) -> bool:
        """NCCL's in-place rule: the smaller buffer sits at this rank's block of the larger."""
        step = self.count * self.itemsize
        if self.coll == "allgather":
            return self.sendbuf == self.recvbuf + self.rank * step
        if self.coll == "reducescatter":
            return self.recvbuf == self.sendbuf + self.rank * step
        return self.sendbuf == self.recvbuf

    @property
    def nccl_launches(self) -> bool:
        """Whether the call ends with a kernel NCCL launches when it serves it: NCCL discards a
        call with no data, and a one-rank communicator's is a copy (its launch order then
        orders nothing)."""
        return self.count > 0 and self.nranks > 1

    @property
    def nccl_ordered(self) -> bool:
        """Whether NCCL's launch order covers all of the call when NCCL serves it: it launches a
        kernel and nothing comes before it (the all-to-all copies the rank's own block first,
        runtime_cuda.nccl.fallback)."""
        return self.nccl_launches and self.coll != "alltoall"

    def describe(self) -> str:
        if self.coll in ("send", "recv"):
            return f"{self.coll} count={self.count} {self.dtype_name} peer={self.root}"
        op = f" op={self.op_name}" if self.op is not None else ""
        root = f" root={self.root}" if self.coll in ROOTED else ""
        place = "in-place" if self.inplace else "out-of-place"
        return (f"{self.coll} count={self.count} {self.dtype_name}{op}{root} {place} "
                f"{self.nbytes} B on {self.nranks} ranks")
