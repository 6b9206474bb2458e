"""The drop-in's per-call fast path on the CPU ("a dictionary hit and
one launch"): a repeat of a call gc3 served skips the argument checks,
selection and set-up, and re-issues the launch group's prepared call; it is
still ordered across streams, still recorded inside a group, logged per call
under GC3_DEBUG=TRACE, and falls back to the full path once the group has
dropped its prepared calls.  The launch group's side (Reissue, its epoch, the
`prepared` accessor) runs here on a group without a GPU; the GPU side is
tests/test_graphs.py and scripts/bench_host_time.py."""
import os
import sys
from pathlib import Path

import pytest

from gc3.errors import CommunicatorError
from runtime_cuda.core import group as group_mod
from runtime_cuda.core.group import LaunchGroup, Reissue
from runtime_cuda.nccl import communicator as cm
from runtime_cuda.nccl.call import Call
from runtime_cuda.nccl.constants import NCCL_AVG, NCCL_FLOAT32, NCCL_SUM
from runtime_cuda.nccl.gc3_backend import Gc3Backend, _key
from runtime_cuda.nccl.selection import Decision
from runtime_cuda.core.streams import StreamOrder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_dropin_streams import Events  # noqa: E402
from test_nccl_dispatch import PAIRS, RecordingNccl  # noqa: E402

R, ST = 0x2000_0000, 0x77


class RepeatingGc3:
    """A gc3 backend whose run and re-issue both record; `stale` makes re-issues refuse."""

    def __init__(self, log):
        self.log, self.stale, self.bound = log, False, 0

    def check(self, cand, call):
        return None

    def prepare(self, decision):
        return None

    def run(self, decision):
        c = decision.call
        self.log.append(("run", c.sendbuf, c.count, c.stream))

    def reissue(self, decision):
        self.bound += 1
        c = decision.call

        def go(stream):
            if self.stale:
                return False
            self.log.append(("again", c.sendbuf, c.count, stream))
            return True
        return go

    def close(self):
        pass


def make(monkeypatch, log, env=None, events=None):
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    backend = RepeatingGc3(log)
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    comm._setup(RecordingNccl(log), 2, 0, lambda *a: backend, order=StreamOrder(events or Events()))
    return comm, backend


def test_a_repeat_skips_selection_and_reissues_the_prepared_call(monkeypatch):
    log = []
    comm, backend = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)

    def no_selection(call):
        raise AssertionError("a repeat went through selection")
    monkeypatch.setattr(comm._dispatch.selector, "choose", no_selection)
    for _ in range(3):
        assert comm.submit("allreduce", R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST) == PAIRS.name
    assert log == [("run", R, 1000, ST)] + [("again", R, 1000, ST)] * 3
    assert comm.served == {PAIRS.name: 4} and backend.bound == 1


def test_any_other_argument_is_a_new_call(monkeypatch):
    log = []
    comm, _ = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    comm.allReduce(R, R, 1008, NCCL_FLOAT32, NCCL_SUM, ST)       # count
    comm.allReduce(R + 64, R + 64, 1000, NCCL_FLOAT32, NCCL_SUM, ST)   # buffers
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST + 1)   # stream
    assert [e[0] for e in log] == ["run"] * 4
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST + 1)
    assert log[-1] == ("again", R, 1000, ST + 1)


def test_a_repeat_routed_to_nccl_skips_selection_and_calls_nccl_itself(monkeypatch):
    log = []
    comm, backend = make(monkeypatch, log)
    # Out of place: the all-pairs IR is in-place only, so NCCL serves it.
    assert comm.submit("allreduce", R - 4096, R, 10, NCCL_FLOAT32, NCCL_SUM, ST) == "NCCL"

    def no_selection(call):
        raise AssertionError("a repeat went through selection")
    monkeypatch.setattr(comm._dispatch.selector, "choose", no_selection)
    for _ in range(2):
        assert comm.submit("allreduce", R - 4096, R, 10, NCCL_FLOAT32, NCCL_SUM, ST) == "NCCL"
    # Every repeat reached NCCL with the call's own arguments; gc3 never bound anything.
    assert log[:3] == [("allReduce", R - 4096, R, 10, NCCL_FLOAT32, NCCL_SUM, ST)] * 3
    assert backend.bound == 0 and comm.served["NCCL"] == 3


