"""scripts/bench_host_time.py on the CPU: the catalog it serves its calls from
names one LL candidate per collective (out of place where the library
has one), and the drop-in loads it
whole (the timing itself needs a GPU: see the script's docstring)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench_host_time as bht  # noqa: E402


@pytest.mark.parametrize("nranks", [2, 4])
def test_catalog_has_one_ll_candidate_per_collective(tmp_path, nranks):
    from runtime_cuda.nccl.catalog import check_config

    chosen = bht.write_catalog(tmp_path, nranks)
    assert set(chosen) == set(bht.COLLS)
    good, problems = check_config(tmp_path / "catalog.json")
    assert problems == [] and {c.name: c.program.inplace for c in good} == dict(chosen.values())
    for c in good:
        assert c.program.proto == "LL" and c.ranks == nranks
        assert c.program.inplace == (c.collective == "allreduce")   # the library's allreduces are in place


def test_arguments_parse_sizes_and_refuse_bad_values(capsys):
    args = bht.parse_args(["--size", "4KiB", "--calls", "50"])
    assert (args.nbytes, args.calls) == (4096, 50)
    assert bht.parse_args([]).nbytes == 1024
    for bad, what in ((["--size", "lots"], "--size"), (["--size", "0"], "--size must be positive"),
                      (["--calls", "5000"], "--calls must be in 2..1000")):
        with pytest.raises(SystemExit):
            bht.parse_args(bad)
        assert what in capsys.readouterr().err


def test_table_has_a_row_per_collective_and_the_drop_ins_margin_over_the_fastest_bare_launch():
    t = {"bare:cuda.bindings": (2.5, 9.0), "bare:cupy": (2.0, 9.0), "eager": (3.25, 9.5),
         "graph100": (0.5, 7.0), "graph1": (4.0, 10.0)}
    lines = bht.format_table([("allreduce", "allreduce_allpairs_2r_LL", t),
                              ("alltoall", "alltoall_direct_2r_LL", dict(t, eager=(2.75, 9.0)))],
                             "1KiB", 2, "NVIDIA H100 80GB HBM3")
    assert lines[0] == "# host time per call, 1KiB, 2 processes on NVIDIA H100 80GB HBM3"
    head, rows = lines[2].split(), [l.split() for l in lines[3:]]
    assert head == ["collective", "algorithm", "bare:cuda.bindings", "bare:cupy", "eager", "graph100/100",
                    "graph1", "eager-bare"]
    assert [r[0] for r in rows] == ["allreduce", "alltoall"]
    assert rows[0][2:] == ["2.50/9.00", "2.00/9.00", "3.25/9.50", "0.50/7.00", "4.00/10.00", "1.25"]
    assert rows[1][-1] == "0.75"      # above the cheaper bare launch (CuPy's here), not the first one


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
                           "--size", "1KiB", "--calls", "20"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = [l.split() for l in proc.stdout.splitlines() if l.split() and l.split()[0] in bht.COLLS]
    assert sorted(r[0] for r in rows) == sorted(bht.COLLS), out[-4000:]
    for r in rows:
        host_us = [float(c.split("/")[0]) for c in r[2:-1]]
        assert all(0 < h < 1e5 for h in host_us), r
