"""runtime_cuda.benchmarks.host_time (scripts/bench_host_time.py) on the CPU: the catalog it
serves its calls from names one LL candidate per collective (out of place where the library
has one), and the drop-in loads it
whole (the timing itself needs a GPU: see the module's docstring)."""
import sys
from pathlib import Path

import pytest

from runtime_cuda.benchmarks import host_time as bht

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("nranks", [2, 4])
def test_catalogs_hold_one_ll_program_per_collective_then_each_small_kernel(tmp_path, nranks):
    from gc3 import limits
    from runtime_cuda.nccl.catalog import check_config

    catalogs = bht.write_catalogs(tmp_path, nranks)
    assert [name for name, _ in catalogs] == ["interpreter.json"] + [f"{k}.json" for k in limits.SMALL_ALLREDUCE_KERNELS]
    (_, chosen), kernels = catalogs[0], catalogs[1:]
    assert set(chosen) == set(bht.COLLS)
    good, problems = check_config(tmp_path / "interpreter.json")
    assert problems == [] and {c.name: c.program.inplace for c in good} == dict(chosen.values())
    for c in good:
        assert c.program.proto == "LL" and c.ranks == nranks
        assert not c.program.inplace          # every collective of the library has an out-of-place program
    # Every small kernel the drop-in can serve gets a row, from a catalog naming only that kernel.
    rows = set()
    for name, served in kernels:
        good, problems = check_config(tmp_path / name)
        assert problems == [] and {c.collective: c.name for c in good} == {k: v[0] for k, v in served.items()}
        assert {c.kernel for c in good} == {name[:-len(".json")]} and all(c.ranks == nranks for c in good)
        rows |= {(c.kernel, c.collective) for c in good}
    assert rows == {(k, coll) for coll, ks in limits.SMALL_KERNELS.items() for k in ks}


def test_named_calls_are_cupys_methods_with_their_own_argument_orders():
    class Comm:
        def __getattr__(self, name):
            return lambda *a: (name, a)

    c = Comm()
    assert bht.named_call(c, "allreduce", 1, 2, 3, 4, 5, 6)() == ("allReduce", (1, 2, 3, 4, 5, 6))
    assert bht.named_call(c, "reducescatter", 1, 2, 3, 4, 5, 6)() == ("reduceScatter", (1, 2, 3, 4, 5, 6))
    assert bht.named_call(c, "allgather", 1, 2, 3, 4, None, 6)() == ("allGather", (1, 2, 3, 4, 6))
    assert bht.named_call(c, "alltoall", 1, 2, 3, 4, None, 6)() == ("allToAll", (1, 2, 3, 4, 6))
    assert bht.named_call(c, "broadcast", 1, 2, 3, 4, None, 6, 1)() == ("broadcast", (1, 2, 3, 4, 1, 6))
    with pytest.raises(ValueError, match="no named call for 'gather'"):
        bht.named_call(c, "gather", 1, 2, 3, 4, None, 6)


def test_arguments_parse_sizes_and_refuse_bad_values(capsys):
    args = bht.parse_args(["--size", "4KiB", "--calls", "50", "--rounds", "3"])
    assert (args.nbytes, args.calls, args.rounds) == (4096, 50, 3)
    assert (bht.parse_args([]).nbytes, bht.parse_args([]).rounds) == (1024, 7)
    for bad, what in ((["--size", "lots"], "--size"), (["--size", "0"], "--size must be positive"),
                      (["--calls", "5000"], "--calls must be in 2..1000"), (["--rounds", "0"], "--rounds must be")):
        with pytest.raises(SystemExit):
            bht.parse_args(bad)
        assert what in capsys.readouterr().err


def test_summary_pairs_each_round_with_the_bare_launcher_of_the_lower_median():
    # cupy's bare launches have the lower median (4.0 against 5.0) though cuda.bindings has the fastest round.
    rounds = {"bare:cuda.bindings": [(5.0, 9.0), (1.0, 9.0), (6.0, 9.0)],
              "bare:cupy": [(4.0, 9.0), (4.5, 9.0), (3.0, 9.0)],
              "eager": [(5.0, 9.0), (5.0, 9.0), (3.25, 9.0)]}
    t = bht.summarize(rounds)
    assert t["bare:cupy"] == {"median": 4.0, "min": 3.0} and t["bare:cuda.bindings"]["min"] == 1.0
    assert t["eager"] == {"median": 5.0, "min": 3.25}
    # per round: 5-4, 5-4.5, 3.25-3 -> median 0.5, not the medians' difference (1.0)
    assert t["eager-bare"] == {"median": 0.5, "min": 0.25, "max": 1.0, "bare": "bare:cupy"}


def test_summary_refuses_uneven_or_missing_columns():
    with pytest.raises(ValueError, match="same, nonzero number of rounds"):
        bht.summarize({"bare:cupy": [(1.0, 1.0)], "eager": [(1.0, 1.0), (2.0, 2.0)]})
    with pytest.raises(ValueError, match="need eager and at least one bare"):
        bht.summarize({"eager": [(1.0, 1.0)]})