def test_a_nccl_repeat_on_a_new_stream_is_a_new_call(monkeypatch):
    log = []
    comm, _ = make(monkeypatch, log)
    comm.allReduce(R - 4096, R, 10, NCCL_FLOAT32, NCCL_SUM, ST)
    selected = []
    choose = comm._dispatch.selector.choose
    monkeypatch.setattr(comm._dispatch.selector, "choose", lambda call: selected.append(call) or choose(call))
    comm.allReduce(R - 4096, R, 10, NCCL_FLOAT32, NCCL_SUM, ST + 1)
    comm.allReduce(R - 4096, R, 12, NCCL_FLOAT32, NCCL_SUM, ST)
    assert len(selected) == 2
    assert log[-2:] == [("allReduce", R - 4096, R, 10, NCCL_FLOAT32, NCCL_SUM, ST + 1),
                        ("allReduce", R - 4096, R, 12, NCCL_FLOAT32, NCCL_SUM, ST)]


def test_a_repeat_on_another_stream_still_waits_for_the_last_call(monkeypatch):
    log, ev = [], Events()
    comm, _ = make(monkeypatch, log, events=ev)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, 11)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, 22)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, 11)     # a repeat, after a call on 22
    assert log[-1] == ("again", R, 1000, 11)
    # Every call marks its stream's end (StreamOrder.leave); a call on another stream waits on it.
    assert ev.log == [("record", 1, 11), ("wait", 22, 1), ("record", 1, 22), ("wait", 11, 1), ("record", 1, 11)]


def test_a_repeat_inside_a_group_is_recorded_until_group_end(monkeypatch):
    log = []
    comm, _ = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    cm.groupStart()
    assert comm.submit("allreduce", R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST) == "group"
    assert len(log) == 1
    cm.groupEnd()
    assert log == [("run", R, 1000, ST)] * 2


def test_a_stale_repeat_takes_the_full_path_and_binds_again(monkeypatch):
    log = []
    comm, backend = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    backend.stale = True
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    backend.stale = False
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    assert log == [("run", R, 1000, ST)] * 2 + [("again", R, 1000, ST)]
    assert backend.bound == 2 and comm.served == {PAIRS.name: 3}


def test_trace_logging_sees_every_call(monkeypatch, capsys):
    log = []
    comm, backend = make(monkeypatch, log, env={"GC3_DEBUG": "TRACE"})
    capsys.readouterr()
    for _ in range(3):
        comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    assert capsys.readouterr().err.count("DEBUG rank 0: allreduce") == 3 and backend.bound == 0


def test_bad_arguments_are_refused_every_time(monkeypatch):
    comm, _ = make(monkeypatch, [])
    for _ in range(2):
        with pytest.raises(CommunicatorError, match="count must be >= 0"):
            comm.allReduce(R, R, -1, NCCL_FLOAT32, NCCL_SUM, ST)
    with pytest.raises(CommunicatorError, match="unknown collective"):
        comm.submit(["allreduce"], R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)   # unhashable: no crash in the lookup


def test_destroy_forgets_the_repeats(monkeypatch):
    log = []
    comm, _ = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    comm.destroy()
    assert comm._repeats == {}


# --- the runtime's side: Gc3Backend.reissue and LaunchGroup's Reissue ------------------

class BindingGroup:
    def __init__(self):
        self.asked = []

    def reissue(self, *args):
        self.asked.append(args)
        return "bound"


def backend_with_group(monkeypatch, log):
    """A Gc3Backend holding one launch group for the all-pairs candidate, built without the runtime."""
    comm, _ = make(monkeypatch, log)
    cand = comm._dispatch.selector.catalog.candidates[0]
    be = Gc3Backend.__new__(Gc3Backend)
    group = BindingGroup()
    be._groups = {_key(cand): group}
    return be, cand, group


