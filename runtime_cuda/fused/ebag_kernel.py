"""Embedding-bag + AllToAll as one launch on every SM (kernels/ebag_alltoall.cu, which says
how): each rank pools its tables' bags for the global batch and stores every destination's
rows straight into that rank's staging over NVLink; out[p] holds rank p's pooled rows of this
rank's samples.

A group holds the small-message kernels' scratch (runtime_cuda.ranks.small_allreduce: one
allocation per rank, mapped by the peers once, the call number on the device) with the flags
and two parity regions of staging after it, sized for calls whose slot (one rank's rows for
one destination) is at most `slot_bytes`.  A call passes its addresses by value, so a call is
a few field writes and one driver launch, on any stream, and a CUDA-graph capture of it
replays as a new call.  Indices and bag bounds are checked on the device: the first bad one
is recorded in host memory and raised at the group's next call or check, and the
communicator is unusable from then on (as after a device-side assert).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from gc3.dtypes import dtype_info
from gc3.errors import GC3Error

from ..core import abi, module, streams
from ..core.launcher import CommunicatorBroken
from ..ranks.small_allreduce import MAX_LOCAL, THREADS, SmallAllreduce, kernel_params, kernel_refusal, most_blocks

KERNEL_NAME = "gc3_ebag_alltoall"
DTYPES = ("bfloat16", "float16", "float32")
MAX_BLOCKS = abi.C["GC3_SA_MAX_BLOCKS"]
_ALIGN = 16
# Slots are sized in powers of two from this up, so a communicator holds few groups.
MIN_SLOT_BYTES = 1 << 20


@functools.lru_cache(maxsize=None)
def _module(dtype: str, device: int):
    import cupy

    return cupy.RawModule(code=module.source("ebag_alltoall.cu"),
                          options=module.options(dtype, "sum", "LL", compute=True))


def kernel(dtype: str, device: int):
    """The compiled kernel for the current device (`device` is part of the cache key)."""
    return _module(dtype, device).get_function(KERNEL_NAME)


def slot_bytes(t_count: int, dim: int, b: int, itemsize: int) -> int:
    """Bytes of one slot: one rank's pooled rows [b, T*dim] for one destination."""
    return b * t_count * dim * itemsize


def group_slot(nbytes: int) -> int:
    """The slot size of the group that serves calls of `nbytes` slots."""
    return max(MIN_SLOT_BYTES, 1 << max(0, nbytes - 1).bit_length())


def refusal(dtype: str, nranks: int, t_count: int, rows: int, dim: int, b: int, nnz: int,
            nlocal: int = 1) -> Optional[str]:
    """None when the kernel serves this shape, else why not."""
    why = kernel_refusal(dtype, DTYPES, nranks, nlocal, "pools", "nothing to exchange")
    if why:
        return why
    itemsize = dtype_info(dtype).np.itemsize
    if (dim * itemsize) % _ALIGN:
        return f"rows of {dim} {dtype} values ({dim * itemsize} B) are not a multiple of {_ALIGN} B"
    # The kernel's counts are 32-bit; its offsets into the operands are 64-bit.
    if min(t_count, rows, dim, b) < 1 or max(rows, nnz, nranks * b + 1, b * t_count * dim) >= 2 ** 31:
        return (f"tables [{t_count}, {rows}, {dim}], {nnz} indices per table, {b} samples per rank on {nranks} "
                f"ranks: rows, nnz, the global batch + 1 and a rank's output elements must be below 2^31")
    return None


class _IO(ctypes.Structure):
    _fields_ = [("p", ctypes.c_uint64 * (4 * MAX_LOCAL)), ("nnz", ctypes.c_int32 * MAX_LOCAL)]


class _Args(ctypes.Structure):
    """gc3_ebag_alltoall's parameters, in its order."""
    _fields_ = [("plan", ctypes.c_uint64), ("peers", ctypes.c_uint64), ("io", _IO), ("nranks", ctypes.c_int32),
                ("rank0", ctypes.c_int32), ("T", ctypes.c_int32), ("rows", ctypes.c_int32), ("dim", ctypes.c_int32),
                ("b", ctypes.c_int32), ("flags_off", ctypes.c_int64), ("data_off", ctypes.c_int64),
                ("slot_bytes", ctypes.c_int64), ("bad", ctypes.c_uint64), ("region_lines", ctypes.c_int64),
                ("grid_max", ctypes.c_int32)]


