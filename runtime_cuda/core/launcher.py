"""One launch group on one GPU: its tables and plan on the device, the
co-residency check, the launch, and turning the kernel's error record into
gc3.errors.RuntimeTimeoutError.

The per-call host path is a dictionary lookup and one driver call: the
plan, tables and kernel are built once, and each call shape's arguments are
packed once (`Launch`); the launch count lives on the device (each block's
row, block_rows.py), so the arguments never change and a call can be
captured in a CUDA graph.
"""
from __future__ import annotations

import ctypes
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from gc3 import settings

from gc3.errors import GC3Error, LimitError, RuntimeTimeoutError

from . import abi, cudadriver, faults, module, streams
from .binding import Shape
from . import block_rows
from .connections import CONTROL_ABORT, CONTROL_ERR, CONTROL_FLAGS, nslots, slot_bytes
from .streams import StreamOrder
from .tables import Tables

DEFAULT_TIMEOUT_S = settings.default("GC3_TIMEOUT_S")


def _cache_entries(default: int) -> int:
    """How many entries a per-group cache (prepared calls, buffer tables) holds
    before it is retired whole.  GC3_CACHE_ENTRIES lowers every such limit: a
    stress run (the fuzz's mutation test) then goes through the retire path
    every few calls instead of once in hundreds, so a bug there shows."""
    lower = settings.get("GC3_CACHE_ENTRIES")
    return default if lower is None else min(default, lower)


PREPARED_CALLS_MAX = _cache_entries(1024)   # call shapes a group keeps packed
BUFFER_TABLES_MAX = _cache_entries(256)     # per-call address tables an executor keeps on the device
CAPTURED_TABLE_WORDS = 8192                 # addresses of the calls an executor's CUDA graphs hold (64 KiB)


def runtime_protocol(xml_proto: str, override: Optional[str] = None) -> str:
    """The protocol a program runs with: the XML's, or `override`; never a
    substitute -- one the kernel does not implement is an error."""
    p = override or xml_proto
    if p not in abi.PROTO:
        raise GC3Error(f"protocol {p!r} is not implemented by the CUDA runtime; it runs {', '.join(abi.PROTO)}")
    return p


def gpu_wait_timeout_s(value: Optional[float] = None) -> float:
    """How long a collective kernel waits for a peer before it reports a hang: `value`, else GC3_TIMEOUT_S."""
    return float(value) if value is not None else settings.get("GC3_TIMEOUT_S")


class CommunicatorBroken(GC3Error):
    """A call after a timeout: the FIFO counters no longer agree, so the group must be rebuilt."""


class _Args(ctypes.Structure):
    """The kernel's parameters, in gc3_interpreter's order."""
    _fields_ = [("plan", ctypes.c_uint64), ("rows", ctypes.c_uint64), ("row_words", ctypes.c_int32),
                ("bufs", ctypes.c_uint64), ("nbufs", ctypes.c_int32), ("abort_word", ctypes.c_uint64),
                ("unit", ctypes.c_int64), ("cs", ctypes.c_int64), ("cpb", ctypes.c_int32), ("T", ctypes.c_int32),
                ("ntiles", ctypes.c_int32)]