@pytest.mark.parametrize("op, expect", [(NCCL_SUM, "sum"), (NCCL_AVG, None)])
def test_backend_binds_what_run_would_run_and_never_avg(monkeypatch, op, expect):
    be, cand, group = backend_with_group(monkeypatch, [])
    call = Call("allreduce", R, R, 1000, NCCL_FLOAT32, op, ST, 2, 0)
    got = be.reissue(Decision(call, cand))
    if expect is None:     # avg's division pass runs in the backend: a repeat needs the full path
        assert got is None and group.asked == []
    else:
        assert got == "bound" and group.asked == [([R], [R], 1000, "float32", "sum")]


class CountingCall:
    """A PreparedCall (copies around a launch) that records its issues; as a launch,
    its bound driver calls record too: the plain one as captured (Launch's choice for
    a capture), the cooperative one as not."""

    class ex:
        broken = None

    def __init__(self, launch=None, pre=()):
        self.calls, self.launch, self.pre, self.post = [], launch, list(pre), []

    def __call__(self, ptr, captured=False):
        self.calls.append((ptr, captured))

    def driver_calls(self):
        return (lambda s, params, extra: self.calls.append((s, True)),
                lambda s, params, extra: self.calls.append((s, False)), 0x8000)


class Executor:
    broken = None

    def __init__(self, events):
        self.order = StreamOrder(events)


def bare_group(monkeypatch, capturing=()):
    """A LaunchGroup with only what the call cache reads (no GPU, no scratch)."""
    ev = Events()
    ev.capturing_streams = set(capturing)
    ev.queried = []

    def status(ptr):   # what cudaStreamIsCapturing answers: 1 capturing, 0 not
        ev.queried.append(ptr)
        return int(ptr in ev.capturing_streams)
    monkeypatch.setattr(group_mod.streams, "capture_query", lambda: status)
    g = LaunchGroup.__new__(LaunchGroup)
    g.executor = Executor(ev)
    g._prepared, g._captured, g._epoch = {}, {}, 0
    return g, ev


def test_reissue_runs_the_prepared_call_until_the_group_drops_it(monkeypatch):
    g, _ = bare_group(monkeypatch)
    call = CountingCall()
    assert g.reissue([1], [2], 8, "float32", "sum") is None       # nothing prepared yet
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    assert g.prepared((1,), (2,), 8, "float32", "sum") is call
    again = g.reissue([1], [2], 8, "float32", "sum")
    assert isinstance(again, Reissue) and again(5) and call.calls == [(5, False)]
    g._drop_prepared()                                           # scratch grew: the call is stale
    assert not again(5) and call.calls == [(5, False)]
    assert g.prepared((1,), (2,), 8, "float32", "sum") is None


def test_reissue_keeps_the_group_order_and_graph_capture_rules(monkeypatch):
    g, ev = bare_group(monkeypatch, capturing={9})
    call = CountingCall()
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    again = g.reissue([1], [2], 8, "float32", "sum")
    again(5)
    again(6)     # another stream: waits for 5
    again(9)     # a capturing stream: captured as a plain node, kept for the group's life
    assert call.calls == [(5, False), (6, False), (9, True)]
    assert ev.log == [("record", 1, 5), ("wait", 6, 1), ("record", 1, 6)]   # nothing recorded in the capture
    assert g._captured == {id(call): call}


@pytest.mark.parametrize("pre", [(), ("a copy",)])
def test_reissue_goes_to_the_launch_itself_only_when_no_copy_surrounds_it(monkeypatch, pre):
    g, _ = bare_group(monkeypatch)
    launch = CountingCall()
    call = CountingCall(launch=launch, pre=pre)
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    again = g.reissue([1], [2], 8, "float32", "sum")
    again(5)
    assert (launch.calls, call.calls) == (([(5, False)], []) if not pre else ([], [(5, False)]))
    assert again.launch is launch
    g._drop_prepared()
    assert again.launch is None


