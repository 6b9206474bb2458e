"""GEMV + AllReduce as one launch on every SM (kernels/gemv_allreduce.cu, which says
how): y = sum over ranks of x_r [batch, K] @ w_r [K, N], identical bits on every rank.

A group holds the small-message kernels' scratch (runtime_cuda.ranks.small_allreduce:
one allocation per rank, mapped by the peers once, the call number on the
device), sized for the largest partial it serves, SCRATCH_BYTES.  A call passes
its addresses by value in the launch's parameters, so nothing is uploaded or
cached per pointer: one call is a few field writes and one driver launch, on
any stream, and a CUDA-graph capture of it replays as a new call.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Dict, Optional, Sequence, Tuple

from gc3 import limits
from gc3.dtypes import dtype_info
from gc3.errors import GC3Error

from ..core import abi, module, streams
from ..core.launcher import CommunicatorBroken, bound_launches
from ..ranks.small_allreduce import MAX_LOCAL, THREADS, SmallAllreduce, kernel_params, kernel_refusal, most_blocks

KERNEL_NAME = "gc3_gemv_allreduce"
SPLITK_KERNEL_NAME = "gc3_gemv_allreduce_splitk"
DTYPES = ("bfloat16", "float16", "float32")
TILE_LANES = abi.C["GC3_GV_TILE_LANES"]
SCRATCH_BYTES = limits.SMALL_ALLREDUCE_MAX_BYTES
LINE_DATA = limits.SMALL_ALLREDUCE_LINE_DATA_BYTES
# Tiles start at multiples of this many columns: a 16-byte weight load never straddles two tiles.
COLUMN_STEP = 8
# Split-K (batches up to SPLIT_MAX_BATCH; gemv_allreduce.cu says how): the blocks of a tile
# each take a slice of K of at least SPLIT_MIN_ROWS rows (ROWS_MIN in the rows form), their
# fp32 partials in a workspace of SPLIT_WORK_BYTES per rank after one u64 per item (slice of a
# tile).  A tile is, in the 16-bit types, one 16-byte vector a thread of the block across the
# row (the rows form: up to SPLIT_FMA_ROWS rows, on CUDA cores) or MMA_COLS columns a warp
# (tensor cores, more rows); in fp32 one warp's row of vectors.
SPLIT_MAX_BATCH = abi.C["GC3_GV_SPLIT_MAX_BATCH"]
SPLIT_FMA_ROWS = abi.C["GC3_GV_SPLIT_FMA_ROWS"]
SPLIT_DONE_BYTES = abi.C["GC3_GV_DONE_BYTES"]
SPLIT_ACC = abi.C["GC3_GV_SPLIT_ACC"]
MMA_COLS = abi.C["GC3_GV_MMA_COLS"]
SPLIT_MIN_ROWS = 128
ROWS_MIN = abi.C["GC3_GV_ROWS_MIN"]
SPLIT_WORK_BYTES = 8 << 20
_VEC_BYTES = 16


@functools.lru_cache(maxsize=None)
def _module(dtype: str, device: int):
    import cupy

    return cupy.RawModule(code=module.source("gemv_allreduce.cu"),
                          options=module.options(dtype, "sum", "LL", compute=True))


def kernel(dtype: str, device: int, split: bool = False):
    """The compiled kernel (column tiles, or `split`-K) for the current device (`device` is part
    of the cache key)."""
    return _module(dtype, device).get_function(SPLITK_KERNEL_NAME if split else KERNEL_NAME)


def split_vectors(batch: int, itemsize: int, acc: int = SPLIT_ACC) -> Tuple[int, int]:
    """(elements per vector, vectors per lane) of a split-K call, as the kernel's splitk_vec and
    splitk_run pick them for the batch's bucket of rows (1, 2, 4, 8) within `acc` accumulators a
    thread: 16-byte vectors where a bucket's row of them fits, up to 4 per lane."""
    rows = 1 if batch <= 1 else 2 if batch <= 2 else 4 if batch <= 4 else 8
    vec = _VEC_BYTES // itemsize
    if rows * vec > acc:
        vec //= 2
    return vec, max(1, min(4, acc // (rows * vec)))


def split_plan(batch: int, k: int, n_out: int, itemsize: int, blocks: int,
               acc: int = SPLIT_ACC, max_batch: Optional[int] = None) -> Optional[Tuple[int, int]]:
    """(columns per tile, slices of K per tile) of the split-K form, or None where it does not
    serve the shape (more rows than `max_batch`, by default the form's limit; CUDA-core columns
    that the vectors do not divide; more items than flags; one slice's partial larger than the
    workspace)."""
    if batch > min(SPLIT_MAX_BATCH if max_batch is None else max_batch, SPLIT_MAX_BATCH):
        return None
    rows = SPLIT_MIN_ROWS
    if itemsize == 2 and batch > SPLIT_FMA_ROWS:
        tw = MMA_COLS * (THREADS // 32)
    elif itemsize == 2:
        vec = _VEC_BYTES // itemsize
        if n_out % vec:
            return None
        tw, rows = THREADS * vec, ROWS_MIN   # one pass of the block's vectors (rows_item)
    else:
        vec, lanes = split_vectors(batch, itemsize, acc)
        if n_out % vec:
            return None
        tw = 32 * vec * lanes
    tiles = -(-n_out // tw)
    if tiles > SPLIT_DONE_BYTES // 8 or batch * n_out * 4 > SPLIT_WORK_BYTES:
        return None
    split = max(1, min(blocks // tiles, -(-k // rows), SPLIT_WORK_BYTES // (batch * n_out * 4)))
    return tw, split


class _Args(ctypes.Structure):
    """gc3_gemv_allreduce's parameters, in its order (io: x, w, out, workspace of each local rank)."""
    _fields_ = [("plan", ctypes.c_uint64), ("peers", ctypes.c_uint64), ("io", ctypes.c_uint64 * (4 * MAX_LOCAL)),
                ("nranks", ctypes.c_int32), ("rank0", ctypes.c_int32), ("batch", ctypes.c_int32),
                ("K", ctypes.c_int32), ("N", ctypes.c_int32), ("tw", ctypes.c_int32), ("split", ctypes.c_int32),
                ("max_lines", ctypes.c_int64), ("region_lines", ctypes.c_int64), ("grid_max", ctypes.c_int32)]


def tile_columns(batch: int, n_out: int, blocks: int) -> int:
    """Columns per tile: the narrowest step multiple that makes at most `blocks` tiles
    (every block busy, the weight split evenly), no wider than a tile's shared memory."""
    tw = -(-n_out // blocks)
    tw = -(-tw // COLUMN_STEP) * COLUMN_STEP
    return max(COLUMN_STEP, min(tw, TILE_LANES // batch // COLUMN_STEP * COLUMN_STEP))


def slot_lines(batch: int, n_out: int, tw: int, itemsize: int) -> int:
    """LL lines one rank's partial takes in a slot (tiles at fixed offsets)."""
    lanes = LINE_DATA // itemsize
    return -(-n_out // tw) * -(-batch * tw // lanes)


def refusal(dtype: str, batch: int, k: int, n_out: int, nranks: int, nlocal: int = 1) -> Optional[str]:
    """None when the kernel serves this shape, else why not."""
    why = kernel_refusal(dtype, DTYPES, nranks, nlocal, "computes in", "nothing to reduce")
    if why:
        return why
    if min(batch, k, n_out) < 1 or max(batch, k, n_out) >= 2 ** 31:
        return f"x [{batch}, {k}] @ w [{k}, {n_out}]: every dimension must be 1 to 2^31 - 1"
    if batch * COLUMN_STEP > TILE_LANES:
        return f"batch {batch}: a tile holds {TILE_LANES} elements, at least {COLUMN_STEP} columns of every row"
    itemsize = dtype_info(dtype).np.itemsize
    need = slot_lines(batch, n_out, tile_columns(batch, n_out, 1 << 30), itemsize) * LINE_DATA
    if need > SCRATCH_BYTES:
        return f"partials of {batch} x {n_out} {dtype} ({need} B) exceed the scratch's {SCRATCH_BYTES} B per rank"
    return None


class GemvAllreduce:
    """The kernel for the ranks this process runs, over a SmallAllreduce group's scratch."""

    # False: column tiles over all of K at every batch (for measuring the split-K form against them).
    split_k = True
    # Split-K up to this many rows (None: the form's limit, SPLIT_MAX_BATCH).
    split_max_batch: Optional[int] = None

    def __init__(self, group: SmallAllreduce):
        self.group = group
        self.executor = group.executor
        self.nranks = group.nranks
        self.nlocal = len(group.ranks)
        if self.nlocal > MAX_LOCAL:
            raise GC3Error(f"gemv_allreduce: {self.nlocal} ranks in one process (at most {MAX_LOCAL})")
        self._args = _Args(plan=group._plan.data.ptr, peers=group._peers.data.ptr, nranks=self.nranks,
                           rank0=group.ranks[0], max_lines=group.max_lines, region_lines=group.region_lines)
        self._params, self._params_ptr = kernel_params(self._args)
        self._shapes: Dict[tuple, tuple] = {}
        self._grid_max: Optional[int] = None
        # The split-K workspace of each local rank: zeroed counters, then partials.
        import cupy

        setup = streams.setup_stream()
        with self.executor.device, streams.current(setup):
            self._work = [cupy.zeros((SPLIT_DONE_BYTES + SPLIT_WORK_BYTES) // 4, dtype=cupy.int32)
                          for _ in range(self.nlocal)]
        setup.synchronize()
        for i, buf in enumerate(self._work):
            self._args.io[4 * i + 3] = buf.data.ptr

    @classmethod
    def virtual(cls, nranks: int, timeout: Optional[float] = None) -> "GemvAllreduce":
        return cls(SmallAllreduce.virtual(nranks, timeout, max_bytes=SCRATCH_BYTES))

    @classmethod
    def ipc(cls, comm, device: Optional[int] = None, timeout: Optional[float] = None) -> "GemvAllreduce":
        """Collective over `comm` (mpi4py-like), as SmallAllreduce.ipc."""
        return cls(SmallAllreduce.ipc(comm, device, timeout, max_bytes=SCRATCH_BYTES))

    def _most_blocks(self, fn) -> int:
        """Blocks per rank a launch may take, fixed for the group's life (the counters of
        that many blocks agree)."""
        if self._grid_max is None:
            self._grid_max = most_blocks(fn, self.executor.device, self.nlocal, "gemv_allreduce")
        return self._grid_max

    def _shape(self, batch: int, k: int, n_out: int, dtype: str) -> tuple:
        key = (batch, k, n_out, dtype, self.split_k, self.split_max_batch)
        got = self._shapes.get(key)
        if got is None:
            why = refusal(dtype, batch, k, n_out, self.nranks, self.nlocal)
            if why:
                raise GC3Error(f"gemv_allreduce: {why}")
            fn = kernel(dtype, self.executor.device.id)
            most = self._most_blocks(fn)
            itemsize = dtype_info(dtype).np.itemsize
            plan = split_plan(batch, k, n_out, itemsize, most, max_batch=self.split_max_batch) if self.split_k else None
            tw, split = plan if plan else (tile_columns(batch, n_out, most), 0)
            if split:
                fn = kernel(dtype, self.executor.device.id, split=True)
            need = slot_lines(batch, n_out, tw, itemsize)
            if need > self.group.max_lines:
                raise GC3Error(f"gemv_allreduce: partials of {batch} x {n_out} {dtype} take {need} lines, the "
                               f"scratch holds {self.group.max_lines}")
            grid = min(most, -(-n_out // tw) * max(split, 1))
            # A captured call's launch is marked: the kernel prefetches weight rows into L2, then
            # waits on the device for the kernel ahead.
            marked, launch = bound_launches((fn.kernel.ptr, grid, self.nlocal, 1, THREADS, 1, 1, 0),
                                            self.executor.device)
            got = self._shapes[key] = (launch, marked, tw, split, most)
        return got

    def run_ptrs(self, x_ptrs: Sequence[int], w_ptrs: Sequence[int], out_ptrs: Sequence[int], batch: int, k: int,
                 n_out: int, dtype: str, stream=None) -> None:
        """Enqueue out = sum over ranks of x @ w on raw device addresses (one of each per
        local rank: x [batch, k], w [k, n_out], out [batch, n_out], C-contiguous, of `dtype`)
        on `stream`; a capturing stream captures it."""
        if self.executor.broken:
            raise CommunicatorBroken(f"this communicator stopped after an earlier failure: {self.executor.broken}")
        if not len(x_ptrs) == len(w_ptrs) == len(out_ptrs) == self.nlocal:
            raise GC3Error(f"gemv_allreduce: need {self.nlocal} x, w and out addresses (one per rank here), got "
                           f"{len(x_ptrs)}, {len(w_ptrs)} and {len(out_ptrs)}")
        launch, marked, tw, split, most = self._shape(batch, k, n_out, dtype)
        ptr = streams.handle(stream)
        captured = streams.is_capturing(ptr)
        self.executor.order.enter(ptr, captured)
        a = self._args
        for i in range(self.nlocal):
            a.io[4 * i], a.io[4 * i + 1], a.io[4 * i + 2] = x_ptrs[i], w_ptrs[i], out_ptrs[i]
        a.batch, a.K, a.N, a.tw, a.split, a.grid_max = batch, k, n_out, tw, split, most
        (marked if captured else launch)(ptr, self._params_ptr, 0)   # the driver copies the parameters now
        self.executor.order.leave(ptr, captured)

    def __call__(self, xs: Sequence, ws: Sequence, outs: Sequence, dtype: Optional[str] = None,
                 stream=None) -> list:
        """On CuPy arrays, one of each per local rank (bfloat16 travels as uint16: name it)."""
        dtype = dtype_info(dtype or xs[0].dtype).name
        self.run_ptrs([a.data.ptr for a in xs], [a.data.ptr for a in ws], [a.data.ptr for a in outs],
                      xs[0].shape[0], xs[0].shape[1], ws[0].shape[1], dtype, stream)
        return list(outs)

    def check(self) -> None:
        self.executor.check()

    def close(self) -> None:
        self.group.close()