def _flag_bytes(nranks: int) -> int:
    """Bytes of a rank's flags ([nranks][MAX_BLOCKS] u64) and the bad-input claim word, 16-aligned."""
    return -(-(nranks * MAX_BLOCKS + 1) * 8 // _ALIGN) * _ALIGN


def extra_bytes(nranks: int, slot: int) -> int:
    """Bytes a rank's scratch holds after the small kernels' part: flags, then two parity regions."""
    return _flag_bytes(nranks) + 2 * nranks * slot


class EbagAlltoall:
    """The kernel for the ranks this process runs, over a SmallAllreduce group's scratch that
    holds `extra_bytes(nranks, slot)` more (use `virtual` or `ipc`)."""

    def __init__(self, group: SmallAllreduce, slot: int):
        import cupy

        self.group = group
        self.executor = group.executor
        self.nranks = group.nranks
        self.nlocal = len(group.ranks)
        self.slot = slot
        if self.nlocal > MAX_LOCAL:
            raise GC3Error(f"embedding_bag_alltoall: {self.nlocal} ranks in one process (at most {MAX_LOCAL})")
        # The bad-input record: pinned host memory the device reaches by the same address, so
        # the host reads it without queueing anything.
        self._pinned = cupy.cuda.alloc_pinned_memory(8 * 4)
        self._bad = np.frombuffer(self._pinned, dtype=np.int32, count=5)
        self._bad[:] = 0
        flags_off = group.extra_offset
        self._args = _Args(plan=group._plan.data.ptr, peers=group._peers.data.ptr, nranks=self.nranks,
                           rank0=group.ranks[0], flags_off=flags_off, data_off=flags_off + _flag_bytes(self.nranks),
                           slot_bytes=slot, bad=self._pinned.ptr, region_lines=group.region_lines)
        self._params, self._params_ptr = kernel_params(self._args)
        self._launch: Dict[Tuple[str, int], object] = {}
        self._grid_max: Optional[int] = None

    @classmethod
    def virtual(cls, nranks: int, slot: int, timeout: Optional[float] = None) -> "EbagAlltoall":
        return cls(SmallAllreduce.virtual(nranks, timeout, max_bytes=1, extra_bytes=extra_bytes(nranks, slot)), slot)

    @classmethod
    def ipc(cls, comm, slot: int, device: Optional[int] = None, timeout: Optional[float] = None) -> "EbagAlltoall":
        """Collective over `comm` (mpi4py-like), as SmallAllreduce.ipc: every rank passes the same `slot`."""
        return cls(SmallAllreduce.ipc(comm, device, timeout, max_bytes=1,
                                      extra_bytes=extra_bytes(comm.size, slot)), slot)

    def _grid(self, dtype: str, b: int):
        """The launch of the `dtype` kernel with its grid for b samples per destination (at most
        one block per sample row, at most grid_max, which the first call fixes)."""
        got = self._launch.get((dtype, b))
        if got is None:
            fn = kernel(dtype, self.executor.device.id)
            if self._grid_max is None:   # fixed for the group's life: the counters of that many blocks agree
                self._grid_max = most_blocks(fn, self.executor.device, self.nlocal, "embedding_bag_alltoall")
            from cupy_backends.cuda.api import driver

            grid = min(self._grid_max, b)
            got = self._launch[(dtype, b)] = functools.partial(driver.launchKernel, fn.kernel.ptr, grid, self.nlocal,
                                                               1, THREADS, 1, 1, 0)
        return got

    def raise_bad_input(self) -> None:
        """Raise ValueError, once, if a launch so far met a bad index or bag bound; the
        communicator is broken from then on."""
        if not self._bad[0] or self.executor.broken:
            return
        _, rank, t, pos, value = (int(v) for v in self._bad)
        where = (f"offsets[{t}, {pos}:{pos + 2}] are not bag bounds within the indices" if value == -1 else
                 f"indices[{t}, {pos}] = {value} is outside the table's rows")
        msg = f"embedding_bag_alltoall: rank {rank}: {where} (the call pooled it as nothing)"
        self.executor.broken = msg
        raise ValueError(msg)

    def run_ptrs(self, tables: Sequence[int], indices: Sequence[int], offsets: Sequence[int], outs: Sequence[int],
                 nnz: Sequence[int], t_count: int, rows: int, dim: int, b: int, dtype: str, stream=None) -> None:
        """Enqueue the pooled bags of every local rank's tables into its out [nranks, b, T*dim] on
        raw device addresses (one of each per local rank: tables [T, rows, dim] of `dtype`,
        indices [T, nnz] and offsets [T, nranks*b + 1] int32, all C-contiguous) on `stream`;
        a capturing stream captures it."""
        self.raise_bad_input()
        if self.executor.broken:
            raise CommunicatorBroken(f"this communicator stopped after an earlier failure: {self.executor.broken}")
        if not len(tables) == len(indices) == len(offsets) == len(outs) == len(nnz) == self.nlocal:
            raise GC3Error(f"embedding_bag_alltoall: need {self.nlocal} of each address and nnz (one per rank here)")
        need = slot_bytes(t_count, dim, b, dtype_info(dtype).np.itemsize)
        if need > self.slot:
            raise GC3Error(f"embedding_bag_alltoall: slots of {need} B exceed the group's {self.slot} B")
        if any(p % _ALIGN for p in outs):
            raise GC3Error(f"embedding_bag_alltoall: out must be {_ALIGN}-byte aligned")
        launch = self._grid(dtype, b)
        ptr = streams.handle(stream)
        captured = streams.is_capturing(ptr)
        self.executor.order.enter(ptr, captured)
        a = self._args
        for i in range(self.nlocal):
            a.io.p[4 * i], a.io.p[4 * i + 1], a.io.p[4 * i + 2], a.io.p[4 * i + 3] = \
                tables[i], indices[i], offsets[i], outs[i]
            a.io.nnz[i] = nnz[i]
        a.T, a.rows, a.dim, a.b, a.grid_max = t_count, rows, dim, b, self._grid_max
        launch(ptr, self._params_ptr, 0)   # the driver copies the parameters now
        self.executor.order.leave(ptr, captured)

    def check(self) -> None:
        self.executor.check()
        self.raise_bad_input()

    def close(self) -> None:
        self.group.close()
