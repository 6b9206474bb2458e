"""The one-shot and two-shot allreduce kernels for small messages, and the
one-shot allgather and reducescatter on the same scratch
(kernels/small_allreduce.cu, which says how the epoch-tagged LL lines work),
as a launch group with the interface the drop-in uses (run_ptrs,
executor.order, executor.check, close).

One group per communicator serves both kernels from one scratch allocation
per rank, sized once for the largest call it will serve (`max_bytes`, at most
gc3.limits.SMALL_ALLREDUCE_MAX_BYTES) and mapped by the peers once (`ipc`, one process per rank) or plain device memory (`virtual`,
every rank in one launch on one GPU).  The call number lives on the device
(per-block counters in the scratch header), so the kernels' arguments never
change between calls and a captured launch replays as a new call.

avg is the sum kernel then runtime_cuda.core.avg's division pass (the caller's).

The same kernel built with the epilogue (`run_ptrs(..., epilogue=[per rank words],
out_dtype=)`) applies y * scale + bias + residual where each rank stores its result,
rounded once to out_dtype (runtime_cuda/fused/epilogue.py); `PassLaunch` is that
epilogue as a pass of its own, for calls above the kernels' limit.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from gc3 import limits, settings
from gc3.dtypes import dtype_info
from gc3.errors import GC3Error, LimitError

from ..core import abi, module, streams
from ..core.launcher import (CommunicatorBroken, Executor, PREPARED_CALLS_MAX, _blocks_per_sm, gpu_wait_timeout_s,
                             bound_launches)
from ..core.streams import StreamOrder

KERNEL_NAME = "gc3_small_allreduce"
LL128_KERNEL_NAME = "gc3_small_allreduce_ll128"   # the kinds on LL128 lines, an entry of their own
KINDS = {("allreduce", "oneshot"): abi.C["GC3_SA_ONESHOT"], ("allreduce", "twoshot"): abi.C["GC3_SA_TWOSHOT"],
         ("allreduce", "oneshot_ll128"): abi.C["GC3_SA_ONESHOT128"],
         ("allreduce", "twoshot_ll128"): abi.C["GC3_SA_TWOSHOT128"],
         ("allgather", "oneshot"): abi.C["GC3_SA_ALLGATHER"],
         ("reducescatter", "oneshot"): abi.C["GC3_SA_REDUCESCATTER"],
         ("allgather", "oneshot_ll128"): abi.C["GC3_SA_ALLGATHER128"],
         ("reducescatter", "oneshot_ll128"): abi.C["GC3_SA_REDUCESCATTER128"]}
assert set(KINDS) == {(c, k) for c, ks in limits.SMALL_KERNELS.items() for k in ks}
THREADS = limits.SMALL_ALLREDUCE_THREADS
BLOCKS = limits.SMALL_ALLREDUCE_BLOCKS   # per rank; fewer where the GPU cannot hold every rank's blocks at once
LINE_BYTES, LINE_DATA = 16, limits.SMALL_ALLREDUCE_LINE_DATA_BYTES
LL128_LINE, LL128_WORDS = limits.LL128_LINE_BYTES, limits.LL128_LINE_DATA_BYTES // LINE_DATA
HEADER_BYTES = abi.C["GC3_SA_HEADER_BYTES"]
MAX_LOCAL = abi.C["GC3_GV_MAX_LOCAL"]   # ranks one launch of the fused kernels on this scratch holds
_SA = {name: abi.C[f"GC3_SA_{name}"] for name in ("ABORT", "ERR", "COUNTERS", "MAX_BLOCKS")}
_PHASES = {0: "one-shot gather", 1: "two-shot phase 1 (segment to its owner)",
           2: "two-shot phase 2 (reduced segment from its owner)", 3: "allgather (a peer's block)",
           4: "reducescatter (a peer's part of this rank's segment)",
           5: "gemv + allreduce (a peer's partial of a column tile)",
           6: "embedding-bag + all-to-all (a peer's pooled rows for this block; the line is its first row)",
           7: "one-shot gather on LL128 lines (the line of 15 data words)",
           8: "two-shot phase 1 on LL128 lines (segment to its owner; the line of 15 data words)",
           9: "two-shot phase 2 on LL128 lines (reduced segment from its owner; the line of 15 data words)",
           10: "allgather on LL128 lines (a peer's block; the line of 15 data words)",
           11: "reducescatter on LL128 lines (a peer's part of this rank's segment; the line of 15 data words)"}


def scratch_shape(nranks: int, max_bytes: int = limits.SMALL_ALLREDUCE_DEFAULT_BYTES) -> Tuple[int, int, int]:
    """(lines of the largest input, lines of one parity region, bytes of a rank's scratch).
    A region holds the larger of one-shot's n whole inputs and two-shot's two
    halves of n segment slots.  After the two LL regions come the LL128 kernels' two parities,
    each the same larger of the two on 128-byte lines of 15 words (small_allreduce.cu's
    sa::ll128_area); a region is a whole number of such lines."""
    if not 1 <= max_bytes <= limits.SMALL_ALLREDUCE_MAX_BYTES:
        raise LimitError(f"small allreduce: scratch for calls of up to {max_bytes} B asked; the kernels serve "
                         f"1 to {limits.SMALL_ALLREDUCE_MAX_BYTES} B")
    max_lines = -(-max_bytes // LINE_DATA)
    seg = -(-max_lines // nranks)
    per_line = LL128_LINE // LINE_BYTES
    region = -(-max(nranks * max_lines, 2 * nranks * seg) // per_line) * per_line
    slot = -(-max_lines // LL128_WORDS)
    ll128 = max(nranks * slot, 2 * nranks * -(-slot // nranks))
    return max_lines, region, HEADER_BYTES + 2 * region * LINE_BYTES + 2 * ll128 * LL128_LINE


def block_elems(collective: str, in_elems: int, nranks: int) -> int:
    """Elements of one rank's block (the kernel's `count`): an allreduce's or an
    allgather's input, a reducescatter's output (its input is n of them)."""
    return in_elems // nranks if collective == "reducescatter" else in_elems


def refusal(dtype: str, op: str, in_elems: int, max_bytes: int = limits.SMALL_ALLREDUCE_MAX_BYTES,
            coll: str = "allreduce", nranks: int = 1) -> Optional[str]:
    """None when the kernels, with scratch for blocks of up to `max_bytes`, serve a
    `coll` on `nranks` ranks of `in_elems` input elements of `dtype` with `op`;
    else why not."""
    if coll == "reducescatter" and in_elems % nranks:
        return f"a reducescatter input of {in_elems} elements does not split into {nranks} segments"
    in_elems = block_elems(coll, in_elems, nranks)
    name = dtype if isinstance(dtype, str) else dtype_info(dtype).name
    if name not in abi.DTYPE:
        return f"no build for {name} (have {', '.join(abi.DTYPE)})"
    info = dtype_info(name)
    if op not in abi.REDOP:
        return f"no {op!r} reduction (have {', '.join(abi.REDOP)}; avg is sum followed by runtime_cuda.core.avg.divide)"
    nbytes = in_elems * info.np.itemsize
    if in_elems < 1 or nbytes > max_bytes:
        return f"{in_elems} elements of {info.name} ({nbytes} B); the scratch serves 1 element to {max_bytes} B"
    return None


# The types the epilogue build reduces and stores (epilogue.cuh's out_t): the float types
# a layer's partial sums come in.
EPILOGUE_DTYPES = ("float16", "bfloat16", "float32")
PASS_NAME = "gc3_epilogue_pass"
PASS_THREADS = 512
PASS_MAX_BLOCKS = 2048     # grid-stride beyond: a 64 MiB pass is 16 lines per thread
# Test hook: launches prepared while it is True reduce peer p + 1's contribution where p's
# belongs (-DGC3_SA_SHIFT_PEERS), so that a test can show its check rejects that result.
SHIFT_PEERS = False


@functools.lru_cache(maxsize=None)
def _module(dtype: str, op: str, device: int, epilogue: bool, out_dtype: Optional[str], shift: bool = False):
    import cupy

    opts = module.options(dtype, op, "LL", epilogue=epilogue, out_dtype=out_dtype)
    return cupy.RawModule(code=module.source("small_allreduce.cu"),
                          options=opts + (("-DGC3_SA_SHIFT_PEERS",) if shift else ()))


def kernel(dtype: str, op: str, device: int, epilogue: bool = False, out_dtype: Optional[str] = None,
           kind: str = "oneshot"):
    """The compiled kernel of `kind` for the current device (`device` is part of the cache key);
    `epilogue`: the build that applies one at the final store, storing `out_dtype`."""
    name = LL128_KERNEL_NAME if limits.small_kernel_protocol(kind) == "LL128" else KERNEL_NAME
    return _module(dtype, op, device, epilogue, _cast(dtype, out_dtype) if epilogue else None,
                   SHIFT_PEERS).get_function(name)


def _cast(dtype: str, out_dtype: Optional[str]) -> Optional[str]:
    """The build's -DGC3_OUT_DTYPE (None: the input's type), so one build serves both spellings."""
    return None if out_dtype in (None, dtype) else out_dtype


def epilogue_refusal(dtype: str, op: str, coll: str, out_dtype: str) -> Optional[str]:
    """None where the epilogue build serves the call, else why not."""
    if coll != "allreduce" or op != "sum":
        return f"an epilogue rides on a sum allreduce only, not {op} {coll}"
    for what, name in (("input", dtype), ("output", out_dtype)):
        if name not in EPILOGUE_DTYPES:
            return f"no epilogue build for {what} {name} (have {', '.join(EPILOGUE_DTYPES)})"
    return None


class _PassArgs(ctypes.Structure):
    """gc3_epilogue_pass's parameters, in its order."""
    _fields_ = [("y", ctypes.c_uint64), ("out", ctypes.c_uint64), ("count", ctypes.c_int64), ("bias", ctypes.c_uint64),
                ("residual", ctypes.c_uint64), ("scale", ctypes.c_uint64), ("shape", ctypes.c_uint64)]


