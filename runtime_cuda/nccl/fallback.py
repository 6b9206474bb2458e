"""Running a call on NCCL itself (through `cupy.cuda.nccl`).

NCCL has no all-to-all; here it is a group of sends and receives, one pair per
peer, with the rank's own block copied on the stream (and, for an in-place
call, the whole input staged first so no receive overwrites a block still to
be sent).

`runtime_cuda.auto` replaces names in `cupy.cuda.nccl`; it keeps the originals
in `cupy.cuda.nccl._gc3_originals`, which this module prefers, so the fallback
is always the real NCCL.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from gc3 import settings
from gc3.errors import CommunicatorError

from .call import Call
from .constants import NCCL_UINT8
from .surface import NcclHandle


def originals():
    """cupy.cuda.nccl's own NcclCommunicator, groupStart, groupEnd, get_unique_id."""
    from cupy.cuda import nccl
    saved = getattr(nccl, "_gc3_originals", None)
    if saved is not None:
        return saved
    return {name: getattr(nccl, name) for name in
            ("NcclCommunicator", "groupStart", "groupEnd", "get_unique_id")}


def _two_bytes():
    """NcclFallback.bridge's buffer (a seam for the CPU tests)."""
    from runtime_cuda.core import streams

    return streams.setup_zeros(2, "uint8")


def orders_launches() -> bool:
    """Whether the NCCL CuPy loaded orders each of a communicator's launches after the one
    before, whatever stream each ran on (2.14 on: it launches through a stream of the
    communicator's own), and GC3_ORDER_COUNT lets the drop-in rely on it (NcclFallback.bridge)."""
    if not settings.get("GC3_ORDER_COUNT"):
        return False
    try:
        from cupy.cuda import nccl

        return nccl.get_version() >= 21400
    except Exception:   # no CuPy, or a CuPy without NCCL: nothing for the order to rely on
        return False


