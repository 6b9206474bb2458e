"""`gc3 tune --model-only`: the cost-model catalog for 2 and 4 ranks is written,
loads as the drop-in loads it (`gc3 catalog check`), every IR in it is proven,
its size ranges tile every (collective, placement) without overlap; the drop-in
serves what the catalog says; a different timer gives a different catalog
through the same writer; the algorithm table matches the files; bad options
exit 2 without a traceback."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gc3 import limits
from gc3.ir.xml_io import read_xml
from gc3.verify import verify
from runtime_cuda.commands import cli
from runtime_cuda.nccl import library, tune
from runtime_cuda.nccl.catalog import DEFAULT_INDEX, check_config
from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_SUM

from test_nccl_dispatch import RecordingGc3, RecordingNccl, stand_in_comm

QUICK = ["--quick", "-e", "16M"]      # sizes 1 KiB, 64 KiB, 4 MiB: the grid's shape, a fraction of its time


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GC3_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "gc3-cache"))


def run(*args):
    return CliRunner().invoke(cli(), ["tune", *map(str, args)])


@pytest.fixture(scope="module", params=[2, 4])
def tuned(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"tune{request.param}") / "catalog.json"
    res = run("--model-only", "--ranks", request.param, *QUICK, "-o", out, "--ir-dir", out.parent / "ir")
    assert res.exit_code == 0, res.output
    return request.param, out, json.loads(out.read_text()), res.output


def test_catalog_passes_catalog_check_and_every_ir_is_proven(tuned):
    ranks, out, catalog, _ = tuned
    res = CliRunner().invoke(cli(), ["catalog", "check", str(out)])
    assert res.exit_code == 0, res.output
    good, problems = check_config(out)
    assert problems == [] and len(good) == len(catalog["algorithms"])
    assert {c.collective for c in good} == set(tune.COLLECTIVES)
    kernels = [e for e in catalog["algorithms"] if "kernel" in e]
    # the cost model gives the small-message kernels the small sizes of the collectives they serve
    assert {e["collective"] for e in kernels} == set(limits.SMALL_KERNELS)
    assert all(e["kernel"] in limits.SMALL_KERNELS[e["collective"]] and e["ranks"] == ranks and
                           e["max_bytes"] <= limits.SMALL_ALLREDUCE_MAX_BYTES for e in kernels), kernels
    for e in catalog["algorithms"]:
        if "kernel" in e:
            continue
        assert e["file"].startswith("ir/")
        prog = read_xml(out.parent / e["file"])
        verify(prog)
        assert (prog.coll, prog.ngpus, prog.inplace, prog.proto) == \
            (e["collective"], ranks, e["inplace"], e["protocol"])


def test_provenance_says_model_only(tuned):
    ranks, _, catalog, _ = tuned
    p = catalog["provenance"]
    assert p["measured"] is False and p["nccl"] == "not measured (model only)"
    assert p["ranks"] == ranks and p["cost_model"]["preset"] == "h200"
    assert "calibrated on" in p["cost_model"]["calibration"] and p["date"]
    assert p["sizes"] == [1 << 10, 1 << 16, 1 << 22]
    assert set(p["choices"]) == set(tune.COLLECTIVES)


def served(catalog, coll, inplace):
    """Per size range, as the drop-in's first-match rule sees the entries: an entry
    whose whole range an earlier one of the placement already serves never matches
    (an in-place IR listed for out-of-place calls, behind the in-place table)."""
    out = []
    for e in catalog["algorithms"]:
        if e["collective"] != coll or not (e["inplace"] if inplace else e["outofplace"]):
            continue
        lo, hi = e["min_bytes"], e["max_bytes"]
        if any(a <= lo and (b is None or (hi is not None and hi <= b)) for a, b in
               ((k["min_bytes"], k["max_bytes"]) for k in out)):
            continue
        out.append(e)
    return out


def test_ranges_are_contiguous_and_disjoint(tuned):
    _, _, catalog, _ = tuned
    for coll in tune.COLLECTIVES:
        for inplace in (True, False):
            entries = served(catalog, coll, inplace)
            assert entries, (coll, inplace)
            assert entries[0]["min_bytes"] == 0 and entries[-1]["max_bytes"] is None, (coll, inplace)
            for a, b in zip(entries, entries[1:]):
                assert b["min_bytes"] == a["max_bytes"] + 1, (coll, inplace, a, b)


def test_summary_names_every_chosen_ir(tuned):
    _, _, catalog, output = tuned
    for e in catalog["algorithms"]:
        assert e["name"] in output
    assert "wrote" in output and "not measured (model only)" in output


def make_comm(monkeypatch, log, catalog):
    monkeypatch.setenv("GC3_CONFIG", str(catalog))
    return stand_in_comm(RecordingNccl(log), 2, 0, lambda *a: RecordingGc3(log),
                         nccl_group=(lambda: log.append(("groupStart",)), lambda: log.append(("groupEnd",))))


def allreduce_served_by(monkeypatch, catalog, count, inplace=True):
    log = []
    recv = 0x2000 if inplace else 0x8000000
    make_comm(monkeypatch, log, catalog).allReduce(0x2000, recv, count, NCCL_FLOAT32, NCCL_SUM, 0x77)
    assert len(log) == 1 and log[0][0] == "gc3", log
    return log[0][1]


@pytest.mark.parametrize("count, suffix", [(1 << 20, ""), (1 << 25, ""), (1 << 25 | 1, "_unfused"),
                                           (1 << 28, "_unfused")])
def test_the_shipped_index_serves_large_out_of_place_allreduce_with_its_own_ring(monkeypatch, count, suffix):
    # out of place, the ring adds the input into the output: no in-place IR behind a copy of the whole input;
    # fused up to 128 MiB (float32: 2**25 elements), unfused above
    assert (allreduce_served_by(monkeypatch, DEFAULT_INDEX, count, inplace=False)
            == f"allreduce_ring_2r_Simple_i64{suffix}.xml")
    assert allreduce_served_by(monkeypatch, DEFAULT_INDEX, count) == f"allreduce_ring_2r_inplace_Simple_i64{suffix}.xml"


def test_the_drop_in_serves_what_the_tuned_catalog_says(tmp_path, monkeypatch):
    out = tmp_path / "c.json"
    assert run("--model-only", "--ranks", 2, *QUICK, "-c", "allreduce", "-o", out).exit_code == 0
    catalog = json.loads(out.read_text())
    count = 1 << 20                      # 4 MiB of float32, in place
    want = next(e["name"] for e in served(catalog, "allreduce", True)
                if e["min_bytes"] <= 4 * count and (e["max_bytes"] is None or 4 * count <= e["max_bytes"]))
    assert allreduce_served_by(monkeypatch, out, count) == want
    # the shipped index serves the same call with another algorithm
    default = allreduce_served_by(monkeypatch, DEFAULT_INDEX, count)
    assert default != want and default == "allreduce_ring_2r_inplace_Simple_i64.xml"


class RingFirst:
    """A timer that knows only one thing: rings are fast.  Shows that candidates,
    choice and writer do not care where times come from (a GPU timer plugs in here)."""
    prices_inplace_copy = True

    def time(self, cand, nbytes, inplace):
        return nbytes * (1e-12 if "ring" in cand.algorithm else 1e-11)

    def baseline(self, coll, nbytes, inplace):
        return 1e-9 if nbytes > 1 << 20 else None     # "NCCL" wins above 1 MiB

    def provenance(self):
        return {"timer": "test", "measured": True, "nccl": "made up"}


def test_another_timer_gives_another_catalog_and_nccl_keeps_its_sizes(tmp_path, monkeypatch):
    sizes = [1 << 10, 1 << 16, 1 << 22]
    results = tune.tune(2, 1, ["allreduce"], sizes, tune.QUICK, RingFirst())
    out = tmp_path / "ring.json"
    prov = tune.provenance(RingFirst(), 2, 1, sizes, tune.QUICK, results, "test")
    catalog = tune.write_catalog(results, out, 2, prov)
    ranges = [(e["min_bytes"], e["max_bytes"], e["name"]) for e in catalog["algorithms"]]
    # the ring in place and out of place; above: NCCL, no entry
    assert ranges == [(0, 524288, "allreduce_ring_2r_inplace_Simple"), (0, 524288, "allreduce_ring_2r_Simple")]
    assert catalog["provenance"]["choices"]["allreduce"]["inplace"][-1]["algorithm"] == "NCCL"
    assert check_config(out)[1] == []
    assert allreduce_served_by(monkeypatch, out, 1024) == "allreduce_ring_2r_inplace_Simple"
    assert allreduce_served_by(monkeypatch, out, 1024, inplace=False) == "allreduce_ring_2r_Simple"
    log = []
    make_comm(monkeypatch, log, out).allReduce(0x2000, 0x2000, 1 << 20, NCCL_FLOAT32, NCCL_SUM, 0x77)
    assert log[0][0] == "allReduce"      # 4 MiB: NCCL


def test_ranges_break_between_grid_sizes():
    a, b = (tune.Variant(n, n, (2,), 1, "Simple", None, None) for n in ("a", "b"))
    ch = [tune.Choice(s, w, 1.0, None, 1) for s, w in ((1024, a), (4096, a), (16384, b), (65536, None))]
    assert tune.ranges(ch) == [(0, 8192, a), (8193, 32768, b), (32769, None, None)]


def test_library_arguments_match_the_files():
    for alg in library.ALGORITHMS.values():
        assert alg.params and set(alg.params) <= set(library.PARAMS), alg.name
    assert library.args("reducescatter_ring", ranks=4, chunks=1, inplace=1) == ("reducescatter_ring", (4, 1, 1))
    assert library.args("allreduce_hierarchical", nodes=2, gpus=4) == ("allreduce_hierarchical", (2, 4))
    # gaps take the file's own int_args defaults
    assert library.args("reducescatter_ring", ranks=4, inplace=1) == ("reducescatter_ring", (4, 1, 1))
    assert library.args("allreduce_ring", ranks=2, inplace=0) == ("allreduce_ring", (2, 1, 1, 0))
    with pytest.raises(Exception, match="not root"):
        library.args("allreduce_ring", ranks=4, root=0)


def test_library_defaults_must_be_literal_ints(tmp_path):
    f = tmp_path / "allreduce_odd.py"
    f.write_text("from gc3 import int_args\nN = 4\nint_args(ranks=N, instances=1)\n")
    with pytest.raises(Exception, match="ranks a default that is not a literal int"):
        library._int_args(f)


def test_the_model_prices_the_input_copy_an_in_place_program_needs_out_of_place():
    """An in-place-only program serves an out-of-place call behind a copy of the input;
    the model adds that copy (so a faster in-place program, such as the two-node
    hierarchical allreduce, still wins out-of-place calls when the copy is worth it)."""
    from gc3.simulator.cost_model import input_copy_seconds

    grid = tune.Grid(instances=(1,), protocols=("Simple",), pipeline_chunks=(1,))
    cands = {c.label: c for c in tune.candidates("allreduce", 2, 1, grid)[0]}
    timer = tune.ModelTimer("h200", 2)
    ip, oop = cands["allreduce_ring_2r_inplace_Simple"], cands["allreduce_ring_2r_Simple"]
    nbytes = 64 << 20
    extra = timer.time(ip, nbytes, False) - timer.time(ip, nbytes, True)
    assert extra == pytest.approx(input_copy_seconds(nbytes, timer.config)) and extra > 2 * nbytes / 5e12
    assert timer.time(oop, nbytes, False) == timer.time(oop, nbytes, True)   # serves it as it is


def test_candidates_respect_the_shape():
    names = {s[0] for s in tune.specs("allreduce", 6, 1, tune.QUICK)}
    assert not any("recursive_doubling" in n for n in names)          # 6 is not a power of two
    assert not any("hierarchical" in n for n in names)
    names = {s[0] for s in tune.specs("alltoall", 8, 2, tune.QUICK)}
    assert {"alltoall_two_step_2x4_LL", "alltoall_three_step_2x4_Simple_i4", "alltoall_direct_8r_LL"} <= names


@pytest.mark.parametrize("args, needle", [
    (["--ranks", 4, "-o", "x.json"], "--model-only"),
    (["--model-only", "-o", "x.json"], "needs --ranks"),
    (["--model-only", "--ranks", 1, "-o", "x.json"], "--ranks 1"),
    (["--model-only", "--ranks", 4, "--nodes", 3, "-o", "x.json"], "must divide"),
    (["--model-only", "--ranks", 4, "--cost", "a100", "-o", "x.json"], "unknown preset"),
    (["--model-only", "--ranks", 4, "-o", "x.yaml"], "name it *.json"),
    (["--model-only", "--ranks", 4, "-o", "no/such/dir/x.json"], "does not exist"),
    (["--model-only", "--ranks", 4, "-b", "1M", "-e", "1K", "-o", "x.json"], "-e"),
    (["--model-only", "--ranks", 4, "-b", "lots", "-o", "x.json"], "cannot read size"),
    (["--model-only", "--ranks", 4, "-c", "gather", "-o", "x.json"], "unknown collective"),
    (["--model-only", "--ranks", 4, "-f", 1, "-o", "x.json"], "-f must be >= 2"),
    (["--model-only", "--ranks", 4, "--graph-max", "1M", "-o", "x.json"], "--graph-max"),
    (["--model-only", "--ranks", 4, "--graph-max", "big", "-o", "x.json"], "cannot read size"),
])
def test_bad_options_exit_2_with_one_clear_line(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run(*args)
    assert res.exit_code == 2 and needle in res.output, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)   # click's exit, no crash
    assert not (tmp_path / "x.json").exists()


def test_progress_reports_each_decided_size_with_the_time_left(tuned):
    _, _, catalog, output = tuned
    lines = [l for l in output.splitlines() if l.startswith("[") and "s left" in l]
    decided = sum(len(per) for c in catalog["provenance"]["choices"].values() for per in c.values())
    assert len(lines) == decided, output[-2000:]
    last = lines[-1]
    assert last.startswith(f"[{len(lines)}/{len(lines)}] {'#' * 20} 100%") and "about 0 s left" in last, last
    assert "\r" not in output          # not a terminal: one line per decided size, no redrawing


def test_progress_bar_fills_with_the_share_done():
    from runtime_cuda.nccl.tune import bar

    assert bar(0, 8) == "." * 20 + "   0%"
    assert bar(3, 8) == "#" * 7 + "." * 13 + "  38%"
    assert bar(8, 8) == "#" * 20 + " 100%"
    assert bar(9, 8) == bar(8, 8) and bar(0, 0) == bar(1, 1)     # never past full, never a division by zero


def test_time_budget_hands_the_sizes_it_did_not_reach_to_nccl_unmeasured(tmp_path):
    sizes = [1 << 10, 1 << 16, 1 << 22]
    now = [0.0]

    class Slow(RingFirst):        # every timing takes 1 s of the budget's clock
        def time(self, cand, nbytes, inplace):
            now[0] += 1.0
            return super().time(cand, nbytes, inplace)

    full = tune.tune(2, 1, ["allreduce", "allgather"], sizes, tune.QUICK, Slow())
    cost = now[0]
    now[0] = 0.0
    results = tune.tune(2, 1, ["allreduce", "allgather"], sizes, tune.QUICK, Slow(),
                        budget=tune.Budget(cost / 3, clock=lambda: now[0]))
    assert not any(c.unmeasured for t in full for cs in t.choices.values() for c in cs)
    for t in results:             # every table got its share: none lost all of its sizes
        for place, cs in t.choices.items():
            assert not cs[0].unmeasured, (t.collective, place)
            assert all(c.winner is None and c.timed == 0 for c in cs if c.unmeasured)
    prov = tune.provenance(RingFirst(), 2, 1, sizes, tune.QUICK, results, "test")
    assert prov["unmeasured"] and all(u.split()[0] in ("allreduce", "allgather") for u in prov["unmeasured"])
    assert "allreduce inplace 4194304" in prov["unmeasured"]
    catalog = tune.write_catalog(results, tmp_path / "c.json", 2, prov)
    assert check_config(tmp_path / "c.json")[1] == []
    assert all(e["max_bytes"] is not None for e in catalog["algorithms"])   # the unmeasured top is NCCL's


def test_no_budget_measures_everything():
    results = tune.tune(2, 1, ["allreduce"], [1 << 10, 1 << 22], tune.QUICK, RingFirst(), budget=tune.Budget(0))
    assert not any(c.unmeasured for cs in results[0].choices.values() for c in cs)


def test_time_budget_option(tmp_path):
    out = tmp_path / "c.json"
    res = run("--model-only", "--ranks", 2, *QUICK, "-c", "allgather", "--time-budget", "1e-9", "-o", out)
    assert res.exit_code == 0, res.output
    assert "time budget spent" in res.output
    prov = json.loads(out.read_text())["provenance"]
    assert prov["unmeasured"] and "--time-budget 1e-09" in prov["command"]
    res = run("--model-only", "--ranks", 2, "--time-budget", "-1", "-o", out)
    assert res.exit_code == 2 and "time budget" in res.output


def test_an_instance_count_over_the_threadblock_limit_becomes_the_widest_that_fits():
    cands, skipped = tune.candidates("alltoall", 4, 1, tune.Grid((1, 4, 64), ("Simple", "LL"), (4,)))
    names = {c.label for c in cands}
    # direct at 4 ranks: 6 threadblocks per instance, so 64 needs 384 > 128 and 16 (96) is the widest
    assert {"alltoall_direct_4r_Simple_i16", "alltoall_direct_4r_inplace_LL_i16"} <= names
    assert not any(n.endswith("_i64") for n in names)
    assert any(s.startswith("alltoall_direct_4r_Simple_i64:") and "max_tbs=128" in s for s in skipped)
    assert all(c.program.ngpus == 4 and c.instances == 16 for c in cands if c.label.endswith("_i16"))


def test_unfused_twins_only_where_fusion_changes_the_program():
    """The grid's unfused candidates: a 2-rank ring's fused rrcs puts a channel's
    sends and receives in one block; its unfused twin has no fused step and a
    block each.  A program that fusion leaves alone gets no twin (the same IR)."""
    grid = tune.Grid(instances=(64,), protocols=("Simple", "LL"), pipeline_chunks=(1,), unfused_instances=(64,))
    cands = {c.label: c for c in tune.candidates("allreduce", 2, 1, grid)[0]}
    fused, unfused = cands["allreduce_ring_2r_inplace_Simple_i64"], cands["allreduce_ring_2r_inplace_Simple_i64_unfused"]
    assert fused.fusion and not unfused.fusion
    steps = lambda c: {st.type for g in c.program.gpus for tb in g.threadblocks for st in tb.steps}  # noqa: E731
    assert "rrcs" in steps(fused) and not steps(unfused) & {"rcs", "rrcs", "rrs"}
    assert len(unfused.program.gpus[0].threadblocks) == 2 * len(fused.program.gpus[0].threadblocks) == 128
    assert not any(l.endswith("_unfused") and "_LL" in l for l in cands)       # Simple only
    assert not [c for c in tune.candidates("reducescatter", 2, 1, grid)[0] if not c.fusion]


def test_the_model_keeps_the_fused_program_on_a_tie():
    """The cost model prices the fused and unfused rings alike (the link bounds both):
    a model-only catalog then names the fused one, listed first."""
    grid = tune.Grid(instances=(64,), protocols=("Simple",), pipeline_chunks=(1,), unfused_instances=(64,))
    cands = [c for c in tune.candidates("allreduce", 2, 1, grid)[0] if c.algorithm == "allreduce_ring" and c.inplace]
    timer = tune.ModelTimer("h200", 2)
    times = [timer.time(c, 1 << 30, True) for c in cands]
    assert [c.fusion for c in cands] == [True, False] and times[0] == pytest.approx(times[1])
    (choice,) = tune.choose(cands, [1 << 30], timer, True, "allreduce")
    assert choice.winner is cands[0]


TOPO_4 = """\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tNV18\tNV18\t0-63\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\t0-63\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tSYS\t0-63\t0\t\tN/A
GPU3\tNV18\tNV18\tSYS\t X \t0-63\t0\t\tN/A

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_topology_names_every_gpu_pairs_link():
    from runtime_cuda.nccl.machine import parse_topology

    t = parse_topology(TOPO_4)
    assert t["gpus"] == 4 and len(t["links"]) == 6
    assert t["links"]["GPU0-GPU1"] == "NV18" and t["links"]["GPU2-GPU3"] == "SYS"
    assert t["summary"] == "NV18 between 5 GPU pairs; SYS between 1 GPU pair"
    one = parse_topology("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n")
    assert one["gpus"] == 1 and one["links"] == {} and one["summary"] == "1 GPU, no pairs"
    assert "unknown" in parse_topology("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_topology_says_why_when_nvidia_smi_cannot_answer():
    import subprocess

    from runtime_cuda.nccl.machine import topology

    def missing(*a, **k):
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    def slow(*a, **k):
        raise subprocess.TimeoutExpired("nvidia-smi", 20)

    def failing(*a, **k):
        return subprocess.CompletedProcess(a[0], 9, "", "Failed to initialize NVML")

    assert "No such file" in topology(missing)["unknown"]
    assert "timed out" in topology(slow)["unknown"]
    assert topology(failing)["unknown"] == "nvidia-smi topo -m exited 9: Failed to initialize NVML"
    ok = topology(lambda *a, **k: subprocess.CompletedProcess(a[0], 0, TOPO_4, ""))
    assert ok["links"]["GPU1-GPU3"] == "NV18"


class _TableTimer:
    """A timer answering from a table {label: seconds} (None: cannot price), recording what it timed."""
    prices_inplace_copy = True

    def __init__(self, table, nccl=None):
        self.table, self.nccl, self.asked = table, nccl, []

    def time(self, cand, nbytes, inplace):
        self.asked.append((cand.label, nbytes))
        t = self.table.get(cand.label)
        return None if t is None else t * nbytes

    def baseline(self, coll, nbytes, inplace):
        return self.nccl

    def provenance(self):
        return {"timer": "table"}


def _cands(n):
    from runtime_cuda.nccl.tune import Variant

    return [Variant(f"c{i}", "x", (), 1, "LL", None, None, kernel="oneshot") for i in range(n)]


def test_the_prior_shortlists_what_it_predicts_near_its_fastest_and_keeps_what_it_cannot_price():
    from runtime_cuda.nccl.tune import Prior

    cands = _cands(7)
    model = _TableTimer({"c0": 5.0, "c1": 1.0, "c2": 1.9, "c3": 2.5, "c4": 30.0, "c6": 2.1})   # c5 unpriced
    pick = lambda p: [c.label for c in p.shortlist(cands, 1, True)]                          # noqa: E731
    assert pick(Prior(model, ratio=2.0, keep=1)) == ["c1", "c2", "c5"]       # within 2x of c1, and c5
    assert pick(Prior(model, ratio=2.0, keep=4)) == ["c1", "c2", "c3", "c5", "c6"]   # its 4 fastest kept
    assert pick(Prior(_TableTimer({}), ratio=2.0, keep=1)) == [c.label for c in cands]  # nothing priced


def test_a_measured_tune_never_times_what_the_prior_rules_out():
    from runtime_cuda.nccl import tune

    cands = _cands(5)
    model = _TableTimer({"c0": 1.0, "c1": 1.2, "c2": 9.0, "c3": 50.0, "c4": 1.5})
    measured = _TableTimer({"c0": 2.0, "c1": 1.0, "c2": 0.5, "c3": 0.1, "c4": 3.0}, nccl=None)
    prior = tune.Prior(model, ratio=2.0, keep=2)
    chosen = tune.choose(cands, [1 << 10, 1 << 20], measured, True, "allreduce", prior=prior)
    timed = {label for label, _ in measured.asked}
    assert timed == {"c0", "c1", "c4"}                  # c2 and c3 predicted > 2x the fastest: never measured
    assert [c.winner.label for c in chosen] == ["c1", "c1"] and [c.ruled_out for c in chosen] == [2, 2]
    # Without a prior the truly fastest (which the model mispriced) is found: the prior trades that risk for time.
    plain = tune.choose(cands, [1 << 10], _TableTimer(measured.table), True, "allreduce")
    assert plain[0].winner.label == "c3" and plain[0].ruled_out == 0
    t = tune.Tuned("allreduce", cands, [], {"inplace": chosen})
    prov = tune.provenance(measured, 2, 1, [1 << 10, 1 << 20], tune.QUICK, [t], "gc3 tune", prior)
    assert prov["prior"] == {"ratio": 2.0, "keep": 2, "timer": "table", "ruled_out": 4}
    assert "prior" not in tune.provenance(measured, 2, 1, [1 << 10], tune.QUICK, [t], "gc3 tune")


@pytest.mark.parametrize("args, needle", [
    (["--model-only", "--ranks", 2, "--prior", 2, "-o", "x.json"], "--prior rules out candidates"),
    (["--model-only", "--ranks", 2, "--prior", 0.5, "-o", "x.json"], "--prior rules out candidates"),
])
def test_prior_with_the_model_alone_is_refused(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run(*args)
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "x.json").exists()


def test_irs_go_to_a_folder_named_after_the_catalog(tmp_path):
    """Without --ir-dir, `-o X.json` puts its IRs into X.d/, not loose beside X.json."""
    out = tmp_path / "cat.json"
    res = run("--model-only", "--ranks", 2, "-c", "allgather", *QUICK, "-o", out)
    assert res.exit_code == 0, res.output
    files = [e["file"] for e in json.loads(out.read_text())["algorithms"] if "file" in e]
    assert files and all(f.startswith("cat.d/") for f in files), files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cat.d", "cat.json"]
    assert all((tmp_path / f).is_file() for f in files)
    good, problems = check_config(out)      # the drop-in finds them there
    assert problems == [] and good
