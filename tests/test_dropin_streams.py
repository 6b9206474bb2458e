"""The drop-in's stream contract on the CPU (runtime_cuda/core/streams.py): calls
on a new stream wait for the communicator's earlier ones, retired buffers are
held until the work before them is done, library code never enters a stream
with `with`, the GC3_NCCL startup hook, and the fuzz's deterministic parts.
The GPU side of the same contract: tests/test_dropin_gpu.py and
runtime_cuda/commands/fuzz.py (`gc3 fuzz`)."""
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from runtime_cuda.core import faults
from runtime_cuda.nccl import communicator as cm
from runtime_cuda.nccl import fallback as fb
from runtime_cuda.nccl.constants import DTYPE_NAMES, NCCL_FLOAT32, NCCL_SUM, NCCL_UINT8, OP_NAMES
from runtime_cuda.core.streams import StreamOrder

ROOT = Path(__file__).resolve().parents[1]
HOOK = "gc3_nccl_hook.pth"
PAIRS = ROOT / "tests" / "data" / "msccl" / "allreduce_allpairs_2r_1i.xml"
from runtime_cuda.commands import fuzz as fz  # noqa: E402
from test_nccl_dispatch import RecordingNccl  # noqa: E402


class Events:
    """Records what StreamOrder asks of CUDA; `pending` events are not done yet."""

    def __init__(self):
        self.log, self.pending, self.n = [], set(), 0
        self.capturing_streams = set()

    def new(self):
        self.n += 1
        return self.n

    def record(self, event, stream):
        self.log.append(("record", event, stream))
        self.pending.add(event)

    def wait(self, stream, event):
        self.log.append(("wait", stream, event))

    def done(self, event):
        return event not in self.pending

    def capturing(self, stream):
        return stream in self.capturing_streams


def test_same_stream_needs_no_event():
    ev = Events()
    order = StreamOrder(ev)
    for _ in range(5):
        order.enter(7)
    assert ev.log == []


def test_a_new_stream_waits_for_the_last_one():
    ev = Events()
    order = StreamOrder(ev)
    order.enter(7)
    order.enter(9)
    order.enter(9)
    order.enter(0)
    assert ev.log == [("record", 1, 7), ("wait", 9, 1), ("record", 1, 9), ("wait", 0, 1)]


def test_an_adopted_stream_is_entered_without_a_hand_over():
    """A CUDA graph capture stream cannot wait on an event recorded outside the
    capture; the torch backend adopts it (torch already ordered it)."""
    ev = Events()
    order = StreamOrder(ev)
    order.enter(7)
    order.adopt(11)
    order.enter(11)
    order.enter(7)
    assert ev.log == [("record", 1, 11), ("wait", 7, 1)]


def test_fault_switch_drops_the_wait():
    ev = Events()
    order = StreamOrder(ev, fault=True)
    order.enter(7)
    order.enter(9)
    assert ev.log == []
    order._counter = 0x1000             # counted launches: the fault drops their wait too
    order.counted(9, 4)
    order.enter(11)
    assert ev.log == [] and order.last == 11


def test_retired_objects_live_until_their_event_completes():
    ev = Events()
    order = StreamOrder(ev)
    order.retire("nothing issued yet")          # no work queued: dropped at once
    assert order.pending == 0
    order.enter(5)
    order.retire(["old scratch"])
    assert order.pending == 1 and ev.log[-1][0:1] == ("record",) and ev.log[-1][2] == 5
    order.enter(5)
    assert order.pending == 1                     # still queued on the GPU
    ev.pending.clear()
    order.enter(5)
    assert order.pending == 0


def test_graph_capture_takes_no_part_in_the_order():
    """CUDA refuses a capturing stream's dependency on uncaptured work (and
    an event recorded in a capture never fires): calls captured on stream 9
    neither wait nor become the last stream; a capture begun on the last
    stream is never waited for; what is retired then is kept for good."""
    ev = Events()
    order = StreamOrder(ev)
    order.enter(7)
    ev.capturing_streams.add(9)
    order.enter(9)
    order.enter(9, capturing=True)
    assert ev.log == [] and order.last == 7
    order.enter(5)                                   # eager work after it waits for 7 only
    assert ev.log == [("record", 1, 7), ("wait", 5, 1)]
    ev.capturing_streams.add(5)                      # a capture begun on the last stream
    order.retire(["scratch a graph may address"])
    assert order.pending == 0 and len(ev.log) == 2   # held, no event recorded into the capture
    order.enter(3)                                   # nothing to wait for: 5's work is captured
    assert len(ev.log) == 2 and order.last == 3
    ev.capturing_streams.clear()
    order.enter(9)
    assert ev.log[-2:] == [("record", 1, 3), ("wait", 9, 1)]


