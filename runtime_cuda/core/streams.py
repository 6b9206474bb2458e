"""How gc3 treats the caller's streams: the contract every entry point keeps.

1. Library code never enters a stream with `with stream:`.  In CuPy 14,
   `s.use()` does not push `s` on CuPy's stream stack, so leaving any `with`
   block makes the legacy default stream current and silently undoes a
   user's `s.use()`: their later uploads and elementwise work then race with
   the collectives they pass `s` to.  Where CuPy only offers "the current
   stream" (pool allocations, `cupy.asarray`), `current(s)` selects `s` and
   afterwards re-selects exactly what was current before.
2. Every device operation of a call (memset, table upload, copy, launch) is
   enqueued on the call's own stream, and memory it touches is allocated
   under that stream, so CuPy's pool hands it out again only to work ordered
   after the call on that stream.
3. One communicator's calls run in the order they were issued, whatever
   streams they arrive on (`StreamOrder.enter`): they share FIFOs, counters
   and scratch, and every rank must meet its peers' kernels in the same
   order.  Each call marks its stream's end after issuing (`StreamOrder.leave`:
   one event record, none on the default streams), and a call on another
   stream waits on that mark (one stream wait).  The next call never touches
   the previous call's stream, which its owner may have destroyed in between
   (a temporary CuPy stream).  Where the drop-in knows the stream's owner
   (CuPy's current Stream, `owner()`), it holds that object while the stream
   is the last one instead: the stream cannot be destroyed, and its end is
   marked once, at the switch.  Where the call is one launch of a kernel
   whose blocks each bump the order's device counter as they end
   (`StreamOrder.counter`, the small-message kernels), that bump is the
   mark: the host only adds the launch's block count to the total a switch
   waits for (`StreamOrder.counted`, one stream memory wait at the switch),
   and issues no event record.  A communicator's launch groups share its
   order, so a call marks at most once.  NCCL (2.14 on) orders a
   communicator's launches the same way, through a stream of its own, so a
   call routed to NCCL marks nothing either: only a later gc3 call on
   another stream must wait for it, which an NCCL operation on that stream
   does (`StreamOrder.bridge`, one byte sent to self).  Streams are known
   by their handles: a stream destroyed while a call on it is queued may
   hand its handle to the next stream made (seen on H200), which is then
   taken for the same stream and not ordered after it; NCCL alone orders
   its calls whatever the streams.
4. A buffer a queued launch may still read is never handed back to the pool
   at once: `StreamOrder.retire` keeps it until an event recorded after the
   last call has completed (no host synchronization; checked lazily).
5. Set-up work (zeroing FIFOs, uploading tables, rendezvous buffers) runs on
   a private non-blocking stream that is synchronized alone, never the whole
   device: another stream may hold kernels that wait for peers.
6. Calls made while the caller's stream is capturing a CUDA graph enqueue
   only the call's own copies and launch there; whatever a call needs once
   (scratch, buffer tables) is made on the set-up stream at capture time, and
   everything a captured call addresses is kept for the group's life (the
   graph may be replayed at any time).  The kernel's arguments never change
   and its counters live on the device, so each replay is a new call.  A
   capturing stream is never ordered against uncaptured work (CUDA refuses
   the dependency): the user orders a graph's launches, as with NCCL.
"""
from __future__ import annotations

import sys
import weakref
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Deque, Dict, Optional, Tuple

LEGACY_PTRS = (0, 1)   # 0: the null stream; 1: cudaStreamLegacy (the same stream)
PER_THREAD_PTR = 2     # cudaStreamPerThread
LASTING = frozenset(LEGACY_PTRS + (PER_THREAD_PTR,))   # streams as long-lived as the process
_NOT_READY = 600       # cudaErrorNotReady


_capture_status = None


def capture_query():
    """The runtime's cudaStreamIsCapturing as CuPy wraps it, bound once: called
    with a stream handle, it answers the capture status (0: not capturing;
    otherwise capturing, or a capture invalidated).  For a caller that binds it
    for every call (runtime_cuda.core.group.Reissue) and itself rules out the legacy
    stream, on which the query is an error while another stream captures."""
    global _capture_status
    if _capture_status is None:
        import cupy

        rt = cupy.cuda.runtime
        _capture_status = getattr(rt, "streamIsCapturing", None) or (
            lambda p: int(cupy.cuda.ExternalStream(p).is_capturing()))
    return _capture_status


