"""`gc3 bench`'s check-then-time step (perf_gpu.run_case) on a numpy stand-in
for CuPy: every size is checked, a wrong output is reported with its first
wrong element, and the caller's current stream survives the check."""
import ctypes

import numpy as np
import pytest

from fake_gpu import DevArray, FakeStream, OneRankMpi, install, script


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
    with script("bench_runtime") as br:
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
