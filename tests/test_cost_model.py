"""The cost model against the runtime measured on nvidia-h200-x2, and its shape.

The accuracy tests are data checks: the committed measurements
(gc3/simulator/measured_h200x2.csv) against the committed h200 preset, both
written by `gc3 calibrate` (runtime_cuda/calibrate.py) -- no timing is taken here.
"""
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.simulator import TimedProgram, simulate
from gc3.simulator.calibration import MEASURED_CSV, PointSet, compile_spec, config_for, read_points
from gc3.simulator.cost_config import H200_CALIBRATION, PROTOCOL_EFFICIENCY, preset
from gc3.simulator.cost_model import tile_of
from runtime_cuda import calibrate

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def points():
    return PointSet(read_points())


def _program(script, instances, proto, ranks=2):
    return lower(run_script(str(ROOT / "gc3" / "algorithms" / f"{script}.py"), [str(ranks)]),
                 instances=instances, protocol=proto)


def test_csv_is_the_sweep():
    """Every row of the measured sweeps is in the CSV, with the program it ran
    (an ir_samples/ file may stand for the compiled algorithm, or not, as
    samples come and go, but it must be the same schedule)."""
    from_sweep = [p for sweep in calibrate.sweeps() for p in calibrate.points_from_sweep(sweep)]
    committed = read_points(MEASURED_CSV)
    assert [replace(p, program="") for p in from_sweep] == [replace(p, program="") for p in committed]
    for a, b in {(a.program, b.program) for a, b in zip(from_sweep, committed) if a.program != b.program}:
        assert calibrate._same_schedule(compile_spec(a), compile_spec(b)), (a, b)
    assert len(from_sweep) > 100
    assert {p.coll for p in from_sweep} == {"allreduce", "allgather", "reducescatter", "alltoall"}
    # The ir_samples/ entries stand for the programs the sweep compiled.
    assert any(p.program.startswith("ir_samples/") for p in from_sweep)
    assert {p.protocol for p in from_sweep} == {"LL", "LL128", "Simple"}


def test_h200_preset_reproduces_the_measured_points(points):
    err = np.abs(points.relative_errors(preset("h200")))
    # Tolerances: the fit reaches about 3% median and 18% max; a stale or
    # uncalibrated preset (spec figures: 28% median, 52% max) fails them.
    assert np.median(err) < 0.10
    assert np.percentile(err, 90) < 0.20
    assert err.max() < 0.35


def test_preset_label_matches_the_data(points):
    m = re.fullmatch(r"calibrated on nvidia-h200-x2, (\d{4}-\d\d-\d\d(?: and \d{4}-\d\d-\d\d)?), (\d+) points, "
                     r"median error ([\d.]+)%",
                     H200_CALIBRATION)
    assert m, H200_CALIBRATION
    assert int(m.group(2)) == len(points.points)
    median = np.median(np.abs(points.relative_errors(preset("h200")))) * 100
    assert float(m.group(3)) == pytest.approx(median, abs=0.05)


def test_uncalibrated_figures_do_not_fit(points):
    """The measurements can tell a calibrated preset from spec figures."""
    spec = calibrate.config_of(calibrate.SPEC, preset("h200"))
    assert np.median(np.abs(points.relative_errors(spec))) > 0.15


def test_calibrated_or_not_per_preset_and_link():
    prog = ROOT / "ir_samples" / "allreduce_ring_2r_inplace_Simple_i64.xml"
    h200 = simulate(str(prog), size=MiB, detect_races=False, cost="h200")
    h100 = simulate(str(prog), size=MiB, detect_races=False, cost="h100")
    assert h200.timing.calibrated and not h100.timing.calibrated
    assert "calibrated on nvidia-h200-x2" in h200.summary() and "UNCALIBRATED" not in h200.summary()
    assert "UNCALIBRATED: the H200 fit" in h100.summary()
    # Ranks on two nodes use the network link, which nothing measured.
    split = simulate(str(prog), size=MiB, detect_races=False, cost=preset("h200", gpus_per_node=1))
    assert not split.timing.calibrated
    assert "UNCALIBRATED: network link(s) not measured" in split.summary()
    assert split.predicted_time > h200.predicted_time
    # More ranks than were measured: still the measured link, but said to be extrapolated.
    eight = simulate(str(ROOT / "ir_samples" / "allreduce_ring_8r_inplace_Simple.xml"), size=MiB, detect_races=False,
                     cost="h200")
    assert eight.timing.calibrated and "8 ranks extrapolated from 2" in eight.summary()
    assert "extrapolated" not in h200.summary()


@pytest.mark.parametrize("script,inst,proto", [("allreduce_ring", 64, "Simple"), ("allreduce_oneshot", 16, "LL"),
                                               ("allgather_direct", 1, "LL"), ("reducescatter_direct", 4, "Simple")])