class NcclFallback:
    """Issues Calls on one cupy.cuda.nccl communicator."""

    def __init__(self, comm, group_fns=None, staging=None):
        self.comm = comm
        self._group_fns = group_fns   # (groupStart, groupEnd); NCCL's own when None
        # staging(nbytes) -> device pointer where an in-place alltoall's input is copied first;
        # None: a CuPy allocation per call.  NCCL 2.28.9 was seen to hang (2x H200, from 1 MiB per
        # peer) receiving into a symmetric window while sending from unregistered memory, so a
        # communicator on windows stages into a window too.
        self._staging = staging

    def _group(self):
        if self._group_fns is None:
            nccl = originals()
            self._group_fns = (nccl["groupStart"], nccl["groupEnd"])
        return self._group_fns

    def run(self, call: Call) -> None:
        c, comm = call, self.comm
        bound = self.bind(c)
        if bound is not None:
            bound(c.stream)
        elif c.coll == "send":
            comm.send(c.sendbuf, c.count, c.dtype, c.root, c.stream)
        elif c.coll == "recv":
            comm.recv(c.recvbuf, c.count, c.dtype, c.root, c.stream)
        elif c.coll == "alltoall":
            self._alltoall(c)
        else:
            raise ValueError(f"NCCL has no collective {c.coll!r}")

    def bind(self, call: Call):
        """What issues `call` again given only its stream: NCCL's own method with the
        other arguments bound, so a repeat routed to NCCL costs one Python call more
        than calling NCCL directly (the drop-in's repeat path; None: no shortcut)."""
        c, comm = call, self.comm
        if c.coll == "allreduce":
            return partial(comm.allReduce, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op)
        if c.coll == "allgather":
            return partial(comm.allGather, c.sendbuf, c.recvbuf, c.count, c.dtype)
        if c.coll == "reducescatter":
            return partial(comm.reduceScatter, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op)
        if c.coll == "broadcast":
            return partial(comm.broadcast, c.sendbuf, c.recvbuf, c.count, c.dtype, c.root)
        if c.coll == "reduce":
            return partial(comm.reduce, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, c.root)
        if c.coll == "alltoall":
            if c.inplace and c.nranks > 1:   # its input is staged through a copy allocated per call
                return lambda stream: self._alltoall(c if stream == c.stream else replace(c, stream=stream))
            return self._alltoall_bound(c, c.sendbuf)
        return None

    def bridge(self, rank: int):
        """StreamOrder.bridge for this communicator: bridge(stream) makes `stream` wait for every
        NCCL operation the communicator has issued.  NCCL (2.14 on) makes each of its launches
        wait for the communicator's previous one, whatever stream that ran on, so one byte
        sent to self on `stream` does: a kernel of NCCL's copying one byte, issued only where
        a gc3 call follows an NCCL call on another stream."""
        comm, pair = self.comm, []

        def bridge(stream: int) -> None:
            if not pair:   # send from [0] into [1]: NCCL skips a send to self in place
                pair.append(_two_bytes())
            src = pair[0].data.ptr
            start, end = self._group()
            start()
            try:
                comm.send(src, 1, NCCL_UINT8, rank, stream)
                comm.recv(src + 1, 1, NCCL_UINT8, rank, stream)
            finally:
                end()
        return bridge

    def group_start(self) -> None:
        self._group()[0]()

    def group_end(self) -> None:
        self._group()[1]()

    def _alltoall(self, c: Call) -> None:
        src = c.sendbuf
        staged = None
        if c.inplace and c.nranks > 1:
            from cupy.cuda import runtime

            nbytes = c.count * c.itemsize * c.nranks
            if self._staging is not None:
                src = self._staging(nbytes)
            else:
                import cupy

                from runtime_cuda.core import streams
                # Allocated under the call's stream so cupy's pool reuses it only
                # for work ordered after this call on that stream (and without
                # `with stream:`, which would reset the caller's current stream).
                with streams.current(streams.wrap(c.stream)):
                    staged = cupy.empty(nbytes, dtype=cupy.uint8)
                src = staged.data.ptr
            runtime.memcpyAsync(src, c.sendbuf, nbytes, runtime.memcpyDeviceToDevice, c.stream)
        self._alltoall_bound(c, src)(c.stream)

    def _alltoall_bound(self, c: Call, src: int):
        """The all-to-all from `src` (the input, or its staged copy), given only the stream:
        the rank's own block copied on the stream, then one NCCL group of a send and a
        receive per peer, every address worked out once."""
        from cupy.cuda import runtime

        block = c.count * c.itemsize
        own = (c.recvbuf + c.rank * block, src + c.rank * block, block, runtime.memcpyDeviceToDevice)
        peers = [(src + p * block, c.recvbuf + p * block, p) for p in range(c.nranks) if p != c.rank]
        copy, send, recv, (start, end), count, dtype = (runtime.memcpyAsync, self.comm.send, self.comm.recv,
                                                         self._group(), c.count, c.dtype)

        def alltoall(stream: int) -> None:
            copy(*own, stream)
            start()
            try:
                for out, into, peer in peers:
                    send(out, count, dtype, peer, stream)
                    recv(into, count, dtype, peer, stream)
            finally:
                end()
        return alltoall


class NoFallback(CommunicatorError):
    """A call gc3 does not serve, on a communicator with no NCCL behind it."""


class Refusing(NcclHandle):
    """The fallback where there is no NCCL (ranks sharing one GPU, which NCCL
    refuses, or the fallback switched off): every call gc3 does not serve fails
    here, before anything is enqueued, naming the call and why NCCL is absent.
    It also stands in for the raw NCCL communicator the drop-in holds (`NcclHandle`)."""

    def __init__(self, device: int, reason: str):
        self._device = device
        self.reason = reason

    def run(self, call: Call) -> None:
        raise NoFallback(
            f"rank {call.rank}: gc3 does not serve {call.describe()} and there is no NCCL to forward it to "
            f"({self.reason}); GC3_DEBUG=INFO lists why each gc3 algorithm was rejected")

    def group_start(self) -> None:
        pass

    def group_end(self) -> None:
        pass