class GoneStreams(Events):
    """Events that fail the test on any use of a stream its owner destroyed."""

    def __init__(self):
        super().__init__()
        self.gone = set()

    def _alive(self, stream):
        assert stream not in self.gone, f"stream {stream} was used after its owner destroyed it"

    def record(self, event, stream):
        self._alive(stream)
        super().record(event, stream)

    def wait(self, stream, event):
        self._alive(stream)
        super().wait(stream, event)

    def capturing(self, stream):
        self._alive(stream)
        return super().capturing(stream)


def test_a_destroyed_stream_is_never_touched_again():
    """A call on a temporary stream, the stream destroyed, the next call on another: the
    hand-over waits on the mark leave() recorded while the stream existed."""
    ev = GoneStreams()
    order = StreamOrder(ev)
    for stream in (7, 8, 9):
        order.enter(stream)
        order.leave(stream)
        ev.gone.add(stream)
    assert ev.log == [("record", 1, 7), ("wait", 8, 1), ("record", 1, 8), ("wait", 9, 1), ("record", 1, 9)]


def test_leave_marks_nothing_on_default_or_capturing_streams():
    ev = Events()
    order = StreamOrder(ev)
    order.enter(0)
    order.leave(0)                      # the legacy stream lives as long as the process
    order.enter(5)
    ev.capturing_streams.add(5)         # a capture begun on the last stream
    order.leave(5)
    assert ev.log == [("record", 1, 0), ("wait", 5, 1)]
    ev.capturing_streams.clear()
    order.leave(5)
    order.enter(6)
    assert ev.log[2:] == [("record", 1, 5), ("wait", 6, 1)]


class Owner:
    """A stream's owner (a CuPy Stream): its stream is destroyed when it dies."""

    def __init__(self, ev, stream):
        self.ev, self.stream = ev, stream

    def __del__(self):
        self.ev.gone.add(self.stream)


def test_an_owned_stream_is_marked_once_at_the_switch_and_then_let_go():
    """With its owner held, a stream cannot be destroyed: its calls record nothing, and the
    next switch marks its end there, then lets the owner go."""
    ev = GoneStreams()
    order = StreamOrder(ev)
    order.enter(7)
    order.leave(7)                      # its owner not known yet (a first call): marked
    for stream in (7, 8):
        owner = Owner(ev, stream)
        for _ in range(3):
            order.enter(stream)
            order.leave(stream, None, owner)
        del owner                       # the user drops the stream: only the order holds it
    # The first mark is stale by the switch (calls followed it): 7's end is marked anew.
    assert ev.log == [("record", 1, 7), ("record", 1, 7), ("wait", 8, 1)] and ev.gone == {7}
    order.enter(9)                      # no owner known for 9: each call marks its end
    order.leave(9)
    order.leave(9)
    assert ev.log[3:] == [("record", 1, 8), ("wait", 9, 1), ("record", 1, 9), ("record", 1, 9)]
    assert ev.gone == {7, 8}
    ev.gone.add(9)                      # destroyed by its owner: never touched again
    order.enter(10)
    assert ev.log[-1] == ("wait", 10, 1)


def test_an_owned_stream_that_began_capturing_is_not_marked():
    ev = Events()
    order = StreamOrder(ev)
    keep = Owner(type("Ev", (), {"gone": set()})(), 5)
    order.enter(5)
    order.leave(5, None, keep)
    ev.capturing_streams.add(6)
    order.enter(6)                      # a capture elsewhere: 5 stays last, still held
    assert order.last == 5 and order._keeper is keep and ev.log == []
    ev.capturing_streams = {5}          # a capture begun on 5 itself: nothing waits for it
    order.enter(7)
    assert ev.log == [] and order.last == 7 and order._keeper is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["enter", "leave", "leave_owned", "retire", "finish", "adopt",
                                           "capture", "uncapture"]),
                          st.sampled_from([0, 2, 5, 6, 7])), max_size=30))