def test_a_repeat_stops_once_the_executor_is_broken(monkeypatch):
    """After a timeout the executor is broken: a repeat issues nothing and returns False, so
    the drop-in takes the full path, whose launch raises CommunicatorBroken naming why."""
    g, _ = bare_group(monkeypatch)
    launch = CountingCall()
    launch.ex = type("Ex", (), {"broken": None})()
    call = CountingCall(launch=launch)
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    again = g.reissue([1], [2], 8, "float32", "sum")
    assert again(5) and launch.calls == [(5, False)]
    launch.ex.broken = "GPU wait timed out"
    assert not again(5) and not again.issue(5) and launch.calls == [(5, False)]


def test_an_unhashable_argument_int_accepts_is_served_but_never_repeated(monkeypatch):
    np = pytest.importorskip("numpy")
    log = []
    comm, backend = make(monkeypatch, log)
    for _ in range(2):
        assert comm.submit("allreduce", np.array(R), R, 1000, NCCL_FLOAT32, NCCL_SUM, ST) == PAIRS.name
    assert log == [("run", R, 1000, ST)] * 2 and comm._repeats == {}


def test_a_capture_begun_on_the_same_stream_between_repeats_is_seen(monkeypatch):
    """The capture query runs on every repeat: a user may begin capturing on the very
    stream the last repeat ran on, and that call must go in as a plain node and be kept."""
    g, ev = bare_group(monkeypatch)
    call = CountingCall()
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    again = g.reissue([1], [2], 8, "float32", "sum")
    again(5)
    ev.capturing_streams.add(5)      # stream.begin_capture() on 5
    again(5)
    ev.capturing_streams.discard(5)  # end_capture()
    again(5)
    assert call.calls == [(5, False), (5, True), (5, False)]
    # The eager calls mark their end (StreamOrder.leave); the captured one records nothing.
    assert g._captured == {id(call): call} and ev.log == [("record", 1, 5)] * 2


def test_the_legacy_stream_is_never_asked_about_capture(monkeypatch):
    # Asking about the legacy stream is an error while another stream captures; it never captures itself.
    g, ev = bare_group(monkeypatch, capturing={0, 1})
    call = CountingCall()
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    again = g.reissue([1], [2], 8, "float32", "sum")
    again(0)
    again(1)
    again(7)
    assert call.calls == [(0, False), (1, False), (7, False)] and ev.queried == [7]


def test_a_repeat_after_a_retire_still_reaps(monkeypatch):
    """The repeat paths skip StreamOrder.enter on an unchanged stream only while nothing
    is retired: once something is, the call goes through and the done events are reaped."""
    g, ev = bare_group(monkeypatch)
    call = CountingCall()
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    again = g.reissue([1], [2], 8, "float32", "sum")
    again(5)
    g.executor.order.retire("old scratch")
    assert g.executor.order.pending == 1
    ev.pending.clear()               # its event has fired
    again(5)
    assert g.executor.order.pending == 0


def test_a_group_open_in_another_thread_leaves_this_threads_repeats_alone(monkeypatch):
    import threading

    log = []
    comm, _ = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    opened, release, result = threading.Event(), threading.Event(), []

    def other():
        cm.groupStart()
        opened.set()
        release.wait(10)
        result.append(comm.submit("allreduce", R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST))
        cm.groupEnd()
    t = threading.Thread(target=other)
    t.start()
    assert opened.wait(10)
    assert comm.submit("allreduce", R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST) == PAIRS.name   # not grouped here
    release.set()
    t.join(10)
    assert result == ["group"] and cm._open_groups == 0
    assert log == [("run", R, 1000, ST), ("again", R, 1000, ST), ("run", R, 1000, ST)]
    assert comm.served == {PAIRS.name: 3}


