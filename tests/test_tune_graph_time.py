"""How a measured tune times a call (runtime_cuda.nccl.tune_gpu.MeasuredTimer), without a GPU:
the bench's case runner is replaced by one that reports given eager and graph times, so the
timer's own arithmetic, rejections and choices are what is tested."""
from __future__ import annotations

import math
import types

import pytest

from runtime_cuda.nccl import tune, tune_gpu


class Host:
    """One rank: every agreement is this rank's own answer."""
    rank, size = 0, 2
    comm = types.SimpleNamespace(allgather=lambda x: [x])


def kernel(label):
    return tune.Variant(label, label, (), 1, "LL", None, None, kernel="oneshot")


def timer(monkeypatch, times, graph_max, nccl=None, rounds=None):
    """A MeasuredTimer whose cases take `times[label] = (eager us, graph us per call or nan)`;
    `rounds` (a dict) gets the eager rounds each (label, bytes) was timed with."""
    def run_case(issue, host, cfg, coll, nbytes, inplace, send, recv, stream, graphs=None):
        label = issue(coll, 0, 0, 1, 0, 0, 0, 0)
        if rounds is not None:
            rounds[label, nbytes] = cfg.rounds
        eager, graph = times[label]
        if graphs is not None and nbytes <= cfg.graph_max:
            graphs["graph100"] = graph
        return eager, 0, "", label

    monkeypatch.setattr(tune_gpu, "run_case", run_case)
    t = object.__new__(tune_gpu.MeasuredTimer)
    t.host, t.dtype, t.rejected, t._nccl_times, t._halves = Host(), "float32", {}, {}, {}
    t.cfg = tune_gpu.BenchConfig(collectives=(), sizes=(), graph_max=graph_max, rounds=tune.ROUNDS)
    t.graph_cfg = tune_gpu.dataclasses.replace(t.cfg, rounds=tune.GRAPH_ROUNDS)
    t.sendbuf = t.recvbuf = t.stream = None
    t.gpu_name, t.fingerprint, t.gpus, t.nccl_note = "GPU", "2xGPU", 2, "NCCL"
    monkeypatch.setattr(tune_gpu.machine, "topology", lambda: {})
    t._nccl = None if nccl is None else (lambda *a: "NCCL")
    if nccl is not None:
        times["NCCL"] = nccl
    group = types.SimpleNamespace(run_ptrs=lambda *a, **k: None, executor=types.SimpleNamespace(check=lambda: None),
                                  close=lambda: None)
    t._groups = {}
    monkeypatch.setattr(t, "_group", lambda cand: group, raising=False)
    monkeypatch.setattr(t, "_serves", lambda group, cand, nbytes: True, raising=False)
    return t


def test_up_to_graph_max_a_call_costs_its_eager_time_plus_its_graph_time(monkeypatch):
    t = timer(monkeypatch, {"a": (8.0, 6.0)}, graph_max=64 << 10)
    assert t.time(kernel("a"), 64 << 10, False) == pytest.approx(14e-6)
    assert t.time(kernel("a"), 128 << 10, False) == pytest.approx(8e-6)    # above: eager alone


def test_calls_timed_in_a_graph_take_the_median_of_more_eager_rounds(monkeypatch):
    """One call the host holds up moves a single round's mean by more than small kernels differ."""
    rounds = {}
    t = timer(monkeypatch, {"a": (8.0, 6.0)}, graph_max=64 << 10, nccl=(12.0, 7.0), rounds=rounds)
    for nbytes in (1024, 64 << 10, 128 << 10):
        t.time(kernel("a"), nbytes, False)
        t.baseline("allreduce", nbytes, False)
    assert tune.GRAPH_ROUNDS > tune.ROUNDS
    assert rounds == {("a", 1024): tune.GRAPH_ROUNDS, ("a", 64 << 10): tune.GRAPH_ROUNDS, ("a", 128 << 10): tune.ROUNDS,
                      ("NCCL", 1024): tune.GRAPH_ROUNDS, ("NCCL", 64 << 10): tune.GRAPH_ROUNDS,
                      ("NCCL", 128 << 10): tune.ROUNDS}
    assert f"median of {tune.GRAPH_ROUNDS} rounds" in t.provenance()["time"]