class PassLaunch:
    """The epilogue pass of one (count, types, words) on the current device, packed once: a
    call sets y and out and is one driver launch (CuPy's kernel call cost a call of the fused
    epilogue some 25 µs of host time).  The driver copies the parameters at each launch, so
    one object serves call after call; not from two threads at once."""
    __slots__ = ("args", "params", "params_ptr", "_launch", "_fn")

    def __init__(self, count: int, dtype: str, out_dtype: str, words: Sequence[int]):
        import cupy
        from cupy_backends.cuda.api import driver

        why = epilogue_refusal(dtype, "sum", "allreduce", out_dtype)
        if why:
            raise GC3Error(f"epilogue pass: {why}")
        lines = -(-count * dtype_info(dtype).np.itemsize // LINE_DATA)
        blocks = max(1, min(PASS_MAX_BLOCKS, -(-lines // PASS_THREADS)))
        self._fn = _module(dtype, "sum", cupy.cuda.Device().id, True, _cast(dtype, out_dtype)).get_function(PASS_NAME)
        self.args = _PassArgs(0, 0, count, *(words[abi.C[f"GC3_EPW_{k}"]] for k in ("BIAS", "RESIDUAL", "SCALE", "SHAPE")))
        self.params, self.params_ptr = kernel_params(self.args)
        self._launch = functools.partial(driver.launchKernel, self._fn.kernel.ptr, blocks, 1, 1, PASS_THREADS, 1, 1, 0)

    def __call__(self, y: int, out: int, stream: int) -> None:
        """out = epilogue(y) on `stream` (out may be y itself where the types are the same)."""
        self.args.y, self.args.out = y, out
        self._launch(stream, self.params_ptr, 0)


class _Args(ctypes.Structure):
    """gc3_small_allreduce's parameters, in its order."""
    _fields_ = [("plan", ctypes.c_uint64), ("peers", ctypes.c_uint64), ("io", ctypes.c_uint64),
                ("nranks", ctypes.c_int32), ("rank0", ctypes.c_int32), ("count", ctypes.c_int64),
                ("kind", ctypes.c_int32), ("max_lines", ctypes.c_int64), ("region_lines", ctypes.c_int64),
                ("grid_max", ctypes.c_int32), ("epw", ctypes.c_uint64), ("done", ctypes.c_uint64)]


class _Launch:
    """One call, packed once: each call is one driver launch.  An eager launch's blocks bump
    the stream order's counter as they end (`counting`), a captured one's do not (its replays
    are no call the host counts), so each has its own parameter block."""
    __slots__ = ("ex", "fn", "grid", "nlocal", "args", "params", "params_ptr", "keep", "head", "_eager", "_captured",
                 "counting", "_cargs", "_cparams", "captured_params_ptr")
    coop = False    # a plain launch: each rank's blocks wait only on lines, never on a grid barrier

    def __init__(self, ex: "SmallExecutor", fn, grid: int, nlocal: int, args: _Args, keep, threads: int = THREADS):
        self.ex, self.fn, self.grid, self.nlocal, self.args, self.keep = ex, fn, grid, nlocal, args, keep
        self.params, self.params_ptr = kernel_params(args)
        self._cargs = _Args.from_buffer_copy(args)
        self._cargs.done = 0
        self._cparams, self.captured_params_ptr = kernel_params(self._cargs)
        # (the order whose counter the eager launch bumps, its blocks), or None where it bumps none.
        self.counting = (ex.order, grid * nlocal) if args.done else None
        # Everything but the stream fixed once: a call passes only the stream.
        self.head = (fn, grid, nlocal, 1, threads, 1, 1, 0)     # as launcher.Launch.head
        self._captured, self._eager = bound_launches(self.head, ex.device)

    def driver_calls(self):
        """As launcher.Launch.driver_calls: the marked launch in a capture, the plain one else."""
        return self._captured, self._eager, self.params_ptr

    # What runtime_cuda.core.group.Reissue reads of a prepared call: no copies around the launch.
    pre = post = ()

    @property
    def launch(self) -> "_Launch":
        return self

    def __call__(self, stream_ptr: int, captured: bool = False) -> None:
        if self.ex.broken:
            raise CommunicatorBroken(f"this communicator stopped after an earlier failure: {self.ex.broken}")
        if captured:
            self._captured(stream_ptr, self.captured_params_ptr, 0)
        else:
            self._eager(stream_ptr, self.params_ptr, 0)
            if self.counting is not None:
                self.counting[0].counted(stream_ptr, self.counting[1])


def most_blocks(fn, device, nlocal: int, what: str) -> int:
    """Blocks per rank a launch of `fn` (blocks of THREADS) on the small kernels' scratch may
    take, by the rule of kernels whose blocks wait on their namesakes on the other ranks: every
    block resident at once, and with virtual ranks at most half the GPU, so that another
    spinning launch fits."""
    cap = _blocks_per_sm(fn, THREADS, device) * device.attributes["MultiProcessorCount"]
    share = cap if nlocal == 1 else cap // (2 * nlocal)
    most = min(_SA["MAX_BLOCKS"], share)
    if most < 1:
        raise GC3Error(f"{what}: {nlocal} ranks' blocks of {THREADS} threads cannot all be resident on device "
                       f"{device.id} ({cap} at most)")
    return most


def kernel_refusal(dtype: str, dtypes, nranks: int, nlocal: int, does: str, alone: str) -> Optional[str]:
    """What every kernel whose blocks wait on their namesakes refuses (None if nothing): a type
    outside `dtypes` (the kernel `does` them), one rank (`alone` says why not), more ranks in
    one launch than its parameters hold."""
    if dtype not in dtypes:
        return f"dtype {dtype} (the kernel {does} {', '.join(dtypes)})"
    if nranks < 2:
        return f"a single rank: {alone}"
    if nlocal > MAX_LOCAL:
        return f"{nlocal} ranks in one process (at most {MAX_LOCAL})"
    return None


def _counting() -> bool:
    return settings.get("GC3_ORDER_COUNT")


def kernel_params(args: ctypes.Structure) -> Tuple[object, int]:
    """The driver's parameter array for a launch whose parameters are the fields of `args`, in
    order (the addresses of the fields, which the driver copies at each launch), and its address."""
    base = ctypes.addressof(args)
    params = (ctypes.c_void_p * len(args._fields_))(*(base + getattr(type(args), name).offset
                                                      for name, _ in args._fields_))
    return params, ctypes.addressof(params)


class SmallExecutor:
    """What the drop-in reaches through `group.executor`: the stream order, the
    per-call address tables, and the error record in the scratch header."""
    buffer_table = Executor.buffer_table   # the same cached, stream-ordered upload
    _captured_table, _reserve_arena = Executor._captured_table, Executor._reserve_arena
    _raise_recorded = Executor._raise_recorded

    def __init__(self, header, ranks: Sequence[int], timeout: float):
        import cupy

        self.cupy = cupy
        self.device = cupy.cuda.Device()
        self.header = header            # uint64 words [0, GC3_SA_COUNTERS) of the first local rank
        self.ranks = list(ranks)
        self.timeout = timeout
        self.order = StreamOrder()
        self.broken: Optional[str] = None
        self._bufs: Dict[Tuple[int, ...], object] = {}

    def check(self, synchronize: bool = True) -> None:
        """Raise RuntimeTimeoutError if a wait of any launch so far gave up."""
        if synchronize:
            self.device.synchronize()
        words = self.header.get()
        err = words[_SA["ERR"]:_SA["ERR"] + abi.ERR_NFIELDS // 2].view(np.int32)
        abort = int(words[_SA["ABORT"]:_SA["ABORT"] + 1].view(np.int32)[0])
        self._raise_recorded(err, abort)

    def describe_error(self, err: np.ndarray) -> str:
        f = lambda name: int(err[abi.field("ERR", name)])  # noqa: E731
        seen, want = f("SEEN_LO") & 0xFFFFFFFF, f("WANT_LO") & 0xFFFFFFFF
        if f("KIND") == abi.C["GC3_WAIT_SLICE"]:
            seen |= (f("SEEN_HI") & 0xFFFFFFFF) << 32
            want |= (f("WANT_HI") & 0xFFFFFFFF) << 32
            return (f"GPU wait timed out after {self.timeout:g} s (GC3_TIMEOUT_S) in gemv + allreduce: rank "
                    f"{f('RANK')} block {f('TB')} waited for block {f('A')} of the same rank to finish split-K "
                    f"slice {f('B')} of column tile {f('TILE')} (its last call {seen}, this call {want})")
        return (f"GPU wait timed out after {self.timeout:g} s (GC3_TIMEOUT_S) in the small-message allreduce: "
                f"rank {f('RANK')} block {f('TB')}, {_PHASES.get(f('STEP'), 'phase ' + str(f('STEP')))}: "
                f"waiting for line {f('TILE')} from rank {f('A')} (its flag {seen}, expected {want}; "
                f"did every rank make the same call?)")


class SmallAllreduce:
    """Both small-message kernels for the ranks this process runs (`ranks`),
    over scratch already allocated, zeroed and mapped (use `ipc` or `virtual`)."""

    def __init__(self, nranks: int, ranks: Sequence[int], bases: Sequence[Sequence[int]], header,
                 abort_peers: Sequence[int], timeout: Optional[float], keep=(),
                 max_bytes: int = limits.SMALL_ALLREDUCE_DEFAULT_BYTES):
        import cupy

        if not 1 <= nranks <= limits.MAX_RANKS:
            raise GC3Error(f"small allreduce: {nranks} ranks (1..{limits.MAX_RANKS} supported)")
        if list(ranks) != list(range(ranks[0], ranks[0] + len(ranks))):
            raise GC3Error(f"small allreduce: the ranks of one launch must be consecutive, got {list(ranks)}")
        self.cupy = cupy
        self.nranks = nranks
        self._ranks = list(ranks)
        self.max_bytes = max_bytes
        self.max_lines, self.region_lines, self.extra_offset = scratch_shape(nranks, self.max_bytes)
        self._keep = keep
        self.executor = ex = SmallExecutor(header, ranks, gpu_wait_timeout_s(timeout))
        setup = streams.setup_stream()
        with streams.current(setup):
            self._peers = cupy.asarray(np.asarray(bases, dtype=np.uint64).reshape(-1))
            self._abort_peers = cupy.asarray(np.asarray(list(abort_peers) or [0], dtype=np.uint64))
            hdr = header.data.ptr
            plan = dict.fromkeys(abi.PLAN_FIELDS, 0)
            plan.update(err=hdr + 8 * _SA["ERR"], abort_local=hdr + 8 * _SA["ABORT"],
                        abort_peers=self._abort_peers.data.ptr, n_abort_peers=len(abort_peers),
                        timeout_ns=int(ex.timeout * 1e9))
            self._plan = cupy.asarray(np.array([plan[f] for f in abi.PLAN_FIELDS], dtype=np.uint64))
        setup.synchronize()
        self._blocks: Optional[int] = None
        self._fits: Dict[int, int] = {}
        self._prepared: Dict[tuple, _Launch] = {}
        self._epoch = 0   # bumped when _prepared is dropped: a Reissue of an older call is stale
        # Calls captured into a CUDA graph: a graph may be replayed at any
        # time, so what its launches address lives as long as the group.
        self._captured: Dict[int, _Launch] = {}

    @property
    def ranks(self) -> List[int]:
        return self._ranks

    # -- set-up ----------------------------------------------------------------------
    @classmethod
    def virtual(cls, nranks: int, timeout: Optional[float] = None,
                max_bytes: int = limits.SMALL_ALLREDUCE_DEFAULT_BYTES, extra_bytes: int = 0) -> "SmallAllreduce":
        """Every rank in this process, on the current GPU, each with its own scratch
        for calls of up to `max_bytes` (and `extra_bytes` more after it, zeroed, for a
        kernel of its own on the same peers: extra_offset says where they start)."""
        nbytes = scratch_shape(nranks, max_bytes)[2] + extra_bytes
        scratch = [streams.setup_zeros(nbytes // 8, "uint64") for _ in range(nranks)]
        row = [s.data.ptr for s in scratch]
        return cls(nranks, range(nranks), [row] * nranks, scratch[0][:_SA["COUNTERS"]], (), timeout, keep=scratch,
                   max_bytes=max_bytes)

    @classmethod
    def ipc(cls, comm, device: Optional[int] = None, timeout: Optional[float] = None,
            max_bytes: int = limits.SMALL_ALLREDUCE_DEFAULT_BYTES, extra_bytes: int = 0) -> "SmallAllreduce":
        """This process's rank of `comm` (mpi4py-like: rank, size, allgather,
        Barrier); the peers' scratch, sized for calls of up to `max_bytes` (and
        `extra_bytes` more, as in `virtual`), mapped once through CUDA IPC.
        Collective: every rank passes the same `max_bytes` and `extra_bytes`."""
        import cupy

        from .ipc import _RawBuffer, agree, open_peers

        rank, nranks = comm.rank, comm.size
        own: List[_RawBuffer] = []
        opened: List[int] = []

        def release(between=lambda: None) -> None:
            for p in opened:
                cupy.cuda.runtime.ipcCloseMemHandle(p)
            opened.clear()
            between()
            for b in own:
                b.free()

        failure, handle = None, None
        try:
            ndev = cupy.cuda.runtime.getDeviceCount()
            cupy.cuda.Device(device if device is not None else rank % ndev).use()
            own.append(_RawBuffer(scratch_shape(nranks, max_bytes)[2] + extra_bytes))
            handle = [cupy.cuda.runtime.ipcGetMemHandle(own[0].ptr)]
            streams.setup_stream().synchronize()    # zeroed before any peer can write into it
        except Exception as exc:  # reported to every rank below, then raised everywhere
            failure = f"rank {rank}: {type(exc).__name__}: {exc}"
        handles = agree(comm.allgather((failure, handle)), "small allreduce", "allocating its scratch", release)
        failure, group = None, None
        try:
            bases = open_peers(handles, rank, own, opened)
            row = [bases[r][0] for r in range(nranks)]
            aborts = [row[r] + 8 * _SA["ABORT"] for r in range(nranks) if r != rank]
            group = cls(nranks, [rank], [row], own[0].array(cupy.uint64, _SA["COUNTERS"]), aborts, timeout,
                        keep=own, max_bytes=max_bytes)
            group._comm, group._release = comm, release
        except Exception as exc:
            failure = f"rank {rank}: {type(exc).__name__}: {exc}"
        agree(comm.allgather((failure, None)), "small allreduce", "mapping its peers' scratch", release)
        return group

    def _grid(self, fn) -> int:
        """Most blocks per rank a call may launch: every block of every rank in
        the launch must be resident at once (each spins on lines that other blocks
        write), and at most half the GPU's resident blocks go to one launch: a
        launch that needs them all could wait, spinning, for blocks that another
        spinning kernel on another stream keeps out (virtual ranks, where every
        rank's blocks share one GPU)."""
        if self._blocks is None:
            dev = self.executor.device
            cap = _blocks_per_sm(fn, THREADS, dev) * dev.attributes["MultiProcessorCount"]
            blocks = min(BLOCKS, _SA["MAX_BLOCKS"], cap // (2 * len(self._ranks)))
            if blocks < 1:
                raise LimitError(f"small allreduce: {len(self._ranks)} ranks' blocks of {THREADS} threads cannot "
                                 f"all be resident on device {dev.id} ({cap} at most)")
            self._blocks = blocks   # fixed for the group's life: the counters of this many blocks agree
        return self._blocks

    def _resident(self, fn) -> int:
        """Blocks per rank of `fn` that fit at once by the same rule as _grid: a build that holds
        more registers than the one _grid measured (the epilogue's, a cast's) launches fewer
        blocks, while grid_max (the counters every call keeps) stays the group's."""
        got = self._fits.get(fn.kernel.ptr)
        if got is None:
            dev = self.executor.device
            cap = _blocks_per_sm(fn, THREADS, dev) * dev.attributes["MultiProcessorCount"]
            got = self._fits[fn.kernel.ptr] = max(1, cap // (2 * len(self._ranks)))
        return got

    # -- calls -----------------------------------------------------------------------
    def _prepare(self, in_ptrs, out_ptrs, in_elems: int, dtype: str, op: str, kind: str, coll: str, stream: int,
                 captured: bool, epilogue: Optional[tuple] = None, out_dtype: Optional[str] = None) -> _Launch:
        n = len(self._ranks)
        if (coll, kind) not in KINDS:
            raise GC3Error(f"small-message kernels: none is {kind!r} for {coll} "
                           f"(have {', '.join(f'{c} {k}' for c, k in KINDS)})")
        if len(in_ptrs) != n or len(out_ptrs) != n:
            raise GC3Error(f"small {coll}: need {n} input and {n} output addresses (one per rank here), "
                           f"got {len(in_ptrs)} and {len(out_ptrs)}")
        why = refusal(dtype, op, in_elems, self.max_bytes, coll, self.nranks)
        if why:
            raise GC3Error(f"small {coll}: {why}")
        in_elems = block_elems(coll, in_elems, self.nranks)
        info = dtype_info(dtype)
        out = dtype_info(out_dtype).name if out_dtype is not None else info.name
        nbytes = in_elems * info.np.itemsize
        epw, keep = None, ()
        if epilogue is not None:
            why = epilogue_refusal(info.name, op, coll, out)
            if not why and len(epilogue) != n:
                why = f"need {n} ranks' epilogue words (one per rank here), got {len(epilogue)}"
            if not why and out != info.name:
                out_bytes = in_elems * dtype_info(out).np.itemsize
                if any(i < o + out_bytes and o < i + nbytes for i, o in zip(in_ptrs, out_ptrs)):
                    why = f"in place with a cast from {info.name} to {out} (the output's lines are not the input's)"
            if why:
                raise GC3Error(f"small {coll} with an epilogue: {why}")
            epw = self.executor.buffer_table(tuple(w for words in epilogue for w in words), stream, captured)
            keep = (epw,)
        elif out != info.name:
            raise GC3Error(f"small {coll}: output {out} differs from input {info.name}; only the epilogue build "
                           f"casts (epilogue=)")
        fn = kernel(info.name, op, self.executor.device.id, epilogue is not None, out, kind)
        io = self.executor.buffer_table(tuple(p for pair in zip(in_ptrs, out_ptrs) for p in pair), stream, captured)
        most = self._grid(fn)
        args = _Args(self._plan.data.ptr, self._peers.data.ptr, io.data.ptr, self.nranks, self._ranks[0],
                     in_elems, KINDS[coll, kind], self.max_lines, self.region_lines, most,
                     0 if epw is None else epw.data.ptr, self.executor.order.counter() if _counting() else 0)
        threads = settings.get("GC3_SMALL_THREADS") or limits.small_allreduce_threads(nbytes, most, kind)
        if limits.small_kernel_protocol(kind) == "LL128":
            threads = min(THREADS, -(-threads // 32) * 32)   # whole warps: 8 threads a line, converged
        grid = min(limits.small_allreduce_blocks(nbytes, most, threads, kind), self._resident(fn))
        return _Launch(self.executor, fn.kernel.ptr, grid, n, args, (io,) + keep, threads)

    def run_ptrs(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                 stream=None, kind: str = "oneshot", coll: str = "allreduce", epilogue: Optional[Sequence] = None,
                 out_dtype: Optional[str] = None) -> None:
        """Enqueue one `coll` (allreduce by default) of `in_elems` input elements per
        rank on raw device addresses (one per rank of the group), on `stream`; a
        capturing stream captures it.  Everything but the launch is cached per call.
        `epilogue`: per rank its GC3_EPW_* words (runtime_cuda.core.tables.pack_epilogue), applied
        at the final store, which holds `out_dtype` (default: dtype)."""
        ptr = streams.handle(stream)
        captured = streams.is_capturing(ptr)
        self.executor.order.enter(ptr, captured)
        epi = None if epilogue is None else tuple(tuple(w) for w in epilogue)
        key = (tuple(in_ptrs), tuple(out_ptrs), in_elems, dtype, op, kind, coll, epi, out_dtype)
        call = self._prepared.get(key)
        if call is None:
            if len(self._prepared) >= PREPARED_CALLS_MAX:
                self.executor.order.retire(self._prepared)
                self._prepared = {}
                self._epoch += 1
            call = self._prepared[key] = self._prepare(in_ptrs, out_ptrs, in_elems, dtype, op, kind, coll, ptr,
                                                       captured, epi, out_dtype)
        if captured:
            self._captured[id(call)] = call
        call(ptr)
        order = self.executor.order
        if captured or call.counting is None or call.counting[0] is not order:   # else the count marked it
            order.leave(ptr, captured)

    def reissue(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                kind: str = "oneshot", coll: str = "allreduce"):
        """The drop-in's repeat path (runtime_cuda.core.group.Reissue) for a call run_ptrs made, or None."""
        from ..core.group import Reissue

        call = self._prepared.get((tuple(in_ptrs), tuple(out_ptrs), in_elems, dtype, op, kind, coll, None, None))
        return None if call is None else Reissue(self, call)

    def __call__(self, inputs: Sequence, outputs: Sequence, op: str = "sum", dtype: Optional[str] = None,
                 stream=None, kind: str = "oneshot", coll: str = "allreduce") -> List:
        """Enqueue one `coll` on cupy arrays, one per rank here (bfloat16 travels as uint16: name it)."""
        self.run_ptrs([a.data.ptr for a in inputs], [a.data.ptr for a in outputs], inputs[0].size,
                      dtype_info(dtype or inputs[0].dtype).name, op, stream, kind, coll)
        return list(outputs)

    def check(self) -> None:
        self.executor.check()

    def close(self) -> None:
        release = getattr(self, "_release", None)
        if release is None:
            return
        self.cupy.cuda.Device().synchronize()
        self._comm.Barrier()
        release(between=self._comm.Barrier)   # no peer still maps our scratch when we free it
        self._release = None