class _Driver:
    """The two driver calls Launch makes, recorded."""

    class CUDADriverError(Exception):
        pass

    def __init__(self):
        self.log = []

    def launchKernel(self, *args):
        self.log.append(("plain",) + args)

    def launchCooperativeKernel(self, *args):
        self.log.append(("coop",) + args)


@pytest.mark.parametrize("coop", [True, False])
def test_launch_issues_the_packed_call_plain_when_captured_and_refuses_once_broken(coop):
    from runtime_cuda.core.launcher import CommunicatorBroken, Launch

    class Ex:
        broken = None

    launch = Launch.__new__(Launch)
    launch.ex, launch.fn, launch.grid, launch.block, launch.coop, launch.params_ptr = Ex(), 0x70, 6, 512, coop, 0x80
    drv = _Driver()
    launch.bind(drv)
    launch(0x77)
    launch(0x78, True)
    head = (0x70, 6, 1, 1, 512, 1, 1, 0)
    first = ("coop",) + head + (0x77, 0x80) if coop else ("plain",) + head + (0x77, 0x80, 0)
    assert drv.log == [first, ("plain",) + head + (0x78, 0x80, 0)]
    launch.ex.broken = "rank 1 timed out"
    with pytest.raises(CommunicatorBroken, match="rank 1 timed out"):
        launch(0x77)
    assert len(drv.log) == 2


S2, C, D, OP, ROOT = R + 4096, 8, NCCL_FLOAT32, NCCL_SUM, 1
# Every named call with cupy.cuda.nccl's arguments, and the submit call it is (stated here, apart
# from the communicator's own table, so that a wrong entry there fails).
_NAMED_CALLS = {
    "allReduce": ((R, S2, C, D, OP, ST), ("allreduce", R, S2, C, D, OP, ST, 0)),
    "reduceScatter": ((R, S2, C, D, OP, ST), ("reducescatter", R, S2, C, D, OP, ST, 0)),
    "allGather": ((R, S2, C, D, ST), ("allgather", R, S2, C, D, None, ST, 0)),
    "allToAll": ((R, S2, C, D, ST), ("alltoall", R, S2, C, D, None, ST, 0)),
    "bcast": ((R, C, D, ROOT, ST), ("broadcast", R, R, C, D, None, ST, ROOT)),
    "broadcast": ((R, S2, C, D, ROOT, ST), ("broadcast", R, S2, C, D, None, ST, ROOT)),
    "reduce": ((R, S2, C, D, OP, ROOT, ST), ("reduce", R, S2, C, D, OP, ST, ROOT)),
    "send": ((R, C, D, ROOT, ST), ("send", R, 0, C, D, None, ST, ROOT)),
    "recv": ((R, C, D, ROOT, ST), ("recv", 0, R, C, D, None, ST, ROOT)),
}


def _inlined_lookups():
    """name -> (the key tuple of its `self._repeats.get(...)`, the calls it passes its arguments on
    with) for every method of NcclCommunicator that looks a repeat up itself and passes the call on
    (submit itself and prepared_reissue, which issues nothing, aside), read from its source."""
    import ast
    import inspect
    import textwrap

    found = {}
    for name, fn in vars(cm.NcclCommunicator).items():
        if not inspect.isfunction(fn) or fn is cm.NcclCommunicator.submit:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        keys = [ast.unparse(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and ast.unparse(node.func) == "self._repeats.get"]
        if not keys:
            continue
        passed = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and ast.unparse(node.func) in ("self._submit", "self._pointer_broadcast", "self._pointer_reduce")]
        if passed:
            found[name] = (keys, [ast.unparse(node) for node in passed])
    return found


def test_the_named_calls_table_is_every_method_with_its_own_repeat_lookup():
    assert set(_inlined_lookups()) == set(_NAMED_CALLS) | {"_pointer_reduce", "_pointer_broadcast"}


@pytest.mark.parametrize("name", sorted(set(_NAMED_CALLS) - {"broadcast", "reduce"}
                                        | {"_pointer_reduce", "_pointer_broadcast"}))