def test_nccl_is_timed_the_same_way(monkeypatch):
    t = timer(monkeypatch, {}, graph_max=64 << 10, nccl=(12.0, 7.0))
    assert t.baseline("allreduce", 1024, True) == pytest.approx(19e-6)
    assert t.baseline("allreduce", 1 << 20, True) == pytest.approx(12e-6)


def test_a_candidate_a_graph_cannot_capture_is_rejected_with_the_reason(monkeypatch):
    t = timer(monkeypatch, {"a": (8.0, math.nan)}, graph_max=64 << 10)
    assert t.time(kernel("a"), 1024, True) is None
    assert "CUDA graph" in t.rejected["a"]


@pytest.mark.parametrize("graph_max, winner", [(2 << 20, "kernel"), (0, "program")])
def test_the_graph_time_decides_where_eager_times_tie(monkeypatch, graph_max, winner):
    # Host-bound eager calls: the interpreter program's eager time is a shade under the kernel's,
    # while in a graph the kernel takes half its time.  Eager timing alone picks the program.
    t = timer(monkeypatch, {"program": (8.0, 6.4), "kernel": (8.1, 3.1)}, graph_max, nccl=(12.0, 7.0))
    chosen = tune.choose([kernel("program"), kernel("kernel")], [1024, 4096], t, True, "allreduce")
    assert [c.winner.label for c in chosen] == [winner, winner]
    assert "graph" in t.provenance()["time"] if graph_max else t.provenance()["time"] == "eager us per call"


def test_the_graph_time_ranks_gc3s_candidates_whatever_their_eager_times(monkeypatch):
    # Two tunes on one machine timed the same kernels' eager calls 8-18 µs apart while their
    # graph times repeated within a few percent: the sum let that noise choose.
    t = timer(monkeypatch, {"ll128": (7.5, 4.7), "ll": (12.0, 3.1)}, 2 << 20, nccl=(14.0, 9.0))
    chosen = tune.choose([kernel("ll128"), kernel("ll")], [1024], t, True, "allreduce")
    assert chosen[0].winner.label == "ll"
    assert chosen[0].time_s == pytest.approx(15.1e-6)      # the time it is weighed against NCCL by: the sum


def test_above_the_graph_limit_the_eager_time_still_ranks(monkeypatch):
    t = timer(monkeypatch, {"ll128": (7.5, 4.7), "ll": (12.0, 3.1)}, 64 << 10, nccl=(14.0, 9.0))
    chosen = tune.choose([kernel("ll128"), kernel("ll")], [1 << 20], t, True, "allreduce")
    assert chosen[0].winner.label == "ll128"


def test_the_graph_ranked_best_loses_to_nccl_where_its_sum_is_higher(monkeypatch):
    # Ranked by graph time, but weighed against NCCL by the whole: an eager call that loses to
    # NCCL's by more than the graph gains keeps the size with NCCL.
    t = timer(monkeypatch, {"a": (20.0, 3.0)}, 2 << 20, nccl=(9.0, 4.5))
    chosen = tune.choose([kernel("a")], [1024], t, True, "allreduce")
    assert chosen[0].winner is None


def test_nccl_keeps_a_size_where_its_eager_and_graph_times_sum_lower(monkeypatch):
    t = timer(monkeypatch, {"program": (9.0, 11.0)}, 2 << 20, nccl=(12.0, 7.0))
    chosen = tune.choose([kernel("program")], [1024], t, True, "allreduce")
    assert chosen[0].winner is None and chosen[0].time_s == pytest.approx(19e-6)


