"""Fit the simulator's cost model to the CUDA runtime measured on nvidia-h200-x2.

    gc3 calibrate                # fit to the committed CSV, print, write the preset
    gc3 calibrate --from-sweep   # rebuild the CSV from the committed sweeps (sweeps()) first
    gc3 calibrate --fit alpha_LL128,tb_LL128   # fit these, hold the rest
    gc3 calibrate --dry-run      # fit and print, write nothing
    gc3 calibrate --holdout-above 16777216     # fit <= 16 MiB, check the larger sizes

(`python -m runtime_cuda calibrate ...` where gc3 is not installed.)  It works on a
source checkout: the sweeps are in measured/, the CSV and the preset are gc3's sources.

1. --from-sweep reads every candidate's row of scripts/bench_runtime.py --log files
   (sweeps() by default; program, size, measured us per call), names each row's program -- the
   ir_samples/ XML when the candidate compiles to exactly that sample, else
   the algorithm with `gc3 compile`'s --instances/--protocol -- and writes
   gc3/simulator/measured_h200x2.csv.  Without it the committed CSV is used.
   LL128's hop latency and per-threadblock rate are fitted only where LL128
   points exist; otherwise they are derived from LL and Simple (with_ll128).
2. Each program is executed once by the simulator (gc3.simulator.TimedProgram)
   and the cost model predicts every point from that trace.
3. The model's parameters (launch, per step-tile overhead, cross-threadblock
   wait, hop latency and per-threadblock link rate per protocol, the link's
   shared bandwidth, local copy and reduce rates) are fitted by least squares
   on log(predicted / measured): Levenberg-Marquardt steps solved with
   numpy.linalg.lstsq on a finite-difference Jacobian, from a few starts.
4. Prints every point (measured, predicted before/after, relative error) and
   the median/max relative error before and after.
5. Writes the fit into gc3/simulator/cost_config.py (the CALIBRATED block),
   marked with the machine, date, point count and median error.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from gc3.errors import EXIT_BAD_INPUT, GC3Error, InputError, exit_status
from gc3.simulator import cost_config
from gc3.simulator.calibration import (MEASURED_CSV, REPO, MeasuredPoint, PointSet, compile_spec, read_points,
                                       write_points)
from gc3.simulator.cost_config import CostConfig, LinkParams, preset, with_ll128

from . import measured_file
from .candidates import CANDIDATES

MACHINE = "nvidia-h200-x2"
SWEEP_ROW = re.compile(r"^(\w+)\s+(\d+(?:\.\d+)?[KMG]iB|\d+)\s+(\S+)\s+([\d.]+)\s")
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

# Fitted parameters: (name, how to read it from a config, initial guess).
PARAMS: Tuple[str, ...] = ("launch_s", "step_overhead_s", "dep_s", "alpha_LL", "alpha_Simple", "tb_LL",
                           "tb_Simple", "port_Bps", "tb_mem_Bps", "tb_reduce_Bps", "alpha_LL128", "tb_LL128")
LL128_PARAMS = ("alpha_LL128", "tb_LL128")
# "Before": the uncalibrated figures the presets had (NVLink 4 line rate 450 GB/s, 25 GB/s per threadblock,
# LL at half of it, NCCL-like latencies, HBM-class local rates), in the order of PARAMS.
SPEC = np.array([5e-6, 0.3e-6, 0.0, 0.8e-6, 2.5e-6, 12.5e9, 25e9, 450e9, 250e9, 250e9, 1.5e-6, 23e9])
# Starting points of the fit: a spec-like guess with a nonzero dependency wait, and the preset in force.
GUESS = np.array([6e-6, 0.3e-6, 0.5e-6, 1e-6, 2e-6, 4e9, 10e9, 400e9, 100e9, 80e9, 2e-6, 8e9])
# The scripts/bench_runtime.py --log files the CSV is built from: the sweep of every protocol but
# LL128 (before absorption), and LL128 (with Simple beside it) measured later on the same machine kind.
SWEEPS = ("sweep_2xh200_2026-11-22.txt", "sweep_ll128_2xh200_2026-11-23.txt")


def sweeps() -> List[Path]:
    """The committed sweeps, in measured/ (InputError where this is not a source checkout)."""
    try:
        return [measured_file(name) for name in SWEEPS]
    except GC3Error as exc:
        raise InputError(f"--from-sweep with no LOG named: {exc}") from None


# --------------------------------------------------------------------------- measured points

def _bench_candidates() -> Dict[Tuple[str, str], object]:
    """runtime_cuda.candidates.CANDIDATES by (collective, label): what each sweep row ran."""
    return {(c.coll, c.label): c for c in CANDIDATES}


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]iB)?", text)
    return int(float(m.group(1)) * UNITS.get(m.group(2) or "", 1))


def _same_schedule(a, b) -> bool:
    """Equal programs apart from name and recommended sizes."""
    keep = dict(name="", minBytes=None, maxBytes=None)
    return replace(a, **keep) == replace(b, **keep)


# Sweeps measured before the compiler had absorption (gc3/compiler/absorption.py) and
# merged LL threadblocks (threadblocks.merge_lone_pairs) ran the schedules that
# these flags compile today; their points name those.
BEFORE_ABSORPTION = frozenset({"sweep_2xh200_2026-11-22.txt"})
OLD_SCHEDULE_FLAGS = " --no-absorption --no-tb-merge"


def points_from_sweep(path: Path) -> List[MeasuredPoint]:
    from runtime_cuda.core.perf import in_elems_for  # the bench's own size rule

    cands = _bench_candidates()
    samples = {p: compile_spec(str(p.relative_to(REPO))) for p in sorted((REPO / "ir_samples").glob("*_2r_*.xml"))}
    spec_of: Dict[str, str] = {}
    points = []
    for line in path.read_text().splitlines()[1:]:
        m = SWEEP_ROW.match(line)
        if not m:
            continue
        coll, size, label, us = m.group(1), _size(m.group(2)), m.group(3), float(m.group(4))
        c = cands.get((coll, label))
        if c is None:
            raise InputError(f"{path}: row {line.split()[:3]} names a candidate that runtime_cuda/candidates.py "
                             "does not define (any more); the committed CSV still holds what it ran")
        key = f"{c.coll}/{c.label}"
        if key not in spec_of:
            compiled = f"algorithms/{c.script}.py {' '.join(c.argv)} --instances {c.instances} --protocol {c.proto}"
            prog = compile_spec(compiled)
            if path.name in BEFORE_ABSORPTION:
                ran = compile_spec(compiled + OLD_SCHEDULE_FLAGS)
                if not _same_schedule(ran, prog):
                    compiled, prog = compiled + OLD_SCHEDULE_FLAGS, ran
            sample = next((s for s, sp in samples.items() if _same_schedule(sp, prog)), None)
            spec_of[key] = str(sample.relative_to(REPO)) if sample else compiled
            spec_of[key + "#prog"] = prog
        prog = spec_of[key + "#prog"]
        env = ";".join(f"{k}={v}" for k, v in c.env)
        points.append(MeasuredPoint(coll, size, in_elems_for(prog, size, 4), label, spec_of[key], c.proto,
                                    c.instances, env, us))
    return points


# --------------------------------------------------------------------------- parameters <-> configuration

def vector_of(cfg: CostConfig) -> np.ndarray:
    nv = cfg.links["nvlink"]
    return np.array([cfg.launch_s, cfg.step_overhead_s, cfg.dep_s, nv.alpha_s["LL"], nv.alpha_s["Simple"],
                     nv.tb_Bps["LL"], nv.tb_Bps["Simple"], nv.port_Bps, cfg.tb_mem_Bps, cfg.tb_reduce_Bps,
                     nv.alpha_s["LL128"], nv.tb_Bps["LL128"]])


def config_of(x: np.ndarray, base: CostConfig, calibrated: bool = False, note: str = "",
              ll128: bool = False) -> CostConfig:
    """The configuration of parameter vector `x`; `ll128`: its LL128 figures are
    measured ones, else they are derived from LL and Simple as the preset does."""
    launch, over, dep, a_ll, a_s, tb_ll, tb_s, port, mem, red, a_128, tb_128 = (float(v) for v in x)
    alpha, rate = {"LL": a_ll, "Simple": a_s}, {"LL": tb_ll, "Simple": tb_s}
    if ll128:
        alpha["LL128"], rate["LL128"] = a_128, tb_128
    nv = with_ll128(LinkParams(alpha_s=alpha, tb_Bps=rate, port_Bps=port, calibrated=calibrated))
    return replace(base, links=dict(base.links, nvlink=nv), launch_s=launch, step_overhead_s=over, dep_s=dep,
                   tb_mem_Bps=mem, tb_reduce_Bps=red, calibrated=calibrated,
                   calibration=note or base.calibration)


# --------------------------------------------------------------------------- fitting

def has_ll128(ps: PointSet) -> bool:
    return any(p.protocol == "LL128" for p in ps.points)


def residuals(ps: PointSet, logx: np.ndarray, base: CostConfig) -> np.ndarray:
    return np.log(ps.predict_us(config_of(np.exp(logx), base, ll128=has_ll128(ps))) / ps.measured_us)


def fit(ps: PointSet, x0: np.ndarray, base: CostConfig, iters: int = 25, verbose: bool = True,
        free: Optional[Sequence[str]] = None) -> np.ndarray:
    """Levenberg-Marquardt in log-parameters; the model has kinks (max of
    paths), so the Jacobian uses central differences over a finite step.
    Only the parameters named in `free` move (default: all the points can
    tell: LL128's only where LL128 points exist); the rest keep x0's values."""
    names = free if free is not None else [p for p in PARAMS if has_ll128(ps) or p not in LL128_PARAMS]
    idx = [PARAMS.index(n) for n in names]
    logx = np.log(x0)
    r = residuals(ps, logx, base)
    cost = float(r @ r)
    lam, h = 1e-2, 0.05
    for it in range(iters):
        J = np.empty((r.size, len(idx)))
        for j, k in enumerate(idx):
            d = np.zeros_like(logx)
            d[k] = h
            J[:, j] = (residuals(ps, logx + d, base) - residuals(ps, logx - d, base)) / (2 * h)
        improved = False
        for _ in range(8):
            A = np.vstack([J, np.sqrt(lam) * np.eye(len(idx))])
            b = np.concatenate([-r, np.zeros(len(idx))])
            step = np.zeros_like(logx)
            step[idx] = np.clip(np.linalg.lstsq(A, b, rcond=None)[0], -1.0, 1.0)
            r_new = residuals(ps, logx + step, base)
            c_new = float(r_new @ r_new)
            if c_new < cost:
                logx, r, cost, improved = logx + step, r_new, c_new, True
                lam = max(lam / 3, 1e-6)
                break
            lam *= 4
        if verbose:
            print(f"  iteration {it + 1:2d}: sum of squared log errors {cost:.4f} (lambda {lam:.1e})", flush=True)
        if not improved or np.abs(step).max() < 1e-3:
            break
    return np.exp(logx)


def relative(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return pred / meas - 1.0


# --------------------------------------------------------------------------- output

def _h(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def table(points: Sequence[MeasuredPoint], before: np.ndarray, after: np.ndarray) -> List[str]:
    meas = np.array([p.measured_us for p in points])
    eb, ea = relative(before, meas), relative(after, meas)
    lines = [f"{'coll':<14}{'size':>7}  {'program':<20}{'measured':>10}{'before':>10}{'after':>10}"
             f"{'err before':>11}{'err after':>10}"]
    for p, b, a, xb, xa in zip(points, before, after, eb, ea):
        lines.append(f"{p.coll:<14}{_h(p.size):>7}  {p.label:<20}{p.measured_us:>10.1f}{b:>10.1f}{a:>10.1f}"
                     f"{xb:>+11.1%}{xa:>+10.1%}")
    return lines


def summary(name: str, err: np.ndarray) -> str:
    a = np.abs(err)
    return (f"{name}: median |rel. error| {np.median(a):.1%}, 90th percentile {np.percentile(a, 90):.1%}, "
            f"max {a.max():.1%} over {a.size} points")


def _num(v: float) -> str:
    return f"{v:.4g}"


def preset_block(x: np.ndarray, note: str, ll128: bool = False) -> str:
    launch, over, dep, a_ll, a_s, tb_ll, tb_s, port, mem, red, a_128, tb_128 = (float(v) for v in x)
    alpha = f"\"LL\": {_num(a_ll)}, " + (f"\"LL128\": {_num(a_128)}, " if ll128 else "") + f"\"Simple\": {_num(a_s)}"
    rate = f"\"LL\": {_num(tb_ll)}, " + (f"\"LL128\": {_num(tb_128)}, " if ll128 else "") + f"\"Simple\": {_num(tb_s)}"
    return (
        "# CALIBRATED h200 BEGIN (written by `gc3 calibrate`; do not edit by hand)\n"
        f"H200_CALIBRATION = {json.dumps(note)}\n"
        + ("# LL, LL128 and Simple measured.\n" if ll128 else
           "# LL and Simple measured; LL128 is derived from them (with_ll128).\n") +
        f"H200_NVLINK = LinkParams(alpha_s={{{alpha}}},\n"
        f"                         tb_Bps={{{rate}}},\n"
        f"                         port_Bps={_num(port)}, calibrated=True)\n"
        f"H200_CORE = dict(launch_s={_num(launch)}, step_overhead_s={_num(over)}, dep_s={_num(dep)}, "
        f"tb_mem_Bps={_num(mem)},\n                 tb_reduce_Bps={_num(red)})\n"
        "# CALIBRATED h200 END\n")


def write_preset(block: str, path: Path = Path(cost_config.__file__)) -> None:
    text = path.read_text()
    pat = re.compile(r"# CALIBRATED h200 BEGIN.*?# CALIBRATED h200 END\n", re.S)
    if not pat.search(text):
        raise InputError(f"{path}: no CALIBRATED h200 block to replace")
    path.write_text(pat.sub(lambda _m: block, text))


def holdout(points: Sequence[MeasuredPoint], limit: int) -> int:
    """Fit to the small sizes only and predict the large ones: how far the model extrapolates."""
    below, above = [p for p in points if p.size <= limit], [p for p in points if p.size > limit]
    if not below or not above:
        raise InputError(f"--holdout-above {limit}: the points must fall on both sides of it "
                         f"({len(below)} at or below, {len(above)} above)")
    train, test = PointSet(below), PointSet(above)
    x = fit(train, GUESS, preset("h200"), verbose=False)
    cfg = config_of(x, preset("h200"), ll128=has_ll128(train))
    print(summary(f"fitted to {len(train.points)} points <= {_h(limit)}", train.relative_errors(cfg)))
    print(summary(f"predicting the {len(test.points)} larger ones", test.relative_errors(cfg)))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gc3 calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--from-sweep", type=Path, nargs="*", default=None, metavar="LOG",
                    help="rebuild the CSV from these scripts/bench_runtime.py --log files "
                         "(none named: the committed sweeps in measured/)")
    ap.add_argument("--csv", type=Path, default=MEASURED_CSV,
                    help="the measured points, read (or, with --from-sweep, written) "
                         "(default: gc3/simulator/measured_h200x2.csv)")
    ap.add_argument("--date", default="2026-11-22 and 2026-11-23",
                    help="date(s) of the measurements, for the preset's label")
    ap.add_argument("--fit", default=None, metavar="NAMES",
                    help="comma-separated parameters to fit, the others held at the preset's values "
                         f"(of {', '.join(PARAMS)}; default: all the points can tell)")
    ap.add_argument("--dry-run", action="store_true", help="fit and print; write neither CSV nor preset")
    ap.add_argument("--holdout-above", type=int, default=None, metavar="BYTES",
                    help="validation only: fit to the points up to BYTES, report the error on the larger ones")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`gc3 calibrate`: 0 fitted (and written, unless --dry-run); 2 with one line on stderr for
    options it refuses, or inputs it cannot read (a sweep, the CSV, measured/ outside a checkout)."""
    ap = parser()
    args = ap.parse_args(argv)
    free = None
    if args.fit is not None:
        free = [n.strip() for n in args.fit.split(",") if n.strip()]
        bad = [n for n in free if n not in PARAMS]
        if bad or not free:
            ap.error(f"--fit: unknown parameter(s) {', '.join(bad) or '(none named)'} (have {', '.join(PARAMS)})")
    if args.holdout_above is not None and args.holdout_above < 1:
        ap.error(f"--holdout-above: a size in bytes, at least 1 (got {args.holdout_above})")
    try:
        return calibrate(args, free)
    except GC3Error as exc:
        print(f"gc3 calibrate: {exc}", file=sys.stderr)
        return exit_status(exc)
    except OSError as exc:
        print(f"gc3 calibrate: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def calibrate(args: argparse.Namespace, free: Optional[List[str]]) -> int:
    if args.from_sweep is not None:
        points = [p for sweep in (args.from_sweep or sweeps()) for p in points_from_sweep(sweep)]
        if not args.dry_run:
            write_points(points, args.csv)
            print(f"wrote {len(points)} points to {args.csv}")
    else:
        try:
            points = read_points(args.csv)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{args.csv}: not a CSV of measured points ({type(exc).__name__}: {exc})") from None
    if not points:
        raise InputError(f"{args.csv}: no measured points to fit to")
    if args.holdout_above is not None:
        return holdout(points, args.holdout_above)
    ps = PointSet(points)
    print(f"{len(points)} measured points, {len(ps.timed)} programs")

    current = preset("h200")
    ll128 = has_ll128(ps)
    before = ps.predict_us(config_of(SPEC, current, ll128=ll128))
    # Held parameters keep the preset's values: start every fit from them.
    starts = [vector_of(current)] if free else [GUESS, vector_of(current)]
    best, best_cost = None, np.inf
    for k, x0 in enumerate(starts):
        print(f"fit from start {k + 1}:")
        x = fit(ps, x0, current, free=free)
        r = residuals(ps, np.log(x), current)
        if r @ r < best_cost:
            best, best_cost = x, float(r @ r)
    after = ps.predict_us(config_of(best, current, ll128=ll128))
    err = relative(after, ps.measured_us)
    print("\n".join(table(points, before, after)))
    print(summary("before (uncalibrated spec figures)", relative(before, ps.measured_us)))
    print(summary("after (fitted)", err))
    for name, v in zip(PARAMS, best):
        print(f"  {name:<16}{v:.4g}")
    note = (f"calibrated on {MACHINE}, {args.date}, {len(points)} points, "
            f"median error {np.median(np.abs(err)):.1%}")
    if args.dry_run:
        print(f"dry run: would write the preset '{note}'")
    else:
        write_preset(preset_block(best, note, ll128))
        print(f"wrote the h200 preset into {cost_config.__file__}: {note}")
    return 0