def test_a_named_calls_repeat_key_is_what_it_passes_to_submit(name):
    (key,), (passed,) = _inlined_lookups()[name]
    assert passed == f"self._submit{key}"


@pytest.mark.parametrize("name, pointer", [("broadcast", "_pointer_broadcast"), ("reduce", "_pointer_reduce")])
def test_the_either_form_calls_look_up_their_pointer_forms_key(name, pointer):
    (key,), _ = _inlined_lookups()[name]
    assert [key] == _inlined_lookups()[pointer][0]


def test_the_drop_in_defines_its_methods_in_source():
    # A traceback through a named call shows the communicator's own file.
    assert cm.NcclCommunicator.allReduce.__code__.co_filename == cm.__file__
    assert cm.NcclCommunicator.broadcast.__qualname__ == "NcclCommunicator.broadcast"


@pytest.mark.parametrize("name", sorted(_NAMED_CALLS))
@pytest.mark.parametrize("inplace", [True, False])
def test_every_named_call_is_submit_with_its_arguments_and_repeats_as_submit_does(monkeypatch, name, inplace):
    # The named methods inline submit's repeat lookup: they must build the same key and
    # fall back to the same call, first call and repeats alike, served by gc3 (the all-pairs
    # IR: allreduce in place) or by NCCL.
    named_args, submit_args = _NAMED_CALLS[name]
    if inplace:
        named_args = tuple(R if a == S2 else a for a in named_args)
        submit_args = tuple(R if a == S2 else a for a in submit_args)
    logs, served, chosen = [], [], []
    from runtime_cuda.nccl.fallback import NcclFallback   # its alltoall stages through CuPy: record it instead
    monkeypatch.setattr(NcclFallback, "_alltoall", lambda self, c: self.comm.allToAll(c.sendbuf, c.recvbuf, c.count,
                                                                                         c.dtype, c.stream))
    monkeypatch.setattr(NcclFallback, "_alltoall_bound", lambda self, c, src: lambda stream: self.comm.allToAll(
        src, c.recvbuf, c.count, c.dtype, stream))
    for how in ("named", "submit"):
        log, picks = [], []
        comm, _ = make(monkeypatch, log)
        choose = comm._dispatch.selector.choose
        monkeypatch.setattr(comm._dispatch.selector, "choose", lambda call: picks.append(call) or choose(call))
        for _ in range(3):
            if how == "named":
                assert getattr(comm, name)(*named_args) is None   # cupy's methods return nothing
            else:
                comm.submit(*submit_args)
        logs.append(log)
        served.append(dict(comm.served))
        chosen.append(len(picks))
    assert logs[0] == logs[1] and len(logs[0]) == 3
    assert served[0] == served[1] and sum(served[0].values()) == 3
    assert chosen[0] == chosen[1]


def test_a_named_repeat_is_one_lookup_and_the_prepared_call(monkeypatch):
    log = []
    comm, _ = make(monkeypatch, log)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    monkeypatch.setattr(comm, "_submit", lambda *a: pytest.fail("a repeat left the named call's own lookup"))
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    assert log[-1] == ("again", R, 1000, ST) and comm.served == {PAIRS.name: 2}


@pytest.mark.parametrize("name", ["broadcast", "reduce", "bcast", "allGather", "reduceScatter"])
def test_a_repeat_routed_to_nccl_is_looked_up_in_the_named_call_too(monkeypatch, name):
    log = []
    comm, _ = make(monkeypatch, log)
    args = _NAMED_CALLS[name][0]
    getattr(comm, name)(*args)
    for path in ("_submit", "_pointer_broadcast", "_pointer_reduce"):
        monkeypatch.setattr(comm, path, lambda *a, **k: pytest.fail("a repeat left the named call's own lookup"))
    getattr(comm, name)(*args)
    assert len(log) == 2 and log[0] == log[1] and comm.served == {"NCCL": 2}


