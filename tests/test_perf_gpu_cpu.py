"""`gc3 bench`'s check-then-time step (perf_gpu.run_case) on a numpy stand-in
for CuPy: every size is checked, a wrong output is reported with its first
wrong element, and the caller's current stream survives the check."""
import ctypes

import numpy as np
import pytest

from fake_gpu import DevArray, FakeStream, OneRankMpi, install


@pytest.fixture
def fake_cupy(monkeypatch):
    return install(monkeypatch)


def one_rank_host():
    from runtime_cuda.nccl.perf_gpu import Host
    h = Host.__new__(Host)
    h.comm, h.rank, h.size = None, 0, 1
    return h


def copying_issue(corrupt_at=None):
    """A one-rank 'allreduce': the output is the input (plus one element off by 1)."""
    def issue(coll, send, recv, count, dtype, op, stream, root):
        if send != recv:
            ctypes.memmove(recv, send, count * 4)
        if corrupt_at is not None:
            (ctypes.c_float * count).from_address(recv)[corrupt_at] += 1.0
        return "fake"
    return issue


@pytest.mark.parametrize("inplace", [False, True])
def test_every_case_is_checked_and_the_first_wrong_element_named(fake_cupy, inplace):
    from runtime_cuda.nccl import perf_gpu
    cfg = perf_gpu.BenchConfig(["allreduce"], [4096], warmup=1, iters=2)
    send = np.zeros(4096, np.uint8).view(DevArray)
    recv = np.zeros(4096, np.uint8).view(DevArray)
    user = FakeStream(1234).use()           # the caller's own s.use()
    bench_stream = FakeStream(99)

    t, wrong, first, route = perf_gpu.run_case(copying_issue(), one_rank_host(), cfg, "allreduce", 4096,
                                               inplace, send, recv, bench_stream)
    assert (wrong, first, route) == (0, "", "fake")
    assert FakeStream.current is user

    t, wrong, first, route = perf_gpu.run_case(copying_issue(corrupt_at=777), one_rank_host(), cfg, "allreduce",
                                               4096, inplace, send, recv, bench_stream)
    assert wrong == 1 and first.startswith("rank 0 output[777] = ")
    assert FakeStream.current is user


def test_unchecked_case_reports_none(fake_cupy):
    from runtime_cuda.nccl import perf_gpu
    cfg = perf_gpu.BenchConfig(["allreduce"], [64], warmup=0, iters=1, check=False)
    buf = np.zeros(64, np.uint8).view(DevArray)
    _, wrong, first, _ = perf_gpu.run_case(copying_issue(corrupt_at=0), one_rank_host(), cfg, "allreduce", 64,
                                           False, buf, buf.copy().view(DevArray), FakeStream(5))
    assert wrong is None and first == ""


@pytest.mark.parametrize("coll", ["allreduce", "allgather", "reducescatter", "alltoall"])
def test_bench_runtime_checks_every_call(fake_cupy, coll):
    from runtime_cuda.benchmarks import runtime_sweep as br
    sbuf = np.zeros(1000, np.float32)
    rbuf = np.zeros(1000, np.float32)
    user = FakeStream(7).use()

    def right():
        rbuf[:] = sbuf                     # one rank: every collective copies

    def stale():
        rbuf[:] = sbuf
        rbuf[999] = -5.0

    assert br.check_once(right, coll, sbuf, rbuf, 1000, OneRankMpi(), FakeStream(3)) == (0, "")
    wrong, first = br.check_once(stale, coll, sbuf, rbuf, 1000, OneRankMpi(), FakeStream(3))
    assert wrong == 1 and first.startswith("rank 0 output[999] = -5.0")
    assert FakeStream.current is user


def test_case_time_is_the_median_round(fake_cupy, monkeypatch):
    """Rounds of back-to-back calls, events between them: one slow round (a
    clock ramp, a neighbour's burst) does not move the case's time."""
    from runtime_cuda.nccl import perf_gpu
    per_round_ms = iter([5.0, 1.0, 2.0, 90.0, 3.0])
    monkeypatch.setattr(fake_cupy.cuda, "get_elapsed_time", lambda a, b: next(per_round_ms))
    cfg = perf_gpu.BenchConfig(["allreduce"], [64], warmup=0, iters=2, check=False, rounds=5)
    buf = np.zeros(64, np.uint8).view(DevArray)
    t, _, _, _ = perf_gpu.run_case(copying_issue(), one_rank_host(), cfg, "allreduce", 64, False, buf,
                                   buf.copy().view(DevArray), FakeStream(5))
    assert t == pytest.approx(3.0 * 1000 / 2)      # median round 3 ms over 2 calls


class CapturingStream(FakeStream):
    """A stream whose graphs record how many calls were captured into them."""

    def __init__(self, ptr, can_capture=True):
        super().__init__(ptr)
        self.can_capture, self.captured, self.graphs = can_capture, None, []

    def begin_capture(self):
        if not self.can_capture:
            raise RuntimeError("capture unsupported")
        self.captured = 0

    def end_capture(self):
        graph = type("Graph", (), {"launch": lambda g, stream: None, "calls": self.captured})()
        self.graphs.append(graph)
        self.captured = None
        return graph