def is_capturing(ptr: int) -> bool:
    """Whether the stream is capturing a CUDA graph (or its capture was
    invalidated); the legacy stream never captures.  One runtime call."""
    if ptr in LEGACY_PTRS:
        return False
    return capture_query()(ptr) != 0


def wrap(ptr: int):
    """A CuPy stream object for a raw stream handle (the null stream for 0)."""
    import cupy

    ptr = int(ptr)
    if ptr == 0:
        return cupy.cuda.Stream.null
    return cupy.cuda.ExternalStream(ptr)


@contextmanager
def current(stream):
    """Make `stream` CuPy's current stream inside the block, then re-select
    whatever was current before (not the stack bottom, as `with stream:` does)."""
    import cupy

    from . import faults

    if faults.active("stream-reset"):   # the old bug, on purpose: leaving `with` resets to the stack bottom
        with stream:  # GC3_FAULT=stream-reset keeps the old bug on purpose
            yield stream
        return
    prev = cupy.cuda.get_current_stream()
    stream.use()
    try:
        yield stream
    finally:
        prev.use()


_setup_streams: Dict[int, Any] = {}


def setup_stream():
    """This device's private non-blocking stream for set-up work."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    s = _setup_streams.get(dev)
    if s is None:
        s = _setup_streams[dev] = cupy.cuda.Stream(non_blocking=True)
    return s


def setup_zeros(count: int, dtype):
    """A zeroed CuPy array made on the set-up stream, which is synchronized alone: in place
    before any stream uses it, and no caller's stream touched."""
    import cupy

    setup = setup_stream()
    with current(setup):
        arr = cupy.zeros(count, dtype=dtype)
    setup.synchronize()
    return arr


class CudaEvents:
    """The event operations StreamOrder needs, on raw stream handles, the wait on its
    counter, and whether a stream is capturing a graph."""

    def __init__(self):
        import cupy

        self._rt = cupy.cuda.runtime
        self._flags = self._rt.eventDisableTiming

    def new(self) -> int:
        return self._rt.eventCreateWithFlags(self._flags)

    def record(self, event: int, stream: int) -> None:
        self._rt.eventRecord(event, stream)

    def wait(self, stream: int, event: int) -> None:
        self._rt.streamWaitEvent(stream, event, 0)

    def wait_value(self, stream: int, address: int, value: int) -> None:
        """`stream` holds until the 32-bit word at `address` reaches `value` (StreamOrder.counter)."""
        from . import cudadriver

        cudadriver.wait_value32(stream, address, value)

    def done(self, event: int) -> bool:
        # CuPy returns cudaErrorNotReady (600) as a status; be robust to a raise too.
        try:
            status = self._rt.eventQuery(event)
        except self._rt.CUDARuntimeError as exc:
            if getattr(exc, "status", None) == _NOT_READY:
                return False
            raise
        return status in (0, None)

    def destroy(self, event: int) -> None:
        self._rt.eventDestroy(event)

    def capturing(self, stream: int) -> bool:
        return is_capturing(stream)