def test_the_fast_path_fields_say_exactly_when_enter_and_leave_do_nothing(ops):
    """The repeat paths skip enter() where `ready` is the stream and leave() where `held` is:
    after any sequence of operations, calling either there must change nothing at all."""
    ev = Events()
    order = StreamOrder(ev)
    owners = {}
    for op, stream in ops:
        if op == "enter":
            order.enter(stream)
        elif op in ("leave", "leave_owned"):
            owner = owners.setdefault(stream, object()) if op == "leave_owned" else None
            order.leave(stream, None, owner)
        elif op == "retire":
            order.retire(object())
        elif op == "finish":
            ev.pending.clear()
            order.reap()
        elif op == "adopt":
            order.adopt(stream)
        elif op == "capture":
            ev.capturing_streams.add(stream)
        else:
            ev.capturing_streams.discard(stream)
        for s in (0, 2, 5, 6, 7):
            state = (order.last, order.pending, order._keeper, order.ready, order.held, len(ev.log))
            if order.ready == s:
                order.enter(s)
                assert (order.last, order.pending, order._keeper, order.ready, order.held, len(ev.log)) == state
            if order.held == s:
                order.leave(s)
                assert (order.last, order.pending, order._keeper, order.ready, order.held, len(ev.log)) == state
        # ...and they are not stale: where they do not name the stream, the method has work.
        assert order.ready == (order.last if order.pending == 0 else None)
        assert order.held == (order.last if order._keeper is not None or order.last in (0, 1, 2) else None)


class CountingEvents(GoneStreams):
    """GoneStreams, and the counter wait StreamOrder issues for counted launches."""

    def __init__(self):
        super().__init__()
        self.order = StreamOrder(self)
        self.order._counter = 0x1000     # as counter() leaves it where streams can wait on memory

    def wait_value(self, stream, address, value):
        self._alive(stream)
        assert address == 0x1000
        self.log.append(("count", stream, value))


def test_counted_launches_mark_their_stream_without_an_event():
    """A stream passed by handle whose calls are counting launches: no event record per call,
    and the switch waits for the count, never touching the stream (destroyed by then)."""
    ev = CountingEvents()
    order = ev.order
    for stream, blocks in ((7, 4), (7, 4), (8, 2)):
        order.enter(stream)
        order.counted(stream, blocks)
        ev.gone.add(stream)
    order.enter(9)
    assert ev.log == [("count", 8, 8), ("count", 9, 10)]


def test_a_count_never_stands_for_later_work_nor_an_old_mark_for_a_count():
    ev = CountingEvents()
    order = ev.order
    order.enter(7)
    order.counted(7, 4)
    order.leave(7)                      # an NCCL call after the counted one: its event is the mark
    order.enter(8)
    assert ev.log == [("record", 1, 7), ("wait", 8, 1)]
    order.leave(8)                      # marked by an event, then counted: the count is the mark
    order.counted(8, 2)
    order.enter(9)
    assert ev.log[2:] == [("record", 1, 8), ("count", 9, 6)]


def test_counts_on_the_default_streams_mark_at_the_switch():
    """The default streams' repeats skip leave(), so a count never marks them: later work on
    them would not be covered.  The switch records on them instead (they are never destroyed)."""
    ev = CountingEvents()
    order = ev.order
    order.enter(0)
    order.counted(0, 4)
    order.enter(0)                      # another call on it, any kind
    order.enter(5)
    assert order.total == 4 and ev.log == [("record", 1, 0), ("wait", 5, 1)]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["count", "event", "owned", "captured", "nccl"]),
                          st.sampled_from([0, 2, 5, 6, 7])), max_size=40),
       st.booleans())
