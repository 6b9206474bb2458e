"""`gc3 simulate` on the command line, the cost model and the timeline."""
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.cli import main
from gc3.simulator import simulate
from gc3.simulator.cost_config import preset
from gc3.ir.xml_io import read_xml, write_xml

from sim_programs import allpairs_allreduce, edited

DATA = Path(__file__).parent / "data" / "msccl"
PAIRS = DATA / "allreduce_allpairs_2r_1i.xml"
RING = DATA / "allreduce_ring_4r_1i.xml"


def _run(*args):
    return CliRunner().invoke(main, ["simulate", *map(str, args)])


def test_cli_ok_summary():
    r = _run(PAIRS, "--size", "1MiB", "--dtype", "bfloat16", "--op", "min")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "allreduce_pairs: allreduce, 2 ranks, proto LL" in out
    assert "1.00 MiB per rank input (524288 x bfloat16), op min" in out
    assert "cs = 131072 elements" in out
    assert "result     OK: all 1048576 checked element(s) match" in out
    # by default the preset fitted on 2x H200 (NVLink): a 2-rank NVLink program is within what it measured
    assert "calibrated on nvidia-h200-x2" in out and "UNCALIBRATED" not in out and "busbw" in out
    assert out.rstrip().endswith("OK")
    r = _run(PAIRS, "--size", "1MiB", "--cost", "h100")
    assert r.exit_code == 0 and "UNCALIBRATED" in r.output, r.output


def test_cli_reports_wrong_data_and_exits_1(tmp_path):
    bad = tmp_path / "bad.xml"
    write_xml(edited(read_xml(RING), 1, 0, 0, srcoff=2, dstoff=2), bad)
    r = _run(bad, "--count", "8")
    assert r.exit_code == 1
    assert "result     WRONG:" in r.output and "first at rank" in r.output
    assert r.output.rstrip().endswith("FAILED")


def test_cli_reports_deadlock_and_race(tmp_path):
    r = _run(RING, "--count", "8", "--slots", "1")
    assert r.exit_code == 1
    assert "deadlock   no threadblock can progress; 4 blocked:" in r.output
    assert "rank 2 tb 0 step 1 (rrs): waits for a free slot" in r.output
    racy = tmp_path / "racy.xml"
    write_xml(edited(read_xml(PAIRS), 0, 1, 3, depid=-1, deps=-1), racy)
    r = _run(racy, "--count", "8")
    assert r.exit_code == 1 and "races      1:" in r.output
    assert "rank 0 tb 0 step 0 (re) and rank 0 tb 1 step 3 (s)" in r.output


def test_cli_timeline_png(tmp_path):
    png = tmp_path / "t.png"
    r = _run(RING, "--size", "64K", "--timeline", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_input_is_a_clear_error(tmp_path):
    r = _run(RING, "--size", "1001")
    assert r.exit_code == 2 and "LayoutError: size 1001 bytes is not a whole number of 4-byte elements" in r.output
    missing = tmp_path / "nope.xml"
    r = _run(missing)
    assert r.exit_code == 2 and "nope.xml" in r.output and "cannot read" in r.output
    r = _run(RING, "extra")
    assert r.exit_code != 0 and "unexpected arguments extra" in r.output


def test_predicted_time_grows_with_size_and_bandwidth_saturates():
    times = [simulate(str(RING), size=s, detect_races=False).predicted_time for s in (4096, 1 << 20, 16 << 20)]
    assert times[0] < times[1] < times[2]
    big = simulate(str(RING), size=16 << 20, detect_races=False).timing
    # A single-TB ring can never beat one threadblock's link rate.
    per_tb = max(preset().links["nvlink"].tb_Bps.values()) / 1e9
    assert 0 < big.algbw_GBps < per_tb
    assert big.busbw_GBps == pytest.approx(big.algbw_GBps * 2 * 3 / 4)


def test_more_instances_predict_more_bandwidth_and_ll_costs_bandwidth():
    one = simulate(allpairs_allreduce(8, 1, 4), size="4MiB", detect_races=False).timing
    two = simulate(allpairs_allreduce(8, 2, 4), size="4MiB", detect_races=False).timing
    assert two.total_s < one.total_s
    ll = simulate(allpairs_allreduce(8, 2, 4, proto="LL"), size="4MiB", detect_races=False).timing
    assert ll.total_s > two.total_s


def test_cost_presets_and_overrides():
    slow = preset("h100", launch_s=1e-3)
    t_slow = simulate(str(PAIRS), count=64, cost=slow).predicted_time
    t_fast = simulate(str(PAIRS), count=64, cost="h200").predicted_time
    assert t_slow > 1e-3 > t_fast
    from gc3.errors import GC3Error
    with pytest.raises(GC3Error, match="unknown cost preset 'tpu'"):
        simulate(str(PAIRS), count=64, cost="tpu")


def test_timeline_needs_a_completed_run(tmp_path):
    from gc3.errors import SimulationError
    res = simulate(str(RING), count=8, slots=1)
    with pytest.raises(SimulationError, match="did not complete"):
        res.draw_timeline(tmp_path / "x.png")


def test_cli_simulate_dsl_program_uses_its_root(tmp_path):
    src = tmp_path / "bcast3.py"
    src.write_text(
        "from gc3 import Check, GC3Program, chunk\n"
        "from gc3.collectives import Broadcast\n"
        "with GC3Program('b', Broadcast(num_ranks=5, chunk_factor=1, root=3)) as prog:\n"
        "    c = chunk(3, 'in', 0).copy(3, 'out', 0)\n"
        "    for s in range(1, 5):\n"
        "        c = c.copy((3 + s) % 5, 'out', 0)\n"
        "    Check()\n")
    r = subprocess.run([sys.executable, "-m", "gc3", "simulate", str(src), "--count", "7"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result     OK" in r.stdout


def test_cli_simulate_out_of_memory_is_a_clear_failure(monkeypatch):
    import gc3.simulator as sim

    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 60.0 GiB")

    monkeypatch.setattr(sim, "simulate", too_big)
    res = CliRunner().invoke(main, ["simulate", str(RING), "--size", "10GiB"])
    assert res.exit_code == 2 and not isinstance(res.exception, MemoryError), res.output
    assert "FAILED" in res.output and "memory" in res.output and "--size" in res.output