class StreamOrder:
    """Issue order across streams for one communicator (or launch group), and
    deferred release of what its queued work may still use.  `events` is
    created on first need, so code paths that never change stream and never
    retire anything need no CUDA (the CPU tests rely on it)."""

    def __init__(self, events: Optional[Any] = None, fault: bool = False):
        self._events = events
        self._last: Optional[int] = None
        self._link: Optional[int] = None
        self._marked: Optional[int] = None   # the stream `_link` was last recorded on (leave, or a hand-over)
        self._graves: Deque[Tuple[int, Any]] = deque()
        self._spare: list = []
        self._for_graphs: list = []   # retired while the last stream was capturing: kept for good
        # What keeps the last stream alive (its owner, from leave()): while held, the stream
        # cannot be destroyed, so its end is marked at the next switch instead of per call.
        self._keeper: Any = None
        # GC3_FAULT=stream-order: skip the cross-stream wait, to show the fuzz catches it.
        self._fault = fault
        # The public fast-path state, kept current by every method that changes it: a repeat
        # reads these two fields instead of calling enter() or leave(), each a Python
        # call its host time would pay on every repeat.
        # ready: the stream on which enter() does nothing (the last one, nothing retired), or None.
        self.ready: Optional[int] = None
        # held: the stream on which leave() does nothing (the last one, its owner held or one of
        # the process's own streams), or None.
        self.held: Optional[int] = None
        # The device counter (a 32-bit word) that counting launches' blocks bump as they end,
        # allocated on first need; 0 where streams cannot wait on memory (no cuda.bindings).
        self._counter: Optional[int] = None
        self._counter_mem: Any = None
        # Blocks of counting launches issued so far: the counter's value once they have all
        # ended.  Written by counted() and by the repeat paths directly (one add a call).
        self.total = 0
        # The stream whose end the counter marks (the last counting launch's, with nothing
        # marked by an event after it on that stream), or None.
        self.counted_on: Optional[int] = None
        # The stream whose latest work of this order is an NCCL operation that NCCL itself
        # orders after the communicator's earlier ones, or None.  Set only where `bridge` is.
        self.nccl_on: Optional[int] = None
        # bridge(stream): makes `stream` wait for every NCCL operation the communicator has
        # issued (NCCL orders its launches; runtime_cuda.nccl.fallback.NcclFallback.bridge),
        # or None where nothing does (no real NCCL behind the order, or one too old).
        self.bridge: Optional[Callable[[int], None]] = None

    def _sync(self) -> None:
        self.ready = self._last if not self._graves else None
        self.held = self._last if self._keeper is not None or self._last in LASTING else None

    @property
    def events(self):
        if self._events is None:
            self._events = CudaEvents()
        return self._events

    @property
    def last(self) -> Optional[int]:
        return self._last

    def enter(self, stream: int, capturing: Optional[bool] = None, nccl: bool = False) -> None:
        """Order the next operation, on `stream`, after everything issued so far.
        `nccl`: the operation is NCCL's, which NCCL itself orders after the
        communicator's earlier NCCL operations.
        Work captured into a graph takes no part (contract point 6): a capturing
        `stream` neither waits nor becomes the last stream, and nothing waits
        for a `last` stream that is capturing (its work has not run).
        On the last stream with nothing retired (`_graves` empty) this does
        nothing: the repeat paths (group.Reissue, the drop-in's) test exactly
        that (`ready`) and skip the call, so keep it a no-op there."""
        last = self._last
        if last is not None and last != stream:
            if capturing is None:
                capturing = self.events.capturing(stream)
            if capturing:
                return
            keeper, self._keeper = self._keeper, None   # released once `last`'s end is marked
            self.held = None
            # Said of `last` only: a call on `stream` marks itself again (leave, counted).
            by_nccl, self.nccl_on = self.nccl_on == last, None
            if by_nccl and keeper is None:
                # `last`'s latest work is NCCL's: NCCL orders its own next operation after it,
                # and an operation of gc3's waits for it through one of NCCL's on `stream`.
                if not nccl and not self._fault:
                    self.bridge(stream)
            elif self.counted_on == last and keeper is None:
                # `last`'s latest work is counting launches: wait for the counter to reach
                # every block issued so far, touching `last` no more.
                if not self._fault:
                    self.events.wait_value(stream, self._counter, self.total)
            elif self._marked == last and keeper is None:
                # leave() marked `last`'s end after its latest issue: wait on that mark and
                # touch `last` no more (its owner may have destroyed it since).  A capture
                # begun on it later holds nothing the mark waits for.
                if not self._fault:
                    self.events.wait(stream, self._link)
            elif self.events.capturing(last):
                self._last = stream
                self._sync()
                return
            elif not self._fault:
                ev = self.events
                if self._link is None:
                    self._link = ev.new()
                # cudaStreamWaitEvent captures the event's latest record at the
                # time of the call, so one event serves every hand-over.
                ev.record(self._link, last)
                ev.wait(stream, self._link)
                self._marked = last
        self._last = stream
        if self._graves:
            self.reap()
        self._sync()

    def leave(self, stream: int, capturing: Optional[bool] = None, owner: Any = None,
              nccl: bool = False) -> None:
        """After issuing on `stream` (entered last): mark its end now, while the stream
        surely exists.  A later call on another stream then waits on the mark and never
        touches `stream`, which may be gone by then (a temporary CuPy stream destroyed
        after its call).  One event record per call, none on the default streams (they
        last as long as the process) nor on a capturing one (captured work takes no part).
        `owner` (see owner()) keeps `stream` alive: held until the next switch, it
        replaces the per-call record with one record at that switch.  `nccl`: what was
        issued ends with an NCCL launch (not a call NCCL skips: no data, or one rank),
        which needs no mark where `bridge` orders gc3's next call after it; a repeat on
        the same stream then calls nothing (`nccl_on`)."""
        if capturing or stream in LASTING or stream != self._last or self._fault:
            return
        if owner is not None:
            self._keeper = owner
        if self._keeper is not None:   # the stream outlives the next switch, which marks its end
            self.held = stream
            return
        try:
            ev = self.events
        except ImportError:   # no CUDA in this process (the CPU tests): no GPU work to order
            return
        if capturing is None:
            capturing = ev.capturing(stream)
        if capturing:
            return
        self.counted_on = None
        if nccl and self.bridge is not None:
            self.nccl_on, self._marked = stream, None
            return
        if self._link is None:
            self._link = ev.new()
        ev.record(self._link, stream)
        self._marked = stream
        self.nccl_on = None

    def counter(self) -> int:
        """The address of the word a counting launch's blocks bump (one atomic add each, after
        their last store), or 0 where this order does not count: no cuda.bindings (a switch
        could not wait on the word).  Allocated once, zeroed, on the current device, which
        must be the one every call of this order runs on.  GC3_FAULT=stream-order drops the
        wait at the switch, whichever mark it would wait on."""
        if self._counter is None:
            from . import cudadriver

            self._counter = 0
            if cudadriver.driver() is not None:
                self._counter_mem = setup_zeros(1, "uint32")
                self._counter = self._counter_mem.data.ptr
        return self._counter

    def counted(self, stream: int, blocks: int) -> None:
        """After an eager launch on `stream` (entered last) whose `blocks` blocks each bump
        counter() as they end: every such launch adds to `total` (a switch waits for the
        counter to reach it), and on a stream leave() would mark per call, the count is
        that mark instead (the caller then skips leave()).  The default streams are marked
        at the switch anyway, and their repeats call no leave() that could clear the mark
        after later work, so the count never marks them."""
        self.total += blocks
        if stream not in LASTING:
            self.counted_on = stream
            # An older event or NCCL mark on `stream` does not cover these launches.
            self._marked = self.nccl_on = None

    def adopt(self, stream: int) -> None:
        """Take `stream` as the last one with no hand-over: the caller has ordered
        it after everything issued so far.  For a CUDA graph capture stream, which
        cannot wait on an event recorded outside the capture (torch.cuda.graph
        makes it wait on the stream current when capture began instead)."""
        self._last, self._keeper, self.nccl_on = stream, None, None
        self._sync()

    def retire(self, obj: Any) -> None:
        """Drop our reference to `obj` once all work issued so far has finished
        (callers keep what captured work uses themselves: see LaunchGroup)."""
        if self._last is None or obj is None:
            return
        if self.events.capturing(self._last):   # an event recorded there would be captured, not fired
            self._for_graphs.append(obj)
            return
        ev = self.events
        event = self._spare.pop() if self._spare else ev.new()
        ev.record(event, self._last)
        self._graves.append((event, obj))
        self.ready = None
        self.reap()

    def reap(self) -> None:
        ev = self.events
        while self._graves and ev.done(self._graves[0][0]):
            event, _ = self._graves.popleft()
            self._spare.append(event)
        if not self._graves:
            self.ready = self._last

    @property
    def pending(self) -> int:
        """How many retired objects are still held."""
        return len(self._graves)


def owner(stream: int) -> Any:
    """An object whose life keeps `stream` alive, or None where none is known: CuPy's
    current stream when it is `stream` and owns it (an ExternalStream owns nothing;
    a torch stream's ptr never reaches here as CuPy's)."""
    # A process that never imported CuPy has no CuPy stream current (and a failed import
    # would search the path on every call).
    cupy = sys.modules.get("cupy")
    if stream in LASTING or cupy is None:
        return None
    s = cupy.cuda.get_current_stream()
    if s.ptr != stream or isinstance(s, cupy.cuda.ExternalStream):
        return None
    return s


def owner_ref(stream: int) -> Optional[Callable[[], Any]]:
    """owner(stream) as a weak reference (a repeat cache must not keep streams alive), or None."""
    found = owner(stream)
    if found is None:
        return None
    try:
        return weakref.ref(found)
    except TypeError:
        return None


def handle(stream) -> int:
    """The raw handle of a CuPy stream, of a raw handle, or of CuPy's current stream for None."""
    if stream is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    if isinstance(stream, int):
        return stream
    return stream.ptr