def test_every_switch_waits_for_the_last_streams_latest_call(calls, bridged):
    """Calls as the drop-in's repeat path makes them (a counting launch, an interpreter call
    marked by leave(), a call on a stream whose owner is known, a captured one, a call routed to
    NCCL, which NCCL orders after the communicator's earlier NCCL calls itself), each on a stream
    its owner may destroy right after (unless held or a default stream).  At every switch, what
    the new stream waits for must cover the last stream's latest uncaptured call, and no
    destroyed stream may be touched.  `bridged`: whether the order may rely on NCCL's own order
    (StreamOrder.bridge: an NCCL operation on the new stream, which waits for every earlier one)."""
    ev = CountingEvents()
    order = ev.order
    if bridged:
        order.bridge = lambda stream: (ev._alive(stream), ev.log.append(("bridge", stream, None)))
    owners, latest = {}, {}   # latest: stream -> (its last uncaptured call's index in ev.log, total after it)
    for kind, stream in calls:
        ev.gone.discard(stream)
        ev.capturing_streams = {stream} if kind == "captured" else set()
        last, mark = order.last, len(ev.log)
        order.enter(stream, None, kind == "nccl")
        if last is not None and last != stream and kind != "captured" and last in latest:
            at, total = latest[last]
            waits = [e for e in ev.log[mark:] if e[1] == stream and e[0] in ("wait", "count", "bridge")]
            if ev.log[at][0] == "nccl" and kind == "nccl" and not waits:
                pass                        # NCCL orders its own calls
            else:
                assert len(waits) == 1, ev.log[mark:]
                what, _, arg = waits[0]
                if what == "count":
                    assert ev.log[at][0] == "counted" and total <= arg
                elif what == "bridge":       # waits for every NCCL call so far, only those
                    assert bridged and ev.log[at][0] == "nccl"
                else:
                    rec = max(i for i, e in enumerate(ev.log) if e[0] == "record" and e[1] == arg
                              and i < ev.log.index(waits[0], mark))
                    assert ev.log[rec][2] == last and rec > at
        if kind == "captured":
            order.leave(stream, True)
            continue
        if kind == "count":                 # counted() is the whole mark: the repeat path calls no leave()
            order.counted(stream, 3)
            ev.log.append(("counted", stream, order.total))
            latest[stream] = (len(ev.log) - 1, order.total)
        elif kind == "nccl":                # communicator._repeat_plain with the NCCL call
            ev.log.append(("nccl", stream, None))
            latest[stream] = (len(ev.log) - 1, order.total)
            if order.held != stream and order.nccl_on != stream:
                order.leave(stream, None, None, True)
        else:
            ev.log.append(("call", stream, None))
            latest[stream] = (len(ev.log) - 1, order.total)
            if kind == "owned" and stream not in owners:
                owners[stream] = Owner(ev, stream)
            owner = owners[stream] if kind == "owned" else None
            if order.held != stream:
                order.leave(stream, None, owner)
        if kind != "owned" and stream not in (0, 1, 2) and order._keeper is None:
            ev.gone.add(stream)             # a temporary stream, destroyed after its call


class RecordingGc3:
    def __init__(self, log):
        self.log = log

    def check(self, cand, call):
        return None

    def prepare(self, decision):
        return None

    def run(self, decision):
        self.log.append(("gc3", decision.call.stream))

    def close(self):
        pass


def test_the_communicator_orders_gc3_and_nccl_calls_across_streams(monkeypatch):
    """Without relying on NCCL's own launch order (an NCCL older than 2.14, or GC3_ORDER_COUNT=0)."""
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    monkeypatch.setattr(cm, "orders_launches", lambda: False)
    log, ev = [], Events()
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    comm._setup(RecordingNccl(log), 2, 0, lambda *a: RecordingGc3(log), order=StreamOrder(ev))
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 11)   # gc3 (in place)
    comm.allReduce(0x1000, 0x2000, 1000, NCCL_FLOAT32, NCCL_SUM, 22)   # NCCL (out of place)
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 11)   # gc3 again
    assert [e[0] for e in log] == ["gc3", "allReduce", "gc3"]
    # Each call marks its stream's end after issuing (leave); the next stream waits on that mark.
    assert ev.log == [("record", 1, 11), ("wait", 22, 1), ("record", 1, 22), ("wait", 11, 1), ("record", 1, 11)]


class Pair:
    class data:
        ptr = 0x9000