def test_a_repeat_under_the_groups_own_order_marks_its_end_once(monkeypatch):
    """A communicator's launch groups order their calls by the communicator's own order
    (Gc3Backend.prepare): a repeat bound with that order enters and leaves it once, so a
    call costs one event record, not one per order."""
    g, ev = bare_group(monkeypatch)
    call = CountingCall()
    g._prepared[g._key([1], [2], 8, "float32", "sum")] = call
    shared = g.reissue([1], [2], 8, "float32", "sum").bind(5, g.executor.order, [0])
    assert shared() and shared()
    assert ev.log == [("record", 1, 5)] * 2
    apart = StreamOrder(ev)                     # an order of its own: each marks the end
    twice = g.reissue([1], [2], 8, "float32", "sum").bind(5, apart, [0])
    ev.log.clear()
    assert twice()
    assert sorted(ev.log) == [("record", 1, 5), ("record", 2, 5)]


class Exchange:
    def __init__(self, order):
        self.order = order

    def all_agree(self, ok, why):
        return [why, ""]


def test_prepare_gives_a_new_group_the_communicators_order(monkeypatch):
    ev = Events()
    be, cand, _ = backend_with_group(monkeypatch, [])
    be._groups, be._failed, be.device = {}, {}, 0
    be.exchange = Exchange(StreamOrder(ev))
    be.order = be.exchange.order
    made = []

    def ranks(prog, exchange, device):
        made.append(type("Group", (), {"executor": Executor(ev), "close": lambda self: None})())
        return made[-1]
    be._IpcRanks = ranks
    assert be.prepare(Decision(Call("allreduce", R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST, 2, 0), cand)) is None
    assert made[0].executor.order is be.exchange.order


def test_the_communicator_gives_its_backend_its_order_whatever_the_exchange(monkeypatch):
    """from_mpi's exchange is no NCCL call and carries no order: the communicator hands its
    order to the backend itself."""
    class OrderedGc3(RepeatingGc3):
        order = None
    backend = OrderedGc3([])
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    comm._setup(RecordingNccl([]), 2, 0, lambda *a: backend, order=StreamOrder(Events()))
    assert backend.order is comm._order


class StreamObject:
    """What owner() finds for a stream: a CuPy Stream that destroys it when it dies."""

    def __init__(self, gone, ptr):
        self.gone, self.ptr = gone, ptr

    def __del__(self):
        self.gone.add(self.ptr)


def test_a_repeat_on_a_stream_whose_owner_is_known_records_nothing_until_the_switch(monkeypatch):
    """CuPy's current stream: the communicator holds it while it is the last one, so its calls,
    first and repeated, record no mark; the call on the next stream marks its end there once,
    then lets it go (and a user who dropped it sees it destroyed)."""
    import weakref
    from runtime_cuda.nccl import dispatch
    log, gone = [], set()
    ev = GoneStreamsEvents(gone)
    owners = {11: StreamObject(gone, 11)}
    monkeypatch.setattr(dispatch, "owner", lambda ptr: owners.get(ptr))
    monkeypatch.setattr(cm, "owner_ref", lambda ptr: weakref.ref(owners[ptr]) if ptr in owners else None)
    comm, _ = make(monkeypatch, log, events=ev)
    for _ in range(3):
        comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, 11)
    assert [e[0] for e in log] == ["run", "again", "again"] and ev.log == []
    del owners[11]                      # the user drops the stream: only the communicator holds it
    assert gone == set()
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, 22)
    assert ev.log[:2] == [("record", 1, 11), ("wait", 22, 1)] and gone == {11}


class GoneStreamsEvents(Events):
    def __init__(self, gone):
        super().__init__()
        self.gone = gone

    def record(self, event, stream):
        assert stream not in self.gone, f"stream {stream} used after its owner destroyed it"
        super().record(event, stream)

    def wait(self, stream, event):
        assert stream not in self.gone, f"stream {stream} used after its owner destroyed it"
        super().wait(stream, event)