class Launch:
    """One call shape of one executor, ready to go: the parameter block is
    packed once and every call is a single driver launch on a stream."""
    __slots__ = ("ex", "fn", "grid", "block", "coop", "args", "params", "params_ptr", "keep", "head", "_driver",
                 "_plain", "_coop")

    def __init__(self, ex: "Executor", k, nt: int, coop: bool, bufs, shape: Shape):
        from cupy_backends.cuda.api import driver

        self.ex = ex
        self.fn = k.kernel.ptr
        self.grid, self.block, self.coop = ex.tables.nblocks, nt, coop
        # A fused call's table goes on past GC3_MAX_BUFS (the compute inputs, read from global
        # memory); the kernel copies only the i/o/s entries into shared memory.
        nbufs = min(bufs.size, abi.C["GC3_MAX_BUFS"])
        self.args = _Args(ex.plan.data.ptr, ex.rows.data.ptr, ex.row_words, bufs.data.ptr, nbufs,
                          ex.abort_word, shape.unit, shape.cs, shape.cpb, shape.T, shape.ntiles)
        base = ctypes.addressof(self.args)
        self.params = (ctypes.c_void_p * len(_Args._fields_))(
            *(base + getattr(_Args, name).offset for name, _ in _Args._fields_))
        self.params_ptr = ctypes.addressof(self.params)
        self.keep = bufs   # the buffer table must outlive every queued launch
        self.bind(driver)

    def bind(self, driver) -> None:
        """Fix the driver calls' leading arguments (function, grid, block, no dynamic
        shared memory) once: a call then passes only the stream and parameters."""
        # The driver's leading arguments (function, grid x/y/z, block x/y/z, shared bytes), as
        # every launch object has them: a bare launch of the same kernel (runtime_cuda/benchmarks/host_time.py).
        self.head = head = (self.fn, self.grid, 1, 1, self.block, 1, 1, 0)
        self._driver = driver
        self._plain = partial(driver.launchKernel, *head)
        self._coop = None
        if self.coop:
            # Every bound launch takes (stream, params, extra); the driver's cooperative launch has no
            # `extra`.
            coop = partial(driver.launchCooperativeKernel, *head)
            self._coop = lambda stream, params, extra=0: coop(stream, params)

    def driver_calls(self):
        """(the launch a captured call takes, the one an eager call takes where it differs or
        None, parameter block address): the bound driver calls, both taking (stream, params, 0),
        for a repeat path that issues them itself (group.Reissue).  Here a capture takes a plain
        launch and an eager call the cooperative one."""
        return self._plain, self._coop, self.params_ptr

    def __call__(self, stream_ptr: int, captured: bool = False) -> None:
        """`captured`: the stream is capturing a graph; the launch goes in as a
        plain kernel node (every block is co-resident by the occupancy check
        of Executor._threads, so the cooperative guarantee adds nothing, and a
        plain node captures on every driver)."""
        if self.ex.broken:
            raise CommunicatorBroken(f"this communicator stopped after an earlier failure: {self.ex.broken}")
        try:
            if self._coop is None or captured:
                self._plain(stream_ptr, self.params_ptr, 0)
            else:
                self._coop(stream_ptr, self.params_ptr, 0)
        except self._driver.CUDADriverError as exc:
            if "COOPERATIVE_LAUNCH_TOO_LARGE" in str(exc):
                t = self.ex.tables
                raise LimitError(f"{t.prog.name}: {t.nblocks} blocks of {self.block} threads cannot be co-resident "
                                 f"on device {self.ex.device.id} (cooperative launch refused)") from None
            raise


def pdl_launch(head: tuple, device) -> Optional[Callable[[int, int, int], None]]:
    """A launch of `head` (function, grid x/y/z, block x/y/z, shared bytes) marked for
    programmatic dependent launch, as the callable (stream, params, 0) that CuPy's
    driver.launchKernel bound to `head` is, raising CuPy's CUDADriverError as it does.
    None where it cannot be marked: GC3_PDL=0, a device below sm_90 (no griddepcontrol),
    no cuda.bindings (CuPy's launch takes no attributes), or a driver older than CUDA 12.3
    (which cannot capture a marked launch).  Only a kernel that passes
    grid_dependency_wait (sync.cuh) before touching memory may be launched so: the mark
    lets it start before the previous kernel on the stream has finished."""
    if not settings.get("GC3_PDL") or int(device.compute_capability) < 90:
        return None
    cb = cudadriver.driver(12030)   # a driver that can capture a marked launch
    if cb is None:
        return None
    from cupy_backends.cuda.api.driver import CUDADriverError

    fn = cb.CUfunction(head[0])
    attr = cb.CUlaunchAttribute()
    attr.id = cb.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    ok = cb.CUresult.CUDA_SUCCESS
    configs: Dict[int, object] = {}   # one per stream: a call sets nothing but picks its stream's

    def config(stream: int):
        if len(configs) >= 64:
            configs.clear()
        c = cb.CUlaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ, c.sharedMemBytes = head[1:]
        c.hStream = cb.CUstream(stream)
        c.attrs = [attr]
        c.numAttrs = 1
        configs[stream] = c
        return c

    def launch(stream: int, params: int, extra: int = 0) -> None:
        err, = cb.cuLaunchKernelEx(configs.get(stream) or config(stream), fn, params, 0)
        if err != ok:
            raise CUDADriverError(int(err))
    return launch