@settings(max_examples=25, deadline=None)
@given(a=st.integers(0, 1 << 20), b=st.integers(0, 1 << 20))
def test_monotone_in_size(script, inst, proto, a, b):
    tp = _timed(script, inst, proto)
    lo, hi = sorted((a, b))
    unit = tp.program.gpu(0).i_chunks     # whole blocks of chunks: any count the layout accepts
    t_lo = tp.timing(count=lo * unit, cost="h200").total_s
    t_hi = tp.timing(count=hi * unit, cost="h200").total_s
    assert t_lo <= t_hi * (1 + 1e-12)


_TIMED = {}


def _timed(script, inst, proto):
    key = (script, inst, proto)
    if key not in _TIMED:
        _TIMED[key] = TimedProgram(_program(script, inst, proto))
    return _TIMED[key]


@pytest.mark.parametrize("script,proto", [("allreduce_ring", "Simple"), ("allgather_direct", "Simple"),
                                          ("reducescatter_ring", "Simple"), ("alltoall_direct", "LL")])
def test_more_channels_never_slower_and_bandwidth_saturates(script, proto):
    cfg = preset("h200")
    link = cfg.links["nvlink"]
    for size in (256 * MiB, GiB):
        times = [_timed(script, k, proto).timing(size, cost=cfg) for k in (1, 2, 4, 8, 16, 32, 64)]
        for fewer, more in zip(times, times[1:]):
            assert more.total_s <= fewer.total_s * 1.001
        # Saturated: no more payload per direction than the link's wire rate carries.
        per_direction = times[-1].size_bytes * (2 if script == "allreduce_ring" else 1) / 2
        assert per_direction / times[-1].total_s <= link.port_Bps * PROTOCOL_EFFICIENCY[proto] * 1.001
        # ... and one channel is bound by one threadblock's rate.
        assert per_direction / times[0].total_s <= link.tb_Bps[proto] * 1.001
    # Between 32 and 64 channels the Simple link is saturated: within a few percent.
    if proto == "Simple":
        assert times[-1].total_s > 0.8 * times[-2].total_s


def test_faster_hardware_is_never_slower():
    tp = _timed("allreduce_oneshot", 4, "LL")
    base = preset("h200")
    t0 = tp.timing(4 * MiB, cost=base).total_s
    faster = [replace(base, launch_s=base.launch_s / 2), replace(base, tb_reduce_Bps=base.tb_reduce_Bps * 2),
              replace(base, links=dict(base.links, nvlink=replace(base.links["nvlink"],
                                                                  tb_Bps={k: v * 2 for k, v in
                                                                          base.links["nvlink"].tb_Bps.items()})))]
    for cfg in faster:
        assert tp.timing(4 * MiB, cost=cfg).total_s < t0


@pytest.mark.parametrize("split", [None, (4, 65536), (2, 0)])
@pytest.mark.parametrize("proto", ["Simple", "LL"])
def test_tiles_follow_the_runtime_rule(proto, split):
    """The model tiles chunks exactly as the runtime does (runtime_cuda.core.binding)."""
    from runtime_cuda.core.binding import tile_lanes
    from runtime_cuda.core.connections import TileSplit
    cfg = preset("h200") if split is None else preset("h200", tile_split=split)
    ts = TileSplit() if split is None else TileSplit(*split)
    for cs in (1, 3, 4, 100, 4096, 65536 + 7, 1 << 21, (1 << 22) + 1):
        for max_cnt in (1, 2, 3):
            lanes = tile_lanes(cs, 4, proto, max_cnt, ts)
            assert tile_of(cs * 4, 4, proto, max_cnt, cfg) == (lanes * 4, math.ceil(cs / lanes))


def test_env_settings_change_the_tiles():
    p = next(p for p in read_points() if "GC3_SLOT_BYTES_SIMPLE" in p.env)
    cfg = config_for(p, preset("h200"))
    assert cfg.slot_data_bytes["Simple"] == 1 << 20 and cfg.tile_split == (4, 65536)
    tp = TimedProgram(compile_spec(p.program))
    # 16 MiB over 32 channels: 256 KiB chunks, cut into 4 tiles of 64 KiB; at 1 GiB the 1 MiB slot is the tile.
    assert (p.size, p.instances) == (16 * MiB, 32)
    assert tp.timing(count=p.count, cost=cfg).tile_bytes == 64 << 10
    assert tp.timing(count=p.count, cost=preset("h200")).tile_bytes == 256 << 10
    assert tp.timing(GiB, cost=cfg).tile_bytes == 1 << 20


def test_timed_program_matches_a_full_simulation():
    prog = _program("allreduce_allpairs", 4, "LL")
    full = simulate(prog, size=256 * 1024, detect_races=False, cost="h200").predicted_time
    assert TimedProgram(prog).timing(256 * 1024, cost="h200").total_s == pytest.approx(full)


@pytest.mark.parametrize("xml,size", [("allreduce_oneshot_2r_LL_i16.xml", MiB), ("allreduce_ring_2r_inplace_Simple_i64.xml",
                                                                                   64 * MiB)])
