"""`gc3 catalog projection`: the README's projection tables from a model-only
catalog's provenance (runs of one algorithm folded into a size range, busbw at
the range's last size), labelled as a projection; a measured catalog or a file
without provenance is refused by name."""
import json

import pytest
from click.testing import CliRunner

from gc3.cli import main
from gc3.errors import InputError
from runtime_cuda.nccl.tune import projection


def catalog(tmp_path, measured=False):
    pick = lambda b, alg, us: {"bytes": b, "algorithm": alg, "time_us": us, "nccl_us": None}  # noqa: E731
    prov = {"measured": measured, "ranks": 8, "nodes": 1,
            "cost_model": {"preset": "h200", "name": "H200", "calibration": "calibrated on x"},
            "choices": {"allgather": {"outofplace": [pick(1024, "ag_LL", 8.0), pick(4096, "ag_LL", 8.5),
                                                     pick(1 << 30, "ag_S", 2000.0)]},
                        "alltoall": {"inplace": [pick(1024, "a2a_LL", 8.0)]}}}
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 1, "algorithms": [], "provenance": prov}))
    return path


def test_ranges_times_and_busbw(tmp_path):
    lines = projection(catalog(tmp_path))
    assert lines[0].startswith("# PROJECTION (cost model, not measured): 8 ranks on 1 node(s), outofplace")
    rows = [l.split() for l in lines[3:]]
    assert rows[0][:4] == ["allgather", "1", "KiB-4", "KiB"] and rows[0][4:6] == ["ag_LL", "8.0-8.5"]
    busbw = (1 << 30) / 2000e-6 / 1e9 * 7 / 8
    assert rows[1][:4] == ["allgather", "1", "GiB", "ag_S"] and rows[1][5] == f"{busbw:.0f}"
    assert rows[2][:2] == ["alltoall", "all"] and "NCCL" in lines[-1]


def test_measured_or_foreign_files_are_refused(tmp_path):
    with pytest.raises(InputError, match="a measured catalog"):
        projection(catalog(tmp_path, measured=True))
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="x.json: not a catalog written by gc3 tune"):
        projection(bad)


def test_the_command_prints_each_table_and_names_a_file_it_refuses(tmp_path):
    good = catalog(tmp_path)
    r = CliRunner().invoke(main, ["catalog", "projection", str(good), str(good), "--place", "outofplace"])
    assert r.exit_code == 0 and r.output.count("# PROJECTION") == 2
    bad = tmp_path / "m.json"
    bad.write_text(good.read_text().replace('"measured": false', '"measured": true'))
    r = CliRunner().invoke(main, ["catalog", "projection", str(bad)])
    assert r.exit_code == 2 and "m.json" in r.output and "a measured catalog" in r.output