def test_calls_routed_to_nccl_are_ordered_by_nccl_and_bridged_to_gc3(monkeypatch):
    """NCCL orders a communicator's launches itself (2.14 on): a call routed to it records no
    event, first call or repeat, and a gc3 call on another stream after it waits through one
    byte sent to self on that stream, in a group.  An NCCL call that launches nothing (no
    data) marks its stream by an event as before."""
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    monkeypatch.setattr(cm, "orders_launches", lambda: True)
    monkeypatch.setattr(fb, "_two_bytes", lambda: Pair)
    log, ev = [], Events()
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    group = (lambda: log.append(("groupStart",)), lambda: log.append(("groupEnd",)))
    comm._setup(RecordingNccl(log), 2, 1, lambda *a: RecordingGc3(log), nccl_group=group, order=StreamOrder(ev))
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 11)   # gc3 (in place)
    for _ in range(3):                                                 # NCCL, then its repeats
        comm.allReduce(0x1000, 0x2000, 1000, NCCL_FLOAT32, NCCL_SUM, 22)
    comm.allReduce(0x1000, 0x2000, 1000, NCCL_FLOAT32, NCCL_SUM, 33)  # NCCL after NCCL: nothing to do
    assert ev.log == [("record", 1, 11), ("wait", 22, 1)]
    del log[:]
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 44)   # gc3 after NCCL on another stream
    assert log == [("groupStart",), ("send", 0x9000, 1, NCCL_UINT8, 1, 44), ("recv", 0x9001, 1, NCCL_UINT8, 1, 44),
                   ("groupEnd",), ("gc3", 44)]
    assert ev.log == [("record", 1, 11), ("wait", 22, 1), ("record", 1, 44)]
    comm.allReduce(0x1000, 0x2000, 0, NCCL_FLOAT32, NCCL_SUM, 55)      # NCCL launches nothing: an event
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 66)
    assert ev.log[3:] == [("wait", 55, 1), ("record", 1, 55), ("wait", 66, 1), ("record", 1, 66)]
    assert [e[0] for e in log[5:]] == ["allReduce", "gc3"]
    # A call NCCL launches nothing for, after an NCCL call on another stream, orders nothing by
    # itself: it is bridged like a gc3 call, so what comes after it is ordered after that NCCL call.
    for repeat in range(2):
        del log[:], ev.log[:]
        comm.allReduce(0x1000, 0x2000, 1000, NCCL_FLOAT32, NCCL_SUM, 77)
        comm.allReduce(0x1000, 0x2000, 0, NCCL_FLOAT32, NCCL_SUM, 0)        # the null stream
        comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 88)
        assert [e[0] for e in log] == ["allReduce", "groupStart", "send", "recv", "groupEnd", "allReduce", "gc3"]
        assert log[2][-1] == 0 and ev.log == [("wait", 77, 1), ("record", 1, 0), ("wait", 88, 1),
                                              ("record", 1, 88)]


def test_a_gc3_repeat_after_an_nccl_call_on_its_stream_marks_its_end(monkeypatch):
    """The repeat path shared by NCCL's calls and a backend's plain re-issue: once gc3 runs on
    the stream whose latest work was NCCL's, NCCL's order no longer marks that stream's end,
    so each gc3 repeat there leaves its event, and the next stream waits on it."""
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    monkeypatch.setattr(cm, "orders_launches", lambda: True)
    monkeypatch.setattr(fb, "_two_bytes", lambda: Pair)
    log, ev = [], Events()
    backend = RecordingGc3(log)
    backend.reissue = lambda decision: lambda stream: log.append(("again", stream))
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    group = (lambda: log.append(("groupStart",)), lambda: log.append(("groupEnd",)))
    comm._setup(RecordingNccl(log), 2, 0, lambda *a: backend, nccl_group=group, order=StreamOrder(ev))
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 22)   # gc3, its repeat then cached
    comm.allReduce(0x1000, 0x2000, 1000, NCCL_FLOAT32, NCCL_SUM, 22)   # NCCL on the same stream
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 22)   # the gc3 repeat
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 33)
    assert [e[0] for e in log] == ["gc3", "allReduce", "again", "gc3"]
    assert ev.log == [("record", 1, 22)] * 2 + [("wait", 33, 1), ("record", 1, 33)]   # no bridge on 33


