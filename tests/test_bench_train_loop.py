"""runtime_cuda.benchmarks.train_loop (scripts/bench_train_loop.py) without a GPU: arguments,
the exact data, the table, and the loop itself on a numpy stand-in for CuPy and MPI."""
import ctypes
from collections import Counter

import numpy as np
import pytest

from fake_gpu import OneRankMpi, install
# Imported before any stand-in is installed: the module must not need cupy or mpi4py.
from runtime_cuda.benchmarks import train_loop as tl


def test_arguments():
    a = tl.parse_args([])
    assert (a.steps, a.warmup, a.gc3_only, a.no_nccl) == (200, 5, False, False)
    a = tl.parse_args(["--steps", "7", "--gc3-only", "--no-nccl", "--warmup", "0"])
    assert (a.steps, a.warmup, a.gc3_only, a.no_nccl) == (7, 0, True, True)
    with pytest.raises(SystemExit):
        tl.parse_args(["--steps", "0"])


def test_buffers_are_the_ones_of_the_issue():
    assert tl.SIZES == (1024, 262_144, 5_000_000, 17)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 64])
def test_sum_then_divide_gives_base_exactly(n):
    for b, size in enumerate((1024, 17, 5000)):
        base = tl.base_values(np, b, size)
        ranks = [tl.initial_values(np, r, n, b, size) for r in range(n)]
        assert all(x.dtype == np.float32 for x in ranks)
        if n > 1:
            assert not np.array_equal(ranks[0], base)       # the ranks' data differ
        for order in (range(n), reversed(range(n))):        # any reduction order is exact
            acc = np.zeros(size, np.float32)
            for r in order:
                acc = (acc + ranks[r]).astype(np.float32)
            assert np.array_equal(acc / np.float32(n), base)


def test_first_mismatch():
    want = np.arange(10, dtype=np.float32)
    got = want.copy()
    assert tl.first_mismatch(np, got, want) == (0, -1, 0.0, 0.0)
    got[[3, 7]] = -1
    assert tl.first_mismatch(np, got, want) == (2, 3, -1.0, 3.0)


def test_versions_and_table():
    assert tl.nccl_version_string(22809) == "2.28.9"
    assert tl.nccl_version_string(2708) == "2.7.8"
    rows = [tl.Result("gc3 drop-in", 100.0, 500.0, 25.0, True, "gc3 served 800 of 800 calls"),
            tl.Result("NCCL", note="not available (--no-nccl)")]
    lines = tl.table(rows, ["# head"])
    assert lines[0] == "# head" and "correct" in lines[1]
    assert lines[2].split()[:6] == ["gc3", "drop-in", "100.0", "500.0", "25.0", "20%"]
    assert "yes" in lines[2] and "not available (--no-nccl)" in lines[3]
    assert tl._served_note(Counter({"NCCL": 2, "ring.xml": 6})) == "gc3 served 6 of 8 calls"


class Stream:
    ptr = 42

    def synchronize(self):
        pass


class Comm:
    """A one-rank allreduce; `corrupt` makes it wrong the way a race would."""

    def __init__(self, corrupt=False):
        self.corrupt, self.calls, self.served = corrupt, 0, Counter()

    def allReduce(self, send, recv, count, dtype, op, stream):
        assert (send, dtype, op, stream) == (recv, 7, 0, 42)
        self.calls += 1
        self.served["x.xml"] += 1
        if self.corrupt:
            (ctypes.c_float * count).from_address(recv)[0] += 1


@pytest.fixture
def fake_gpu(monkeypatch):
    install(monkeypatch)


def test_loop_is_checked(fake_gpu):
    comm = Comm()
    r = tl.run_loop(comm, OneRankMpi(), Stream(), steps=3, warmup=2, name="gc3 drop-in")
    assert comm.calls == 5 * 4
    assert r.correct is True and r.note == "gc3 served 20 of 20 calls"
    assert r.total_ms > 0 and r.step_us > 0 and r.host_us_per_call > 0

    r = tl.run_loop(Comm(corrupt=True), OneRankMpi(), Stream(), steps=3, warmup=0, name="gc3 drop-in")
    assert r.correct is False
    assert "wrong elements; first: rank 0 buffer 0 (1024 floats) [0] = " in r.note