def test_the_cpu_host_path_bench_still_drives_the_real_path():
    """runtime_cuda.benchmarks.host_path_cpu stubs only the driver and CUDA's events: a change to
    the per-call path that its stand-ins do not cover shows here, not first on a GPU machine."""
    import subprocess
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "runtime_cuda.benchmarks.host_path_cpu", "--calls", "100"],
                          capture_output=True, text=True, timeout=120, cwd=repo,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = dict(line.split()[:2] for line in proc.stdout.splitlines() if not line.startswith("#"))
    assert set(rows) == {"held", "repeat", "counted", "named", "nccl", "nccl-ev", "direct", "full", "stub"}
    assert all(float(v) > 0 for v in rows.values())


def test_a_counting_launch_is_its_streams_mark_on_the_repeat_path(monkeypatch):
    """The drop-in's repeat of a launch whose blocks count themselves (the small kernels'),
    through the real communicator, launch group and stream order (runtime_cuda.benchmarks.
    host_path_cpu's stand-ins): on a stream passed by handle no event is recorded, each call
    adds its blocks to the order's total, and the switch waits for the total; on the legacy
    stream the count marks nothing (the switch records there); a captured call takes the
    parameter block that passes no counter and counts nothing."""
    from runtime_cuda.benchmarks import host_path_cpu as hp
    from runtime_cuda.core import streams

    capturing = {0x55}
    buf, cbuf, n = 0x2000_0000, 0x3000_0000, 256
    # build() sets these for its whole process; here they are put back after the test.
    monkeypatch.setenv("GC3_XML_FILES", str(hp.PAIRS))
    monkeypatch.delenv("GC3_DEBUG", raising=False)
    monkeypatch.setattr(streams, "_capture_status", streams._capture_status)
    comm = hp.build(n, buf, 0x77, cbuf)
    streams._capture_status = lambda p: int(p in capturing)   # for the repeats bound from here
    order, log = comm._order, []

    class Rec:
        new = staticmethod(lambda: 1)

        def record(self, event, stream):
            log.append(("record", stream))

        def wait(self, stream, event):
            log.append(("wait", stream))

        def wait_value(self, stream, address, value):
            log.append(("count", stream, value))

        def capturing(self, stream):
            return stream in capturing
    order._events = Rec()
    launches = []
    launch = None

    def call(stream):
        return comm.submit("allreduce", cbuf, cbuf, n, NCCL_FLOAT32, NCCL_SUM, stream)

    for stream in (0x77, 0, 0x55):
        call(stream)                    # the full path: it marks with an event, as before
        hit = comm._repeats[("allreduce", cbuf, cbuf, n, NCCL_FLOAT32, NCCL_SUM, stream, 0)]
        launch = hit[2].launch
        assert launch.counting == (order, 4)
    launch._plain = lambda s, params, extra: launches.append(("plain", s, params))
    launch._coop = lambda s, params, extra=0: launches.append(("coop", s, params))
    comm._repeats.clear()
    for stream in (0x77, 0, 0x55):      # bound again, to the recording launches
        call(stream)
    del log[:], launches[:]
    total = order.total
    call(0x77)                          # from the legacy stream (0x55's capture took no part)
    call(0x77)
    call(0x77)
    assert log == [("record", 0), ("wait", 0x77)]   # then no event on 0x77 itself
    assert order.total == total + 12 and order.counted_on == 0x77
    call(0x88)                          # its first call: the full path (here a stand-in that counts nothing)
    assert log[2] == ("count", 0x88, total + 12) and ("record", 0x77) not in log
    call(0x55)                          # captured: its own parameter block, no count
    assert launches[-1] == ("plain", 0x55, launch.captured_params_ptr) and order.total == total + 12
    del log[:]
    call(0)                             # the legacy stream: counted, but the switch marks it
    call(0)
    assert order.total == total + 20 and order.counted_on is None   # 0x88 was marked by its event
    call(0x99)                          # a first call again: the switch, then its full path's records
    assert log[:3] == [("wait", 0), ("record", 0), ("wait", 0x99)]   # 0 waited on 0x88's event
    assert all(p == launch.params_ptr for kind, s, p in launches if s != 0x55)