def test_work_before_nccls_launch_is_ordered_as_gc3s(monkeypatch):
    """NCCL's order covers a call only from its launch on: the all-to-all NCCL serves copies the
    rank's own block first (on the call's stream), which must still wait for the communicator's
    earlier calls, so after an NCCL call on another stream it is bridged, first call and repeat."""
    import types
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    monkeypatch.setattr(cm, "orders_launches", lambda: True)
    monkeypatch.setattr(fb, "_two_bytes", lambda: Pair)
    log, ev = [], Events()
    runtime = types.SimpleNamespace(memcpyDeviceToDevice=3, memcpyAsync=lambda *a: log.append(("copy", a[-1])))
    # No CuPy stream is current that could own the streams passed (streams.owner).
    cuda = types.SimpleNamespace(runtime=runtime, get_current_stream=lambda: types.SimpleNamespace(ptr=-1))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", runtime)
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    group = (lambda: log.append(("groupStart",)), lambda: log.append(("groupEnd",)))
    comm._setup(RecordingNccl(log), 2, 0, lambda *a: RecordingGc3(log), nccl_group=group, order=StreamOrder(ev))
    for _ in range(2):
        comm.allReduce(0x1000, 0x2000, 1000, NCCL_FLOAT32, NCCL_SUM, 22)    # NCCL
        del log[:]
        comm.allToAll(0x1000, 0x8000, 100, NCCL_FLOAT32, 33)               # NCCL, after a copy
        assert [e[0] for e in log] == ["groupStart", "send", "recv", "groupEnd",   # the bridge, on 33
                                       "copy", "groupStart", "send", "recv", "groupEnd"]
        assert log[1][-1] == 33 and log[4] == ("copy", 33)
    assert ev.log == []       # no event: NCCL's order marks both calls' ends


def test_an_adopted_capture_stream_reaches_every_order(monkeypatch):
    """adopt_stream: no event hand-over in the communicator's order nor in its
    gc3 backend's launch groups (each has a StreamOrder of its own)."""
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    log, ev = [], Events()
    backend = RecordingGc3(log)
    backend.adopt = lambda stream: log.append(("adopt", stream))
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    comm._setup(RecordingNccl(log), 2, 0, lambda *a: backend, order=StreamOrder(ev))
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 11)
    ev.capturing_streams.add(33)
    comm.adopt_stream(33)
    comm.allReduce(0x1000, 0x1000, 1000, NCCL_FLOAT32, NCCL_SUM, 33)
    assert log == [("gc3", 11), ("adopt", 33), ("gc3", 33)]
    assert ev.log == [("record", 1, 11)]     # 11's end marked; nothing waits or records in the capture


def test_faults_are_named():
    with pytest.raises(ValueError, match="unknown fault"):
        faults.set_active("no-such-bug")
    faults.set_active("stream-order")
    try:
        assert faults.active("stream-order") and not faults.active("stream-reset")
    finally:
        faults.set_active("")


WITH_STREAM = re.compile(r"^\s*with\s+(?![^#\n]*streams\.current\()[^#\n]*[Ss]tream[^#\n]*:\s*(#.*)?$", re.M)


