"""Chunk flags of the GEMM fusions, and the watchdog that keeps their waits
from hanging.

A flag is a 32-bit word holding an epoch (the how-many-th call of one
operator shape), so flags are never reset: a wait asks for "at least epoch
e" with a wrap-around compare.

* release(stream, flag, e): written by the stream once all work queued
  before it is done.  Two ways, chosen by `release_backend()`: the driver's
  stream memory operation `cuStreamWriteValue32` (package cuda-bindings;
  no kernel launch) or a one-thread kernel.  GC3_FUSED_RELEASE=driver|kernel
  forces one (the benchmark measures both).
* wait(stream, flag, e): holds the stream until the flag reaches e.  By
  default a one-thread kernel that spins with a device-side deadline
  (GC3_FUSED_TIMEOUT seconds): when it passes, the kernel records which
  wait it was and returns, and every later wait of this process returns at
  once, so the streams drain and nothing hangs, even under
  CUDA_DEVICE_MAX_CONNECTIONS=1, where a blocked stream would hold back the
  very work that releases it.  GC3_FUSED_WAIT=driver uses
  `cuStreamWaitValue32` instead, which cannot time out by itself: there the
  watchdog thread, once the deadline passes, prints which wait is stuck and
  ends the process (exit status 3), since the stream can never drain.

The watchdog names flag, chunk and rank of the wait that failed; an
operator checks it at every call and `Watchdog.synchronize` raises it.

`Trace` (opt-in: GC3_FUSED_TRACE=1 or trace=True on the group) stamps
%globaltimer on the streams at the points that show whether a call overlaps:
each GEMM chunk's end, each transfer's start and end.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from collections import deque
from typing import Deque, List, NamedTuple, Optional, Tuple

from gc3.errors import GC3Error, InputError, RuntimeTimeoutError
from gc3 import settings
from runtime_cuda.core import cudadriver, streams
from runtime_cuda.core.stuck import end_process

DEFAULT_TIMEOUT_S = settings.default("GC3_FUSED_TIMEOUT")
KERNELS = ("gc3_flag_release", "gc3_flag_wait", "gc3_spin_ns", "gc3_stamp", "gc3_sum_round")


@functools.lru_cache(maxsize=None)
def _kernels(device: int):
    import cupy

    from ..core import module

    mod = cupy.RawModule(code=module.source("fused_gemm.cu"), options=("-std=c++17",))
    return {name: mod.get_function(name) for name in KERNELS}


def kernel(name: str):
    """One of KERNELS (kernels/fused_gemm.cu), built for the current device."""
    import cupy

    return _kernels(cupy.cuda.runtime.getDevice())[name]


def _choice(var: str, env) -> Optional[str]:
    raw = settings.get(var, env)
    if raw == "driver" and cudadriver.driver() is None:
        raise InputError(f"{var}=driver, but cuda.bindings does not import here or finds no CUDA driver "
                         "(pip package cuda-bindings)")
    return raw


def release_backend(env=None) -> str:
    """How flags are released: 'driver' (cuStreamWriteValue32) where
    cuda.bindings imports and finds a driver, else 'kernel'; GC3_FUSED_RELEASE overrides."""
    return _choice("GC3_FUSED_RELEASE", env) or ("driver" if cudadriver.driver() is not None else "kernel")


def wait_backend(env=None) -> str:
    """How streams wait for flags: 'kernel' (self-timing spin) unless GC3_FUSED_WAIT=driver."""
    return _choice("GC3_FUSED_WAIT", env) or "kernel"


def trace_enabled(env=None) -> bool:
    return settings.get("GC3_FUSED_TRACE", env)


def flag_wait_timeout_s(env=None) -> float:
    """How long a fused operator's stream waits for a peer's flag before it reports a hang."""
    return settings.get("GC3_FUSED_TIMEOUT", env)


def release(stream: int, flag: int, value: int, backend: str) -> None:
    """Queue on `stream`: flag := value, after the work queued before it."""
    value &= 0xFFFFFFFF
    if backend == "driver":
        cudadriver.write_value32(stream, flag, value)
        return
    import numpy as np

    kernel("gc3_flag_release")((1,), (1,), (np.uint64(flag), np.uint32(value)), stream=streams.wrap(stream))


def spin(stream: int, seconds: float) -> None:
    """Queue a kernel that keeps `stream` busy for `seconds` (tests and
    benchmarks use it to make one rank late)."""
    import numpy as np

    kernel("gc3_spin_ns")((1,), (1,), (np.uint64(int(seconds * 1e9)),), stream=streams.wrap(stream))


class Watchdog:
    """One per group of ranks driven by this process: issues the waits and
    turns one that never ends into RuntimeTimeoutError."""

    _RING = 1 << 16   # waits remembered for naming; older idents are reused

    def __init__(self, where: str, env=None):
        import cupy
        import numpy as np

        env = os.environ if env is None else env
        self.where = where
        self.timeout = flag_wait_timeout_s(env)
        self.release_backend = release_backend(env)
        self.wait_backend = wait_backend(env)
        # The failure word lives in pinned host memory, which the device reaches
        # by the same address (unified addressing): the host reads it without
        # queueing anything on a stream that might be blocked.
        self._pinned = cupy.cuda.alloc_pinned_memory(8)
        self._failed = np.frombuffer(self._pinned, dtype=np.int32, count=2)
        self._failed[:] = 0
        self.failed_ptr = self._pinned.ptr
        self._names: List[str] = [""] * self._RING
        self._next = 0
        self.failure: Optional[str] = None
        self._device = cupy.cuda.runtime.getDevice()
        # Driver-mode waits: (event, ident, issue time), checked by the thread.
        self._pending: Deque[Tuple[int, int, float]] = deque()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    # --- waits ------------------------------------------------------------
    def wait(self, stream: int, flag: int, value: int, what: str) -> None:
        """Queue on `stream`: hold until `flag` reaches epoch `value`; `what`
        names it (flag, chunk, rank) in the error if it never does."""
        import numpy as np

        ident = self.name(what)
        value &= 0xFFFFFFFF
        if self.wait_backend == "driver":
            cudadriver.wait_value32(stream, flag, value)
            self._track(stream, ident)
            return
        kernel("gc3_flag_wait")((1,), (1,), (np.uint64(flag), np.uint32(value),
                                              np.uint64(int(self.timeout * 1e9)), np.uint64(self.failed_ptr),
                                              np.int32(ident)), stream=streams.wrap(stream))

    def name(self, what: str) -> int:
        """The ident a wait stores into the failure word when it gives up, naming `what`."""
        self._next = self._next % (self._RING - 1) + 1   # ident 0 means "no failure"
        self._names[self._next] = what
        return self._next

    def release(self, stream: int, flag: int, value: int) -> None:
        release(stream, flag, value, self.release_backend)

    # --- failure ----------------------------------------------------------
    def _describe(self, ident: int, how: str) -> str:
        return (f"{self.where}: {how} after {self.timeout:g} s (GC3_FUSED_TIMEOUT) waiting for {self._names[ident]}; "
                "a peer rank is missing, late, or failed earlier")

    def check(self) -> None:
        """Raise RuntimeTimeoutError if any wait of this group has failed."""
        if self.failure is None:
            ident = int(self._failed[0])
            if ident:
                self.failure = self._describe(ident, "gave up")
        if self.failure is not None:
            raise RuntimeTimeoutError(self.failure)

    def synchronize(self, events) -> None:
        """Wait (host) for `events` (raw event handles), raising the watchdog's
        error as soon as a wait fails instead of blocking forever."""
        import cupy

        rt = cupy.cuda.runtime
        deadline = time.monotonic() + self.timeout + 5.0
        for ev in events:
            while True:
                self.check()
                try:
                    if rt.eventQuery(ev) in (0, None):
                        break
                except rt.CUDARuntimeError as exc:
                    if getattr(exc, "status", None) != 600:   # cudaErrorNotReady
                        raise
                if time.monotonic() > deadline:
                    raise RuntimeTimeoutError(f"{self.where}: the GPU work of a call did not finish within "
                                              f"{self.timeout:g} s (GC3_FUSED_TIMEOUT) + 5 s, and no wait reported")
                time.sleep(0.0005)
        self.check()

    # --- the thread (driver-mode waits only) --------------------------------
    def _track(self, stream: int, ident: int) -> None:
        import cupy

        rt = cupy.cuda.runtime
        ev = rt.eventCreateWithFlags(rt.eventDisableTiming)
        rt.eventRecord(ev, stream)
        with self._lock:
            self._pending.append((ev, ident, time.monotonic()))
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name=f"gc3-fused-watchdog {self.where}", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        import cupy

        rt = cupy.cuda.runtime
        rt.setDevice(self._device)
        while True:
            time.sleep(0.01)
            with self._lock:
                if not self._pending:
                    continue
                ev, ident, since = self._pending[0]
            try:
                done = rt.eventQuery(ev) in (0, None)
            except rt.CUDARuntimeError:
                done = False
            if done:
                with self._lock:
                    self._pending.popleft()
                rt.eventDestroy(ev)
            elif time.monotonic() - since > self.timeout:
                # cuStreamWaitValue32 never returns: the stream cannot drain and
                # every host synchronization would block, so end the process.
                msg = self._describe(ident, "stuck (cuStreamWaitValue32)")
                end_process(f"gc3 fused watchdog: {msg}; ending the process", stacks=False)


class Stamp(NamedTuple):
    rank: int     # the rank whose stream took the stamp
    what: str     # "gemm end", "transfer start", "transfer end"
    chunk: str    # which chunk, in the words of the watchdog's messages
    peer: int     # a transfer's destination; for a GEMM, the rank itself
    ns: int       # %globaltimer when the stream reached the stamp (0: never reached)


class Trace:
    """Device timestamps of the last call of a group: a one-thread kernel per
    stamp writes %globaltimer into pinned host memory, so reading them takes
    no copy once the call is synchronized."""

    SLOTS = 1 << 14

    def __init__(self):
        import cupy
        import numpy as np

        self._pinned = cupy.cuda.alloc_pinned_memory(8 * self.SLOTS)
        self._ns = np.frombuffer(self._pinned, dtype=np.uint64, count=self.SLOTS)
        self._ns[:] = 0
        self._labels: List[Tuple[int, str, str, int]] = []

    def clear(self) -> None:
        """Start a new call's record; the caller has waited for the previous
        call's end, so none of its stamps can land in a slot handed out again."""
        self._ns[:len(self._labels)] = 0
        self._labels = []

    def stamp(self, stream: int, rank: int, what: str, chunk: str, peer: int) -> None:
        import numpy as np

        i = len(self._labels)
        if i >= self.SLOTS:
            raise GC3Error(f"GC3_FUSED_TRACE: one call took more than {self.SLOTS} stamps")
        self._labels.append((rank, what, chunk, peer))
        kernel("gc3_stamp")((1,), (1,), (np.uint64(self._pinned.ptr + 8 * i),), stream=streams.wrap(stream))

    def stamps(self) -> List[Stamp]:
        """The last call's stamps in issue order; synchronize the group first."""
        return [Stamp(*label, int(self._ns[i])) for i, label in enumerate(self._labels)]

    def times(self, what: str, rank: Optional[int] = None, peer: Optional[int] = None) -> List[int]:
        """The ns of the last call's `what` stamps (of `rank`'s streams, about `peer`, where given)."""
        got = [s for s in self.stamps() if s.what == what and rank in (None, s.rank) and peer in (None, s.peer)]
        missed = [s for s in got if not s.ns]
        if missed:
            raise GC3Error(f"GC3_FUSED_TRACE: {len(missed)} '{what}' stamps never reached, first rank "
                           f"{missed[0].rank} {missed[0].chunk}: synchronize the group before reading the trace")
        if not got:
            raise GC3Error(f"GC3_FUSED_TRACE: the last call took no '{what}' stamp"
                           + (f" on rank {rank}" if rank is not None else "")
                           + (f" about peer {peer}" if peer is not None else ""))
        return [s.ns for s in got]

    def format(self) -> str:
        got = self.stamps()
        t0 = min((s.ns for s in got if s.ns), default=0)
        return "\n".join(f"rank {s.rank} {s.what:<14} {s.chunk:<22} peer {s.peer}  "
                         + (f"{(s.ns - t0) / 1e3:10.1f} us" if s.ns else "never reached") for s in got)
