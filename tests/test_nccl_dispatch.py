"""The communicator's routing on CPU: cupy.cuda.nccl's argument order reaches
NCCL unchanged, gc3 gets what selection gives it, groups go all-gc3 or
all-NCCL.  NCCL and the gc3 runtime are recorders here; the GPU tests run the
real ones."""
from pathlib import Path

import pytest

from gc3.errors import CommunicatorError
from runtime_cuda.nccl import communicator as cm
from runtime_cuda.nccl.arrays import is_array
from runtime_cuda.nccl.backend import Unavailable
from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_FLOAT64, NCCL_INT32, NCCL_MAX, NCCL_SUM
from runtime_cuda.core.streams import StreamOrder

PAIRS = Path(__file__).parent / "data" / "msccl" / "allreduce_allpairs_2r_1i.xml"
S, R, ST = 0x1000_0000, 0x2000_0000, 0x77


class RecordingNccl:
    """Stands in for cupy.cuda.nccl.NcclCommunicator: records each call and its arguments."""

    def __init__(self, log):
        self.log = log

    def device_id(self):
        return 0

    def __getattr__(self, name):
        return lambda *args: self.log.append((name,) + args)


class RecordingGc3:
    def __init__(self, log, prepare_error=None):
        self.log, self.prepare_error, self.closed = log, prepare_error, False

    def check(self, cand, call):
        return None

    def prepare(self, decision):
        return self.prepare_error

    def run(self, decision):
        c = decision.call
        self.log.append(("gc3", decision.candidate.name, c.coll, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op,
                         c.stream))

    def close(self):
        self.closed = True


@pytest.fixture
def log():
    return []


def stand_in_comm(raw, size, rank, backend_factory, **kw):
    """A drop-in communicator over stand-ins.  Its stream order records events instead of
    calling CUDA: the stream handles these tests pass are made up, and on a GPU machine
    CUDA would be handed them (a segfault, not a failure)."""
    from test_dropin_streams import Events

    kw.setdefault("order", StreamOrder(Events()))
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    comm._setup(raw, size, rank, backend_factory, **kw)
    return comm


def make_comm(log, monkeypatch, backend=None, env=None, rank=0):
    for k, v in (env or {"GC3_XML_FILES": str(PAIRS)}).items():
        monkeypatch.setenv(k, v)
    backend = backend or RecordingGc3(log)
    return stand_in_comm(RecordingNccl(log), 2, rank, lambda *a: backend,
                         nccl_group=(lambda: log.append(("groupStart",)), lambda: log.append(("groupEnd",))))


def test_in_place_allreduce_runs_gc3_with_the_callers_arguments(log, monkeypatch):
    comm = make_comm(log, monkeypatch)
    comm.allReduce(R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)
    assert log == [("gc3", PAIRS.name, "allreduce", R, R, 1000, NCCL_FLOAT32, NCCL_SUM, ST)]
    assert comm.submit("allreduce", S, R, 10, NCCL_FLOAT32, NCCL_SUM, ST) == "NCCL"
    assert comm.served == {PAIRS.name: 1, "NCCL": 1}


@pytest.mark.parametrize("method, args, expect", [
    ("allReduce", (S, R, 10, NCCL_FLOAT32, NCCL_MAX, ST), ("allReduce", S, R, 10, NCCL_FLOAT32, NCCL_MAX, ST)),
    ("reduce", (S, R, 10, NCCL_INT32, NCCL_SUM, 1, ST), ("reduce", S, R, 10, NCCL_INT32, NCCL_SUM, 1, ST)),
    ("broadcast", (S, R, 10, NCCL_FLOAT64, 1, ST), ("broadcast", S, R, 10, NCCL_FLOAT64, 1, ST)),
    ("bcast", (R, 10, NCCL_FLOAT64, 1, ST), ("broadcast", R, R, 10, NCCL_FLOAT64, 1, ST)),
    ("reduceScatter", (S, R, 10, NCCL_FLOAT32, NCCL_SUM, ST), ("reduceScatter", S, R, 10, NCCL_FLOAT32, NCCL_SUM, ST)),
    ("allGather", (S, R, 10, NCCL_FLOAT32, ST), ("allGather", S, R, 10, NCCL_FLOAT32, ST)),
    ("send", (S, 10, NCCL_FLOAT32, 1, ST), ("send", S, 10, NCCL_FLOAT32, 1, ST)),
    ("recv", (R, 10, NCCL_FLOAT32, 1, ST), ("recv", R, 10, NCCL_FLOAT32, 1, ST)),
])
def test_unserved_calls_reach_nccl_with_cupy_argument_order(log, monkeypatch, method, args, expect):
    comm = make_comm(log, monkeypatch)
    getattr(comm, method)(*args)
    assert log == [expect]