def test_the_provenance_shows_both_halves_of_each_choice(monkeypatch):
    t = timer(monkeypatch, {"program": (8.0, 6.4), "kernel": (8.1, 3.1)}, 64 << 10, nccl=(12.0, 7.0))
    chosen = tune.choose([kernel("program"), kernel("kernel")], [1024, 1 << 20], t, True, "allreduce")
    tuned = tune.Tuned("allreduce", [], [])
    tuned.choices["inplace"] = chosen
    small, large = tune.choices_record([tuned], t)["allreduce"]["inplace"]
    assert small == {"bytes": 1024, "algorithm": "kernel", "time_us": 11.2, "nccl_us": 19.0, "eager_us": 8.1,
                     "graph_us": 3.1, "nccl_eager_us": 12.0, "nccl_graph_us": 7.0}
    # Above graph_max eager alone decides (the program, a shade faster there), and no halves are shown.
    assert large == {"bytes": 1 << 20, "algorithm": "program", "time_us": 8.0, "nccl_us": 12.0}


def test_where_the_graph_ranked_best_loses_to_nccl_the_next_that_wins_takes_the_size(monkeypatch):
    # The graph ranks gc3's candidates, but only those that beat NCCL on the whole take part:
    # a program fast in a graph and slow eager must not hand the size to NCCL past a kernel
    # that beats NCCL both ways.
    t = timer(monkeypatch, {"program": (20.0, 3.0), "kernel": (8.0, 3.3)}, 2 << 20, nccl=(9.0, 4.5))
    chosen = tune.choose([kernel("program"), kernel("kernel")], [1024], t, True, "allreduce")
    assert chosen[0].winner.label == "kernel"
    assert chosen[0].time_s == pytest.approx(11.3e-6) and chosen[0].nccl_s == pytest.approx(13.5e-6)


def test_a_candidate_already_slower_than_nccl_at_a_smaller_size_is_not_timed(monkeypatch):
    timed = []
    t = timer(monkeypatch, {"slow": (30.0, 25.0), "slower": (40.0, 30.0)}, 2 << 20, nccl=(9.0, 4.5))
    real = t.time
    monkeypatch.setattr(t, "time", lambda cand, nbytes, inplace: timed.append((cand.label, nbytes)) or
                        real(cand, nbytes, inplace))
    chosen = tune.choose([kernel("slow"), kernel("slower")], [1024, 4096], t, True, "allreduce")
    assert [c.winner for c in chosen] == [None, None]
    # At 4 KiB their graph times at 1 KiB (25 and 30 us) already exceed NCCL's whole time (13.5 us).
    assert timed == [("slow", 1024), ("slower", 1024)] and chosen[1].timed == 0


def test_where_nccl_wins_the_provenance_names_gc3s_best_and_its_halves(monkeypatch):
    t = timer(monkeypatch, {"program": (20.0, 3.0), "kernel": (14.0, 3.3)}, 2 << 20, nccl=(9.0, 4.5))
    chosen = tune.choose([kernel("program"), kernel("kernel")], [1024], t, True, "allreduce")
    assert chosen[0].winner is None and chosen[0].runner_up[0].label == "program"   # ranked by graph
    tuned = tune.Tuned("allreduce", [], [])
    tuned.choices["inplace"] = chosen
    [row] = tune.choices_record([tuned], t)["allreduce"]["inplace"]
    assert row == {"bytes": 1024, "algorithm": "NCCL", "time_us": 13.5, "nccl_us": 13.5, "nccl_eager_us": 9.0,
                   "nccl_graph_us": 4.5, "best_gc3": "program", "best_gc3_us": 23.0, "best_gc3_eager_us": 20.0,
                   "best_gc3_graph_us": 3.0}
    lines = []
    tune.choose([kernel("kernel")], [1024], t, True, "allreduce", done=lambda c: lines.append(c))
    assert lines[0].runner_up[0].label == "kernel"
