"""runtime_cuda.core.perf.time_rounds, the one timing loop of `gc3 run` and the drop-in's benchmark,
on the CPU: CUDA events replaced by a recorder whose elapsed times are given."""
import ast
import sys
import types
from pathlib import Path

import pytest

from runtime_cuda.core.perf import ROUNDS, time_rounds

ROOT = Path(__file__).resolve().parents[1]


def fake_cupy(monkeypatch, elapsed_ms):
    log = []

    class Event:
        def __init__(self):
            self.n = None

        def record(self, stream=None):
            self.n = len(log)
            log.append(("record", stream))

        def synchronize(self):
            log.append(("sync", None))

    times = iter(elapsed_ms)
    cuda = types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: next(times))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return log


@pytest.mark.parametrize("elapsed_ms, want_us", [
    ([1.0, 9.0, 2.0], 200.0),          # median, not the mean (400)
    ([3.0, 1.0, 2.0, 4.0], 200.0),     # even count: the lower middle
    ([5.0], 500.0),
])
def test_the_median_round_per_call(monkeypatch, elapsed_ms, want_us):
    log = fake_cupy(monkeypatch, elapsed_ms)
    calls = []
    us, last = time_rounds(lambda: calls.append(1) or len(calls), 10, rounds=len(elapsed_ms), stream="s")
    assert us == pytest.approx(want_us)
    assert last == len(calls) == 10 * len(elapsed_ms)
    assert [e for e in log if e[0] == "record"] == [("record", "s")] * (len(elapsed_ms) + 1)
    assert log[-1] == ("sync", None)


def test_default_rounds_and_current_stream(monkeypatch):
    log = fake_cupy(monkeypatch, [1.0] * ROUNDS)
    assert time_rounds(lambda: None, 4) == (pytest.approx(250.0), None)
    assert log.count(("record", None)) == ROUNDS + 1


def _function(rel, name):
    text = (ROOT / rel).read_text()
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node)


@pytest.mark.parametrize("rel, name", [("runtime_cuda/commands/run.py", "_check_and_time"),
                                       ("runtime_cuda/nccl/perf_gpu.py", "run_case")])
def test_run_and_the_benchmark_time_only_through_it(rel, name):
    body = _function(rel, name)
    assert "time_rounds(" in body and "get_elapsed_time" not in body