@pytest.mark.parametrize("can_capture", [True, False])
def test_graph_replay_is_timed_up_to_graph_max(fake_cupy, can_capture):
    from runtime_cuda.nccl import perf_gpu
    stream = CapturingStream(9, can_capture)

    def issue(coll, send, recv, count, dtype, op, s, root):
        if stream.captured is not None:
            stream.captured += 1
        return "fake"

    cfg = perf_gpu.BenchConfig(["allreduce"], [64], warmup=0, iters=4, check=False, graph_max=64)
    buf = np.zeros(64, np.uint8).view(DevArray)
    graphs = {}
    t, _, _, _ = perf_gpu.run_case(issue, one_rank_host(), cfg, "allreduce", 64, False, buf,
                                   buf.copy().view(DevArray), stream, graphs)
    if can_capture:
        assert [g.calls for g in stream.graphs] == [perf_gpu.GRAPH_CALLS, 1]
        # fake events read 1 ms between any two: 5 replays of 100 calls, then 4 of one call
        assert graphs == pytest.approx({"graph100": 1000 / 500, "graph1": 1000 / 4})
    else:   # nan, never a replay of calls that were not captured; the eager time stands
        assert set(graphs) == {"graph100", "graph1"} and all(v != v for v in graphs.values())
    assert t == pytest.approx(1000 / 4)
    bigger = {}
    perf_gpu.run_case(issue, one_rank_host(), cfg, "allreduce", 128, False, np.zeros(128, np.uint8).view(DevArray),
                      np.zeros(128, np.uint8).view(DevArray), stream, bigger)
    assert bigger == {}


def test_graph_details_line():
    from runtime_cuda.nccl.perf import Row, measure, graph_details
    row = Row("allreduce", 1024, 256, "float32", "sum", 0, 2)
    for impl, g in (("gc3", 2.5), ("nccl", 5.0)):
        row.results[impl] = {}
        for place in ("oop", "ip"):
            m = measure("allreduce", 1024, 2, 6.0, 0, impl)
            m.graph100_us, m.graph1_us = g, g * 2
            row.results[impl][place] = m
    (line,) = graph_details(row, ("gc3", "nccl"))
    assert "gc3 oop 2.50/5.00 ip 2.50/5.00 | NCCL oop 5.00/10.00" in line
    assert "oop vs NCCL 2.00x" in line
    plain = Row("allreduce", 1024, 256, "float32", "sum", 0, 2)
    plain.results["gc3"] = {"oop": measure("allreduce", 1024, 2, 6.0, 0)}
    assert graph_details(plain, ("gc3",)) == []


class RecordingNccl:
    """cupy.cuda.nccl's communicator methods, recording each call's arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name,) + args)


def test_nccls_repeat_calls_its_method_directly_as_a_users_loop_does(monkeypatch):
    """The bench's NCCL side binds a call's arguments once, so a repeat pays what a user's
    call of NCCL's method pays plus one lookup: no Call built per call (gc3's repeat path has
    the same one lookup)."""
    from runtime_cuda.nccl import perf_gpu

    made = []
    real = perf_gpu.Call
    monkeypatch.setattr(perf_gpu, "Call", lambda *a: made.append(a) or real(*a))
    host = one_rank_host()
    host.size, host.rank = 4, 1
    comm = RecordingNccl()
    issue = perf_gpu._issue_on(comm, host, "NCCL")
    for stream in (7, 7, 7, 9):
        assert issue("allreduce", 100, 200, 64, 9, 0, stream, 0) == "NCCL"
    issue("reducescatter", 100, 200, 16, 9, 0, 7, 0)
    issue("broadcast", 100, 200, 64, 9, None, 7, 2)
    assert comm.calls == [("allReduce", 100, 200, 64, 9, 0, 7)] * 3 + [("allReduce", 100, 200, 64, 9, 0, 9),
                          ("reduceScatter", 100, 200, 16, 9, 0, 7), ("broadcast", 100, 200, 64, 9, 2, 7)]
    assert len(made) == 4      # one per distinct call: the stream is part of what a call is


def test_nccls_alltoall_runs_its_sends_and_receives_on_every_call(monkeypatch):
    from runtime_cuda.nccl import perf_gpu
    from runtime_cuda.nccl.fallback import NcclFallback

    runs = []
    monkeypatch.setattr(NcclFallback, "_alltoall", lambda self, c: runs.append(c.coll))
    monkeypatch.setattr(NcclFallback, "_alltoall_bound", lambda self, c, src: lambda stream: runs.append(c.coll))
    host = one_rank_host()
    host.size = 2
    issue = perf_gpu._issue_on(RecordingNccl(), host, "NCCL")
    for _ in range(3):
        issue("alltoall", 100, 200, 8, 9, None, 7, 0)
    assert runs == ["alltoall"] * 3
