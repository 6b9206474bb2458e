"""runtime_cuda.benchmarks.plot_sweep (scripts/plot_sweep.py) on the CPU: the plot of
runtime_cuda/README.md's 2x H200
table is drawn from exactly that table's rows (fastest candidate per size, the
small sizes from the run after LL threadblock merging), bad logs are refused
naming file and line, and the committed picture stays small."""
import re
from pathlib import Path

import pytest

from gc3.units import parse_size
from runtime_cuda.benchmarks import plot_sweep as ps

ROOT = Path(__file__).resolve().parent.parent


def readme_table():
    text = (ROOT / "runtime_cuda" / "README.md").read_text()
    block = text.split("## Measured (2x H200, NV18")[1].split("```")[1]
    rows = {}
    for line in block.strip().splitlines()[1:]:
        coll, size, program, g_us, _, n_us, _, _, _ = line.split()
        rows[(coll, parse_size(size))] = (program, float(g_us), float(n_us))
    return rows


def test_the_plot_shows_the_readme_table():
    rows = ps.rows_of(ps.DEFAULT_LOGS, [parse_size(u) if u else None for u in ps.DEFAULT_UPTO], 2)
    got = {(r.coll, r.nbytes): next((r.results["gc3"][p].algorithm, r.results["gc3"][p].time_us,
                                     r.results["nccl"][p].time_us) for p in r.results["gc3"]) for r in rows}
    assert got == readme_table()
    assert {p for r in rows for p in r.results["gc3"]} == {"ip", "oop"}
    assert all(("ip" in r.results["gc3"]) == (r.coll == "allreduce") for r in rows)


def test_fastest_candidate_wins_and_earlier_logs_take_their_sizes(tmp_path):
    head = "coll              size  program                gc3 us gc3 busbw  nccl us nccl busbw  ratio  check\n"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(head + "allreduce 1KiB x 9.0 0.1 10.0 0.1 1.1 ok\nallreduce 1KiB y 8.0 0.1 10.0 0.1 1.2 ok\n"
                        "allreduce 4KiB y 3.0 0.1 10.0 0.1 1.2 ok\n")
    b.write_text(head + "allreduce 1KiB z 1.0 0.1 10.0 0.1 9 ok\nallreduce 4KiB z 5.0 0.1 12.0 0.1 2 ok\n")
    rows = ps.rows_of([a, b], [1024, None], 2)
    assert [(r.nbytes, r.results["gc3"]["ip"].algorithm, r.results["gc3"]["ip"].time_us) for r in rows] == [
        (1024, "y", 8.0), (4096, "z", 5.0)]
    assert rows[1].speedup("ip") == pytest.approx(12.0 / 5.0)


@pytest.mark.parametrize("body, needle", [
    ("coll size program gc3 us\nallreduce 1KiB x 1.0\n", ":1: the header has no nccl us column"),
    ("coll size program gc3 us nccl us\nallreduce 1KiB x 1.0\n", ":2: 4 cells, the header names 5"),
    ("coll size program gc3 us nccl us\nallreduce lots x 1.0 2.0\n", ":2: cannot read size 'lots'"),
])
def test_bad_logs_name_file_and_line(tmp_path, body, needle):
    log = tmp_path / "log.txt"
    log.write_text(body)
    with pytest.raises(SystemExit, match=re.escape(needle)):
        ps.read_log(log)


def test_committed_plot_is_small_and_referenced():
    png = ps.DEFAULT_OUT
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size <= 100_000
    assert f"](../measured/{png.name})" in (ROOT / "runtime_cuda" / "README.md").read_text()


def test_writes_a_png(tmp_path):
    out = tmp_path / "p.png"
    assert ps.main([str(ps.DEFAULT_LOGS[1]), "-o", str(out), "--dpi", "30"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