def bound_launches(head: tuple, device) -> Tuple[Callable[[int, int, int], None], Callable[[int, int, int], None]]:
    """(the launch a captured call takes, the one an eager call takes) of a kernel that passes
    grid_dependency_wait first, both taking (stream, params, 0): the captured one marked for
    programmatic dependent launch where pdl_launch can (a graph's back-to-back calls then lose
    most of their launch latency), the eager one CuPy's plain launch (an eager call is bound by
    the host, and cuda.bindings' launch costs more host time than CuPy's)."""
    from cupy_backends.cuda.api import driver

    plain = partial(driver.launchKernel, *head)
    return pdl_launch(head, device) or plain, plain


class Executor:
    def __init__(self, t: Tables, proto: str, send_records: np.ndarray, recv_records: np.ndarray,
                 control, abort_peers: Sequence[int] = (), timeout: Optional[float] = None):
        import cupy

        self.cupy = cupy
        self.tables = t
        self.proto = proto
        self.timeout = gpu_wait_timeout_s(timeout)
        self.device = cupy.cuda.Device()
        self.control = control
        self.order = StreamOrder(fault=faults.active("stream-order"))
        br = block_rows.build(t, send_records, recv_records)
        # Uploaded on the private set-up stream and synchronized alone: the
        # tables must be in place before a launch on any stream reads them, and
        # the caller's streams may hold kernels that wait for peers.
        setup = streams.setup_stream()
        with streams.current(setup):
            self.rows = cupy.asarray(br.rows)         # the kernel stores each block's state back into it
            self.row_words = br.row_words
            self._keep = [cupy.asarray(a) for a in (br.cold, t.deps, t.extras)]
            self._abort_peers = cupy.asarray(np.asarray(list(abort_peers) or [0], dtype=np.uint64))
            ptr = {name: a.data.ptr for name, a in zip(("cold", "deps", "extras"), self._keep)}
            base = control.data.ptr
            self.abort_word = base + 8 * CONTROL_ABORT
            self.trace_on = module.trace_enabled()
            self._trace = (cupy.zeros(t.nblocks * abi.C["GC3_TRACE_WORDS"], dtype=cupy.uint64)
                           if self.trace_on else None)
            ptr.update(flags=base + 8 * CONTROL_FLAGS, err=base + 8 * CONTROL_ERR, abort_local=self.abort_word,
                       abort_peers=self._abort_peers.data.ptr, n_abort_peers=len(abort_peers),
                       timeout_ns=int(self.timeout * 1e9), nslots=nslots(proto), slot_bytes=slot_bytes(proto),
                       trace=self._trace.data.ptr if self._trace is not None else 0)
            self.plan = cupy.asarray(np.array([ptr[f] for f in abi.PLAN_FIELDS], dtype=np.uint64))
        setup.synchronize()
        self.broken: Optional[str] = None
        self._kernels: Dict[Tuple[str, str], Tuple[object, int, bool]] = {}
        self._bufs: Dict[Tuple[int, ...], object] = {}

    # -- kernels --------------------------------------------------------
    def kernel(self, dtype: str, op: str):
        key = (dtype, op)
        if key not in self._kernels:
            coop = module.cooperative_default()
            prog = self.tables.prog
            k = module.kernel(dtype, op, self.proto, self.device.id, coop, self.trace_on, prog.fused,
                              prog.epilogue is not None)
            self._kernels[key] = (k, self._threads(k), coop)
        return self._kernels[key]

    def _threads(self, k) -> int:
        """The largest block size at which every block of the group is co-resident."""
        nblocks = self.tables.nblocks
        sms = self.device.attributes["MultiProcessorCount"]
        per_sm = 0
        for nt in (module.MAX_THREADS, 256, 128):
            per_sm = _blocks_per_sm(k, nt, self.device)
            if per_sm * sms >= nblocks:
                return nt
        raise LimitError(
            f"{self.tables.prog.name}: {nblocks} threadblocks in one launch cannot all be co-resident on "
            f"{self.device.id} ({sms} SMs x {per_sm} blocks of 128 threads); every TB spins on others, "
            f"so the runtime refuses to launch (use fewer virtual ranks or TBs)")

    # -- calls ----------------------------------------------------------
    def buffer_table(self, ptrs: Tuple[int, ...], stream: int, captured: bool = False):
        """Device copy of the per-rank (i, o, s) addresses, cached by value.
        Allocated under and written on the launch stream (raw handle): a copy
        queued on another stream could still be pending when a kernel on this
        one reads it, and the pool must not hand the memory to work unordered
        with it.  Evicted tables are retired, not freed: queued launches may
        still read them.  While `stream` captures a graph, the table comes from
        the captured calls' arena (_captured_table)."""
        tab = self._bufs.get(ptrs)
        if tab is None:
            if not captured:
                self._reserve_arena()
            if len(self._bufs) >= BUFFER_TABLES_MAX:
                if faults.active("pool-stream"):
                    self._bufs.clear()
                else:
                    self.order.retire(self._bufs)
                    self._bufs = {}
            host = np.asarray(ptrs, dtype=np.uint64)
            if faults.active("pool-stream"):
                tab = self.cupy.asarray(host)
            else:
                tab = self._captured_table(host, stream) if captured else None
                s = streams.setup_stream() if captured else streams.wrap(stream)
                if tab is None:
                    with streams.current(s):
                        tab = self.cupy.empty(len(ptrs), dtype=self.cupy.uint64)
                    tab.set(host, stream=s)
                    if captured:
                        s.synchronize()
            self._bufs[ptrs] = tab
        return tab

    def _captured_table(self, host: np.ndarray, stream: int):
        """`host` in the arena that captured calls' tables come from (None before any eager call),
        copied by a node of the graph being captured on `stream`: from a pinned mirror that,
        like the arena, lives as long as this executor, so every replay copies the same
        addresses before its launch reads them.  A capture forbids cudaMalloc, copies from
        pageable memory and synchronizing (torch's default capture mode refuses them on every
        stream), so the arena and its mirror are allocated by the first eager call; a captured
        table is never handed out again."""
        arena = self.__dict__.get("_arena")
        n = host.size
        if arena is None:
            return None     # nothing ran eagerly yet: the capture then fails on the allocation it needs
        if self._arena_used + n > arena.size:
            raise LimitError(f"CUDA graph capture: the calls captured so far hold {self._arena_used} of the "
                             f"{arena.size} address words a launch group keeps for captured calls "
                             f"(launcher.CAPTURED_TABLE_WORDS); this call needs {n} more")
        lo, self._arena_used = self._arena_used, self._arena_used + n
        self._arena_host[lo:lo + n] = host
        rt = self.cupy.cuda.runtime
        # Also now, outside the graph, for an eager repeat of the same call (its prepared launch,
        # cached by address, holds this table): a few bytes, landed long before the capture ends.
        for s in (stream, streams.setup_stream().ptr):
            rt.memcpyAsync(arena.data.ptr + 8 * lo, self._arena_host.ctypes.data + 8 * lo, 8 * n,
                           rt.memcpyHostToDevice, s)
        return arena[lo:lo + n]

    def _reserve_arena(self) -> None:
        if self.__dict__.get("_arena") is None:
            with streams.current(streams.setup_stream()):
                self._arena = self.cupy.empty(CAPTURED_TABLE_WORDS, dtype=self.cupy.uint64)
            pinned = self.cupy.cuda.alloc_pinned_memory(8 * CAPTURED_TABLE_WORDS)
            self._arena_host = np.frombuffer(pinned, dtype=np.uint64, count=CAPTURED_TABLE_WORDS)
            self._arena_pinned = pinned
            self._arena_used = 0

    def prepare(self, dtype: str, op: str, bufs, shape: Shape) -> Optional[Launch]:
        """The launch of one call shape (None: nothing to do, an empty call)."""
        if shape.ntiles == 0:
            return None
        k, nt, coop = self.kernel(dtype, op)
        return Launch(self, k, nt, coop, bufs, shape)

    def launch(self, dtype: str, op: str, bufs, shape: Shape, stream=None) -> None:
        """One-off launch; the call path keeps `prepare`'s result instead."""
        if self.broken:
            raise CommunicatorBroken(f"this communicator stopped after an earlier failure: {self.broken}")
        go = self.prepare(dtype, op, bufs, shape)
        if go is not None:
            ptr = streams.handle(stream)
            self.order.enter(ptr)
            go(ptr)
            self.order.leave(ptr)

    def clear_trace(self) -> None:
        if self._trace is not None:
            self._trace.fill(0)

    def trace(self):
        """Per block, the %globaltimer stamps of the last call in a GC3_TRACE=1 build (ns; 0 = not reached)."""
        if self._trace is None:
            raise GC3Error("tracing is off: set GC3_TRACE=1 before the launch group is built")
        self.device.synchronize()
        return self._trace.get().reshape(self.tables.nblocks, abi.C["GC3_TRACE_WORDS"])

    def check(self, synchronize: bool = True) -> None:
        """Raise RuntimeTimeoutError if any wait of any launch so far gave up."""
        if synchronize:
            self.device.synchronize()
        err = self.control[CONTROL_ERR:CONTROL_FLAGS].get().view(np.int32)
        abort = int(self.control[CONTROL_ABORT:CONTROL_ABORT + 1].get().view(np.int32)[0])
        self._raise_recorded(err, abort)

    def _raise_recorded(self, err: np.ndarray, abort: int) -> None:
        """From an error record and an abort word read back: nothing if both are clear, else
        the communicator is broken from now on and RuntimeTimeoutError says where it waited."""
        if err[abi.field("ERR", "SET")] == 0 and not abort:
            return
        msg = self.describe_error(err) if err[abi.field("ERR", "SET")] else "a peer process gave up waiting"
        self.broken = msg
        raise RuntimeTimeoutError(msg)

    def describe_error(self, err: np.ndarray) -> str:
        f = lambda name: int(err[abi.field("ERR", name)])  # noqa: E731
        seen = (f("SEEN_HI") & 0xFFFFFFFF) << 32 | (f("SEEN_LO") & 0xFFFFFFFF)
        want = (f("WANT_HI") & 0xFFFFFFFF) << 32 | (f("WANT_LO") & 0xFFFFFFFF)
        kind, a, b = f("KIND"), f("A"), f("B")
        C = abi.C
        if kind == C["GC3_WAIT_DEP"]:
            what = (f"waiting for {self.tables.describe_step(a, b)} to finish the same tile "
                    f"(its progress flag {seen:#x}, needed {want:#x})")
        elif kind == C["GC3_WAIT_DATA"]:
            what = (f"waiting for data from rank {a} on channel {b}: received {want - 1} slots so far on this "
                    f"connection and the sender has filled {seen} (no matching send?)")
        elif kind == C["GC3_WAIT_CREDIT"]:
            what = (f"waiting for rank {a} to free a FIFO slot on channel {b} (it has consumed {seen}, "
                    f"{want} needed; no matching receive?)")
        elif kind == C["GC3_WAIT_LL"]:
            if self.proto == "LL":
                seen, want = seen & 0xFFFFFFFF, want & 0xFFFFFFFF
            what = (f"waiting for {self.proto} data from rank {a} on channel {b} (line flag {seen}, "
                    f"expected {want}; no matching send?)")
        else:
            what = f"unknown wait kind {kind}"
        op = abi.OPNAME.get(f("OP"), "?")
        return (f"GPU wait timed out after {self.timeout:g} s (GC3_TIMEOUT_S) in {self.tables.prog.name!r}: "
                f"rank {f('RANK')} TB {f('TB')} step {f('STEP')} ({op}), tile {f('TILE')}: {what}")


def _blocks_per_sm(k, nthreads: int, device) -> int:
    try:
        from cupy_backends.cuda.api import driver

        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(k.kernel.ptr, nthreads, 0))
    except Exception:  # older CuPy: estimate from the register count
        regs = max(int(k.num_regs), 1)
        per_block = -(-regs * nthreads // 256) * 256
        return max(0, min(65536 // per_block, 2048 // nthreads, 32))


def abort_words(controls: List) -> List[int]:
    return [c.data.ptr + 8 * CONTROL_ABORT for c in controls]