def test_identity_methods(log, monkeypatch):
    comm = make_comm(log, monkeypatch, rank=1)
    assert (comm.rank_id(), comm.size(), comm.device_id()) == (1, 2, 0)
    comm.destroy()
    assert comm._backend.closed and log == [("destroy",)]


def test_group_served_entirely_by_gc3(log, monkeypatch):
    comm = make_comm(log, monkeypatch)
    cm.groupStart()
    comm.allReduce(R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)
    comm.allReduce(R + 64, R + 64, 16, NCCL_FLOAT32, NCCL_SUM, ST)
    assert log == []                     # nothing runs before groupEnd
    cm.groupEnd()
    assert [(e[0], e[3], e[5]) for e in log] == [("gc3", R, 8), ("gc3", R + 64, 16)]
    assert comm.served == {PAIRS.name: 2}


def test_one_unsupported_call_sends_the_whole_group_to_nccl(log, monkeypatch, capsys):
    comm = make_comm(log, monkeypatch, env={"GC3_XML_FILES": str(PAIRS), "GC3_DEBUG": "INFO"})
    capsys.readouterr()
    cm.groupStart()
    comm.allReduce(R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)      # gc3 could serve this one ...
    comm.send(S, 8, NCCL_FLOAT32, 1, ST)                     # ... but not this
    cm.groupEnd()
    assert log == [("groupStart",), ("allReduce", R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST),
                   ("send", S, 8, NCCL_FLOAT32, 1, ST), ("groupEnd",)]
    err = capsys.readouterr().err
    assert "the whole group goes to NCCL" in err and "send count=8" in err
    assert comm.served == {"NCCL": 2}


def test_group_with_unmatched_collective_goes_to_nccl(log, monkeypatch):
    comm = make_comm(log, monkeypatch)
    cm.groupStart()
    comm.allReduce(R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)
    comm.allReduce(S, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)      # out-of-place: no IR serves it
    cm.groupEnd()
    assert [e[0] for e in log] == ["groupStart", "allReduce", "allReduce", "groupEnd"]


def test_nested_groups_run_at_the_outermost_end(log, monkeypatch):
    comm = make_comm(log, monkeypatch)
    cm.groupStart()
    cm.groupStart()
    comm.allReduce(R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)
    cm.groupEnd()
    assert log == []
    cm.groupEnd()
    assert [e[0] for e in log] == ["gc3"]


def test_group_end_without_start():
    with pytest.raises(CommunicatorError, match="without a matching groupStart"):
        cm.groupEnd()


def test_failed_setup_falls_back_and_says_why(log, monkeypatch, capsys):
    backend = RecordingGc3(log, prepare_error="rank 1 could not open the IPC handle")
    comm = make_comm(log, monkeypatch, backend=backend, env={"GC3_XML_FILES": str(PAIRS), "GC3_DEBUG": "INFO"})
    comm.allReduce(R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)
    assert log == [("allReduce", R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)]
    assert "could not be set up: rank 1 could not open the IPC handle" in capsys.readouterr().err


def test_unavailable_runtime_is_the_logged_reason(log, monkeypatch, capsys):
    comm = make_comm(log, monkeypatch, backend=Unavailable("gc3 CUDA runtime cannot load (no cupy)"),
                     env={"GC3_XML_FILES": str(PAIRS), "GC3_DEBUG": "INFO"})
    comm.allReduce(R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)
    assert log == [("allReduce", R, R, 8, NCCL_FLOAT32, NCCL_SUM, ST)]
    assert "allreduce_allpairs_2r_1i.xml: runtime (gc3 CUDA runtime cannot load (no cupy))" in capsys.readouterr().err