def test_library_code_never_enters_a_stream_with_with():
    """The root cause of the stream-reset bug: leaving `with stream:` resets CuPy's current
    stream to the legacy one and undoes the caller's `s.use()`."""
    offenders = []
    for folder in ("runtime_cuda", "gc3"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for m in WITH_STREAM.finditer(text):
                line = text[: m.start()].count("\n") + 1
                if "GC3_FAULT" in m.group(0):   # the bug kept behind a fault switch
                    continue
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert not offenders, "library code enters a stream with `with`:\n" + "\n".join(offenders)


def test_the_pattern_finds_what_it_must():
    assert WITH_STREAM.search("    with cupy.cuda.Stream(non_blocking=True):\n")
    assert WITH_STREAM.search("        with stream:\n")
    assert not WITH_STREAM.search("    with streams.current(s):\n")


@pytest.mark.parametrize("value, imported", [(None, False), ("1", True)])
def test_the_startup_hook_needs_only_the_variable(value, imported, tmp_path):
    """pip installs gc3_nccl_hook.pth with the package; GC3_NCCL alone switches it on.  Where this
    checkout runs uninstalled (PYTHONPATH), the same hook file is read from a site folder of its own,
    as Python's startup reads site-packages."""
    env = {k: v for k, v in os.environ.items() if k != "GC3_NCCL"}
    if value is not None:
        env["GC3_NCCL"] = value
    code = "import sys; print('runtime_cuda.auto' in sys.modules)"
    if not any((Path(d) / HOOK).is_file() for d in site.getsitepackages() + [site.getusersitepackages()]):
        (tmp_path / HOOK).write_text((ROOT / HOOK).read_text())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        code = f"import site; site.addsitedir({str(tmp_path)!r}); " + code
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(imported), (out.stdout, out.stderr)


def test_fuzz_specs_are_reproducible_and_cover_the_space():
    a = [fz.draw_spec(3, i, 4, 1 << 20) for i in range(2000)]
    b = [fz.draw_spec(3, i, 4, 1 << 20) for i in range(2000)]
    assert a == b
    assert {s.coll for s in a} == set(fz.COLLS)
    assert {s.stream for s in a} == set(fz.STREAM_KINDS)
    assert {s.buf for s in a} == set(fz.BUF_KINDS)
    assert {s.dtype for s in a} == set(DTYPE_NAMES)
    counts = [s.count for s in a]
    assert 0 in counts and 1 in counts and any(c > 1000 for c in counts)
    assert all(fz.Layout(s, 4, 0).buf_elems * fz.ITEMSIZE[s.dtype] <= 1 << 20 for s in a)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_fuzz_values_never_overflow_or_round(n):
    """Every reduction of the fuzz's inputs stays exact in the smallest type."""
    for dtype, name in DTYPE_NAMES.items():
        for op in OP_NAMES:
            ranges = [fz.value_range(op, dtype, n, r) for r in range(n)]
            lo = [a for a, _ in ranges]
            hi = [a + s - 1 for a, s in ranges]
            if op in (0, 4):   # sum, avg
                worst = max(abs(sum(lo)), abs(sum(hi)))
            elif op == 1:      # prod
                worst = 1
                for a, b in zip(lo, hi):
                    worst *= max(abs(a), abs(b))
            else:
                worst = max(max(map(abs, lo)), max(map(abs, hi)))
            limit = 127 if name == "int8" else 255 if name == "uint8" else 256
            assert worst <= limit, (name, OP_NAMES[op], n, worst)
            if name.startswith("uint"):
                assert min(lo) >= 0


def test_fuzz_inplace_layouts_follow_nccl():
    s = fz.Spec(0, "allgather", 10, NCCL_FLOAT32, None, 0, True, "fresh", 0, "use", 1)
    lay = fz.Layout(s, 4, 2)
    assert (lay.send_off, lay.recv_off, lay.buf_elems) == (20, 0, 40)
    s = fz.Spec(0, "reducescatter", 10, NCCL_FLOAT32, NCCL_SUM, 0, True, "fresh", 0, "use", 1)
    lay = fz.Layout(s, 4, 3)
    assert (lay.send_off, lay.recv_off, lay.buf_elems) == (0, 30, 40)


def test_fuzz_lines_fold_into_one(tmp_path, capsys):
    a = ("fuzz mode=virtual gpus=1 ranks=4 calls=10 gc3_served=4 mismatches=0 hangs=0 max_bytes=64 streams=3 "
         "seed=1..1 hw=1xH100 cuda=13.2 nccl=2.28.9 date=2026-11-23")
    b = a.replace("calls=10", "calls=5").replace("seed=1..1", "seed=2..2").replace("max_bytes=64", "max_bytes=128")
    folded = ("fuzz mode=virtual gpus=1 ranks=4 calls=15 gc3_served=8 mismatches=0 hangs=0 max_bytes=128 streams=3 "
              "seed=1..2 hw=1xH100 cuda=13.2 nccl=2.28.9 date=2026-11-23")
    assert fz.fold([a, b]) == folded
    with pytest.raises(ValueError, match="consecutive"):
        fz.fold([a, b.replace("seed=2..2", "seed=4..4")])
    with pytest.raises(ValueError, match="ranks"):
        fz.fold([a, b.replace("ranks=4", "ranks=2")])
    # gc3 fuzz --fold FILE...: no GPU, the folded line on stdout; a bad line exits 2 naming it
    (tmp_path / "a.txt").write_text(a + "\n")
    (tmp_path / "b.txt").write_text(b + "\n\n")
    assert fz.main(["--fold", str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]) == 0
    assert capsys.readouterr().out.strip() == folded
    (tmp_path / "c.txt").write_text("fuzz calls=3\n")
    with pytest.raises(SystemExit) as exc:
        fz.main(["--fold", str(tmp_path / "c.txt")])
    assert exc.value.code == 2 and "not a fuzz summary line" in capsys.readouterr().err


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_ll128_catalog_serves_every_sample_and_library_algorithm_for_n_ranks(n, monkeypatch, tmp_path):
    import json

    from runtime_cuda.nccl import library
    from runtime_cuda.nccl import protocol_catalog as ll128_config
    from runtime_cuda.nccl.catalog import load_catalog

    cfg = ll128_config.config(n, tmp_path / "ir", "LL128")
    entries = cfg["algorithms"]
    index = json.loads((ROOT / "ir_samples" / "index.json").read_text())["algorithms"]
    served = {Path(e["file"]).name for e in entries}
    assert {e["file"] for e in index if e["ranks"] == n and "file" in e} <= served
    algs = {a.name for a in library.ALGORITHMS.values() if a.fits(n) and not a.multinode}
    assert algs <= {f.split(f"_{n}r")[0] for f in served}, algs - {f.split(f"_{n}r")[0] for f in served}
    # per collective and placement the bands tile every size once, in-place entries first
    seen_oop = False
    for coll in {e["collective"] for e in entries}:
        for oop in (False, True):
            mine = [e for e in entries if e["collective"] == coll and e["outofplace"] == oop]
            assert [e["min_bytes"] for e in mine] == [ll128_config.band(k)[0] for k in range(len(mine))]
            assert mine[-1]["max_bytes"] is None and len(mine) == ll128_config.BANDS
    for e in entries:
        seen_oop = seen_oop or e["outofplace"]
        assert e["outofplace"] or not seen_oop
    path = tmp_path / "ll128.json"
    path.write_text(json.dumps(cfg))
    env = {"GC3_CONFIG": str(path), "GC3_CACHE_DIR": str(tmp_path / "cache")}
    cands = load_catalog(env).candidates
    assert len(cands) == len(entries) and {c.program.proto for c in cands} == {"LL128"}


def test_the_fuzz_line_names_the_catalog_by_content(tmp_path):
    from runtime_cuda.nccl.catalog import DEFAULT_INDEX

    import hashlib
    own = tmp_path / "mine.json"
    own.write_text('{"version": 1, "algorithms": []}')
    assert fz.catalog_name({}) == "index:" + hashlib.sha1(DEFAULT_INDEX.read_bytes()).hexdigest()[:8]
    assert fz.catalog_name({"GC3_CONFIG": str(own)}).startswith("mine.json:")
    assert fz.catalog_name({"GC3_CONFIG": str(tmp_path / "gone.json")}) == "gone.json:unreadable"
    assert fz.catalog_name({"GC3_XML_FILES": "a.xml"}).endswith("+xml_files")
    line = ("fuzz mode=processes gpus=2 ranks=2 calls=5 gc3_served=3 mismatches=0 hangs=0 max_bytes=64 streams=1 "
            f"seed=1..1 catalog={fz.catalog_name({})} hw=2xH200 cuda=13.2 nccl=2.28.9 date=2026-11-23")
    assert fz.parse_line(line)["catalog"].startswith("index:")


def test_gc3_catalog_protocol_writes_the_catalog_or_says_why_not(tmp_path):
    import json

    from click.testing import CliRunner

    from gc3.cli import main
    out = tmp_path / "ll.json"
    r = CliRunner().invoke(main, ["catalog", "protocol", "--ranks", "2", "--protocol", "LL", "-o", str(out)])
    assert r.exit_code == 0, r.output
    entries = json.loads(out.read_text())["algorithms"]
    assert entries and {e["protocol"] for e in entries} == {"LL"}
    assert all(Path(e["file"]).is_file() for e in entries) and (tmp_path / "ll.d").is_dir()
    r = CliRunner().invoke(main, ["catalog", "protocol", "--ranks", "3", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "no shipped sample for 3 ranks" in r.output