def test_a_threadblock_runs_one_step_tile_at_a_time(xml, size):
    res = simulate(str(ROOT / "ir_samples" / xml), size=size, detect_races=False, cost="h200")
    t = res.timing
    assert t.ntiles >= 2
    by_tb = {}
    for rec, spans in zip(res.records, t.spans):
        assert len(spans) == t.ntiles
        for tile, (s, e) in enumerate(spans):
            by_tb.setdefault((rec.rank, rec.tb), []).append((tile, rec.step, s, e))
    for items in by_tb.values():
        items.sort()                       # the order the runtime walks them: tile-major, then step
        for (_, _, s0, e0), (_, _, s1, e1) in zip(items, items[1:]):
            assert s0 <= e0 <= s1 <= e1 <= t.total_s


# --- LL128: measured on the H200 link, derived where a link has only LL and Simple -----

def test_h200_ll128_is_measured_and_a_link_without_it_derives_it_as_nccl_models_it():
    from dataclasses import replace as dc_replace

    from gc3 import limits
    from gc3.simulator.cost_config import NCCL_NVLINK_RING_HOP_US, with_ll128

    nv = preset("h200").links["nvlink"]
    assert nv.calibrated and nv.derived == {}
    # Measured (sweep_ll128_2xh200_2026-11-23.txt): the interpreter's LL128 lines cost a hop about
    # LL's, and a threadblock moves about what it moves with LL, far under Simple.
    assert nv.alpha_s["LL"] < nv.alpha_s["LL128"] < nv.alpha_s["Simple"]
    assert nv.tb_Bps["LL128"] < nv.tb_Bps["Simple"] / 2
    assert with_ll128(nv) is nv
    bare = dc_replace(nv, alpha_s={k: v for k, v in nv.alpha_s.items() if k != "LL128"},
                      tb_Bps={k: v for k, v in nv.tb_Bps.items() if k != "LL128"})
    derived = with_ll128(bare)
    assert derived.alpha_s["LL128"] / derived.alpha_s["Simple"] == pytest.approx(
        NCCL_NVLINK_RING_HOP_US["LL128"] / NCCL_NVLINK_RING_HOP_US["Simple"])
    assert derived.tb_Bps["LL128"] == pytest.approx(derived.tb_Bps["Simple"] * 120 / 128)
    assert PROTOCOL_EFFICIENCY["LL128"] == limits.LL128_LINE_DATA_BYTES / limits.LL128_LINE_BYTES == 120 / 128
    assert set(derived.derived) == {"LL128"}


def test_a_derived_ll128_prediction_is_not_reported_as_calibrated():
    from dataclasses import replace as dc_replace

    from gc3.simulator.cost_config import with_ll128

    script = str(Path(__file__).resolve().parents[1] / "gc3" / "algorithms" / "allgather_direct.py")
    h200 = preset("h200")
    nv = h200.links["nvlink"]
    bare = dc_replace(nv, alpha_s={k: v for k, v in nv.alpha_s.items() if k != "LL128"},
                      tb_Bps={k: v for k, v in nv.tb_Bps.items() if k != "LL128"})
    derived = dc_replace(h200, links=dict(h200.links, nvlink=with_ll128(bare)))
    got = {}
    for name, cfg in (("measured", h200), ("derived", derived)):
        for proto in ("LL", "LL128", "Simple"):
            t = TimedProgram(lower(run_script(script, ["2"]), protocol=proto)).timing(count=1 << 16, cost=cfg)
            got[name, proto] = (t.calibrated, t.calibration)
    assert all(got["measured", p][0] for p in ("LL", "LL128", "Simple"))
    assert got["derived", "LL"][0] and got["derived", "Simple"][0]
    assert not got["derived", "LL128"][0] and "LL128 derived" in got["derived", "LL128"][1]


def test_a_model_only_two_rank_catalog_takes_ll_small_and_simple_large():
    """The protocol choice of `gc3 tune --model-only` over the whole library at 2 ranks:
    LL where latency rules, LL128 or Simple once bandwidth does (LL's flag per 8 bytes
    halves what a port carries)."""
    from runtime_cuda.nccl import tune

    grid = tune.Grid(instances=(1, 16), protocols=("Simple", "LL", "LL128"), pipeline_chunks=(1,))
    small, mid, large = 4 << 10, 64 << 20, 1 << 30
    results = tune.tune(2, 1, ["allreduce", "allgather"], [small, mid, large], grid, tune.ModelTimer("h200", 2))
    for r in results:
        for place, choices in r.choices.items():
            proto = {c.nbytes: c.winner.protocol for c in choices}
            assert proto[small] == "LL", (r.collective, place, proto)
            assert proto[mid] in ("Simple", "LL128"), (r.collective, place, proto)
            # Simple at 1 GiB: the measured LL128 moves a third of Simple's bytes per threadblock
            # (with LL128 derived from Simple, the out-of-place ring chose LL128 here, which measured
            # 0.72x Simple's speed).
            assert proto[large] == "Simple", (r.collective, place, proto)