@pytest.mark.parametrize("call, needle", [
    (lambda c: c.allReduce(S, R, 8, 42, NCCL_SUM, 0), "unknown NCCL datatype code 42"),
    (lambda c: c.allReduce(S, R, 8, NCCL_FLOAT32, 9, 0), "unknown NCCL reduction op code 9"),
    (lambda c: c.allReduce(S, R, -1, NCCL_FLOAT32, NCCL_SUM, 0), "count must be >= 0"),
    (lambda c: c.broadcast(S, R, 8, NCCL_FLOAT32, 2, 0), "root 2 is not a rank"),
    (lambda c: c.send(S, 8, NCCL_FLOAT32, -1, 0), "peer -1 is not a rank"),
])
def test_bad_arguments_name_rank_and_call(log, monkeypatch, call, needle):
    comm = make_comm(log, monkeypatch)
    with pytest.raises(CommunicatorError, match=needle) as err:
        call(comm)
    assert "rank 0" in str(err.value) and log == []


class DeviceArray:
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_broadcast_and_reduce_tell_array_form_from_pointer_form():
    assert is_array((DeviceArray(),), {}) and is_array((), {"x": DeviceArray()})
    assert not is_array((S, R, 10, NCCL_FLOAT32, 0, ST), {}) and not is_array((), {})


def test_pointer_broadcast_and_reduce_keep_cupy_keywords(log, monkeypatch):
    comm = make_comm(log, monkeypatch)
    comm.broadcast(sendbuff=S, recvbuff=R, count=4, datatype=NCCL_FLOAT32, root=1, stream=ST)
    comm.reduce(S, R, 4, NCCL_FLOAT32, NCCL_MAX, 0, ST)
    assert log == [("broadcast", S, R, 4, NCCL_FLOAT32, 1, ST), ("reduce", S, R, 4, NCCL_FLOAT32, NCCL_MAX, 0, ST)]


def test_nccls_alltoall_bound_once_copies_its_block_then_one_group_of_pairs(monkeypatch):
    """The all-to-all NCCL serves (gc3's extension: cupy's NCCL has none), bound for repeats: the
    rank's own block copied on the stream, then one group of a send and a receive per peer, at
    the peer's block of each buffer."""
    import sys
    import types

    from runtime_cuda.nccl.call import Call
    from runtime_cuda.nccl.fallback import NcclFallback

    log = []
    runtime = types.SimpleNamespace(memcpyDeviceToDevice=3,
                                    memcpyAsync=lambda *a: log.append(("copy",) + a))
    cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", runtime)
    fb = NcclFallback(RecordingNccl(log), (lambda: log.append(("start",)), lambda: log.append(("end",))))
    call = Call("alltoall", 0x1000, 0x8000, 4, 7, None, 55, 3, 1)   # 4 float32 (dtype 7) a peer, rank 1 of 3
    go = fb.bind(call)
    for stream in (55, 66):
        del log[:]
        go(stream)
        assert log == [("copy", 0x8000 + 16, 0x1000 + 16, 16, 3, stream), ("start",),
                       ("send", 0x1000, 4, 7, 0, stream), ("recv", 0x8000, 4, 7, 0, stream),
                       ("send", 0x1000 + 32, 4, 7, 2, stream), ("recv", 0x8000 + 32, 4, 7, 2, stream), ("end",)]
    # In place: staged through a copy allocated per call, on the stream the repeat passes.
    staged = []
    monkeypatch.setattr(fb, "_alltoall", lambda c: staged.append((c.sendbuf, c.recvbuf, c.stream)))
    again = fb.bind(Call("alltoall", 0x1000, 0x1000, 4, 7, None, 55, 3, 1))
    again(55)
    again(66)
    assert staged == [(0x1000, 0x1000, 55), (0x1000, 0x1000, 66)]