def test_table_has_a_row_per_collective_and_the_drop_ins_margin_over_the_bare_launch():
    rounds = {"bare:cuda.bindings": [(2.5, 9.0), (2.75, 9.0)], "bare:cupy": [(2.0, 9.0), (2.25, 9.0)],
              "query": [(0.25, 0.5), (0.5, 0.5)], "launch": [(2.25, 9.0), (2.5, 9.0)],
              "reissue": [(2.75, 9.0), (2.5, 9.0)],
              "eager": [(3.25, 9.5), (3.0, 9.5)]}
    t = dict(bht.summarize(rounds), graph100=(0.5, 7.0), graph1=(4.0, 10.0),
             paired={"bare:cuda.bindings": {"median": 0.5, "q1": 0.25, "q3": 0.75},
                     "bare:cupy": {"median": 1.0, "q1": 0.5, "q3": 1.5}})
    lines = bht.format_table([("allreduce", "allreduce_allpairs_2r_LL", t)], "1KiB", 2, "NVIDIA H100 80GB HBM3",
                             2, 50, 16)
    assert lines[0] == ("# host time per call, 1KiB, 2 processes on NVIDIA H100 80GB HBM3; 2 rounds of 50 calls, "
                        "bare and eager alternating; rank 0 may run on 16 CPU(s)")
    head, rows = lines[2].split(), [l.split() for l in lines[3:]]
    assert head == ["collective", "algorithm", "bare:cuda.bindings", "bare:cupy", "query", "launch", "reissue",
                    "eager", "graph100/100", "graph1", "eager-bare", "range", "paired-cuda.bindings", "paired-cupy"]
    assert rows == [["allreduce", "allreduce_allpairs_2r_LL", "2.62/2.50", "2.12/2.00*", "0.38/0.25", "2.38/2.25",
                     "2.62/2.50",
                     "3.12/3.00", "0.50/7.00", "4.00/10.00", "1.00", "0.75..1.25",
                     "0.50[0.25,0.75]", "1.00[0.50,1.50]"]]


def test_paired_summary_is_the_median_of_per_turn_differences():
    # Turn by turn eager - cupy is 1, 1, 1, 5, 1 (turn 2 was slow for both and cancels; the median
    # ignores turn 4's outlier) and eager - cuda.bindings is 0, 0, 0, 4, -1.
    turns = {"bare:cupy": [1.0, 5.0, 1.0, 1.0, 2.0], "bare:cuda.bindings": [2.0, 6.0, 2.0, 2.0, 4.0],
             "eager": [2.0, 6.0, 2.0, 6.0, 3.0]}
    p = bht.paired_summary(turns)
    assert p["bare:cupy"]["median"] == 1.0 and p["bare:cuda.bindings"]["median"] == 0.0
    assert p["bare:cupy"]["q1"] <= 1.0 <= p["bare:cupy"]["q3"]
    assert "eager" not in p
    with pytest.raises(ValueError, match="same number of turns, at least 4"):
        bht.paired_summary({"bare:cupy": [1.0] * 4, "eager": [1.0] * 5})
    with pytest.raises(ValueError, match="need eager"):
        bht.paired_summary({"bare:cupy": [1.0] * 4})


@pytest.mark.gpu
def test_runs_with_two_processes_sharing_a_gpu():
    import os
    import shutil
    import subprocess

    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")
    pytest.importorskip("mpi4py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.run(["mpirun", "-np", "2", sys.executable, str(ROOT / "scripts" / "bench_host_time.py"),
                           "--size", "1KiB", "--calls", "20", "--rounds", "3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    from gc3 import limits

    rows = [l.split() for l in proc.stdout.splitlines() if l.split() and l.split()[0] in bht.COLLS]
    kernel_rows = sum(len(ks) for ks in limits.SMALL_KERNELS.values())
    assert sorted(r[0] for r in rows) == sorted(list(bht.COLLS) + [c for c, ks in limits.SMALL_KERNELS.items()
                                                                   for _ in ks]), out[-4000:]
    assert len([r for r in rows if r[1].startswith(limits.SMALL_ALLREDUCE_KERNELS)]) == kernel_rows, out[-4000:]
    for r in rows:
        # ... eager-bare, its range, then median[quartiles] paired with each of the two bare launchers
        host_us = [float(c.rstrip("*").split("/")[0]) for c in r[2:-4]]
        assert all(0 < h < 1e5 for h in host_us), r
        assert sum(c.endswith("*") for c in r[2:4]) == 1, r   # the bare launcher the margin is taken against
        lo, hi = (float(x) for x in r[-3].split(".."))
        assert lo <= float(r[-4]) <= hi, r
        for cell in r[-2:]:
            med, q1, q3 = (float(x) for x in cell.replace("[", ",").rstrip("]").split(","))
            assert q1 <= med <= q3, r
