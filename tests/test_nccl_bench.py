"""`gc3 bench`'s bookkeeping on CPU: nccl-tests' formulas, sweep, table, files."""
import csv
import json

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import cli
from runtime_cuda.nccl import perf

main = cli()   # gc3's CLI with the runtime's commands, installed or not


@pytest.mark.parametrize("coll, n, factor", [
    ("allreduce", 2, 1.0), ("allreduce", 8, 1.75), ("allgather", 4, 0.75), ("reducescatter", 8, 0.875),
    ("alltoall", 2, 0.5), ("broadcast", 8, 1.0), ("reduce", 4, 1.0),
])
def test_busbw_factors_are_nccl_tests(coll, n, factor):
    assert perf.busbw_factor(coll, n) == pytest.approx(factor)
    m = perf.measure(coll, 1 << 30, n, 1e6, 0)          # 1 GiB in one second
    assert m.algbw == pytest.approx((1 << 30) / 1e9)
    assert m.busbw == pytest.approx(m.algbw * factor)


def test_sweep():
    assert perf.sweep(8, 128, 2) == [8, 16, 32, 64, 128]
    assert perf.sweep(8, 100, 4) == [8, 32]
    assert perf.sweep(100, 400, 2, step_bytes=100) == [100, 200, 300, 400]
    with pytest.raises(ValueError):
        perf.sweep(0, 8, 2)
    with pytest.raises(ValueError):
        perf.sweep(16, 8, 2)
    with pytest.raises(ValueError):
        perf.sweep(8, 16, 1)


@pytest.mark.parametrize("coll, nbytes, es, n, count, arg", [
    ("allreduce", 100, 4, 2, 25, 25), ("allgather", 100, 4, 2, 24, 12), ("alltoall", 100, 4, 8, 24, 3),
    ("reducescatter", 64, 2, 4, 32, 8), ("broadcast", 7, 4, 2, 1, 1),
])
def test_counts_split_evenly_over_ranks(coll, nbytes, es, n, count, arg):
    assert perf.element_count(coll, nbytes, es, n) == count
    assert perf.nccl_count(coll, count, n) == arg


def make_rows():
    rows = []
    for nbytes, gc3_t, nccl_t in ((1024, 5.0, 20.0), (1 << 20, 30.0, 30.0)):
        r = perf.Row("allreduce", nbytes, nbytes // 4, "float32", "sum", 0, 2)
        r.results["gc3"] = {"oop": perf.measure("allreduce", nbytes, 2, gc3_t, 0, "ll.xml"),
                            "ip": perf.measure("allreduce", nbytes, 2, gc3_t * 2, 3, "ll.xml")}
        r.results["nccl"] = {"oop": perf.measure("allreduce", nbytes, 2, nccl_t, 0, "NCCL"),
                             "ip": perf.measure("allreduce", nbytes, 2, nccl_t, None, "NCCL")}
        rows.append(r)
    return rows


def test_table_columns_line_up():
    rows = make_rows()
    impls = ("gc3", "nccl")
    head = perf.header("allreduce", 2, "float32", "sum", impls)
    lines = [perf.format_row(r, impls) for r in rows]
    # Every '|' separator sits in the same column in the header and the rows.
    bars = {tuple(i for i, ch in enumerate(line) if ch == "|") for line in head[2:] + lines}
    assert len({b[:4] for b in bars}) == 1 and len(next(iter(bars))) >= 4
    first = lines[0].split()
    assert first[:5] == ["1024", "256", "float32", "sum", "-1"]
    assert "4.00x" in lines[0] and "2.00x" in lines[0] and "ll.xml" in lines[0]
    assert "N/A" in lines[0]                       # an unchecked case says so
    assert "1.00x" in lines[1]
    rows[1].results["gc3"]["ip"].algorithm = "NCCL"
    assert perf.format_row(rows[1], impls).endswith("ll.xml / NCCL  <- WRONG")   # gc3 in-place: 3 wrong
    foot = perf.footer(rows, impls)
    assert "gc3: out of bounds values: 6 FAILED" in foot[0] and "NCCL: out of bounds values: 0 OK" in foot[1]


def test_speedup_is_nccl_time_over_gc3_time():
    r = make_rows()[0]
    assert r.speedup("oop") == pytest.approx(4.0) and r.speedup("ip") == pytest.approx(2.0)


def test_csv_json_and_plot(tmp_path):
    rows = make_rows()
    perf.write_csv(rows, tmp_path / "b.csv")
    perf.write_json(rows, tmp_path / "b.json", {"nranks": 2})
    perf.plot(rows, tmp_path / "b.png", title="t")
    with open(tmp_path / "b.csv") as fh:
        recs = list(csv.DictReader(fh))
    assert [int(r["nbytes"]) for r in recs] == [1024, 1 << 20]
    assert float(recs[0]["speedup_oop"]) == pytest.approx(4.0)
    assert float(recs[0]["gc3_oop_time_us"]) == 5.0 and recs[0]["gc3_oop_algorithm"] == "ll.xml"
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["meta"] == {"nranks": 2} and data["rows"][1]["nccl_ip_wrong"] is None
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_help_and_bad_arguments():
    runner = CliRunner()
    out = runner.invoke(main, ["bench", "--help"])
    assert out.exit_code == 0 and "--stepfactor" in out.output and "alltoall" in out.output
    out = runner.invoke(main, ["bench", "-c", "allreduce,gossip"])
    assert out.exit_code != 0 and "unknown collective(s) gossip" in out.output
    out = runner.invoke(main, ["bench", "-b", "1Q"])
    assert out.exit_code != 0 and "cannot read size '1Q'" in out.output
    out = runner.invoke(main, ["bench", "-b", "1M", "-e", "1K"])
    assert out.exit_code != 0 and "-b" in out.output
