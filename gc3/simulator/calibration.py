"""Runtime measurements the cost model is fitted to, and its predictions for them.

A measured point is one row of measured/sweep_*.txt: a program
(an ir_samples/ XML, or an algorithm of gc3.algorithms compiled as `gc3 compile` would), a call
size, runtime environment settings and the measured time per call.  The
points live in `measured_h200x2.csv` next to this file
(`gc3 calibrate` writes it from the sweep and fits to it).
"""
from __future__ import annotations

import csv
import shlex
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path, PurePosixPath
from typing import Dict, List, Sequence, Union

import numpy as np

from .. import limits
from ..errors import GC3Error
from ..ir import Program
from ..ir.xml_io import read_xml
from .cost_config import CostConfig
from .driver import TimedProgram

REPO = Path(__file__).resolve().parents[2]
MEASURED_CSV = Path(__file__).with_name("measured_h200x2.csv")


@dataclass(frozen=True)
class MeasuredPoint:
    coll: str
    size: int            # nccl-tests' size: bytes of the larger user buffer
    count: int           # elements of each rank's input buffer (float32)
    label: str           # the candidate's name in the sweep
    program: str         # "ir_samples/x.xml", or "algorithms/x.py ARGS --instances N --protocol P" (gc3.algorithms.x)
    protocol: str
    instances: int
    env: str             # runtime settings in force, "NAME=VALUE;..." ("" for none)
    measured_us: float


def read_points(path: Union[str, Path] = MEASURED_CSV) -> List[MeasuredPoint]:
    types = {f.name: f.type for f in fields(MeasuredPoint)}
    conv = {"int": int, "float": float, "str": str}
    with open(path, newline="") as fh:
        return [MeasuredPoint(**{k: conv[types[k]](v) for k, v in row.items()}) for row in csv.DictReader(fh)]


def write_points(points: Sequence[MeasuredPoint], path: Union[str, Path] = MEASURED_CSV) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[f.name for f in fields(MeasuredPoint)], lineterminator="\n")
        w.writeheader()
        for p in points:
            w.writerow(asdict(p))


def compile_spec(spec: str) -> Program:
    """The program a point names: an XML path relative to the repository, or an algorithm of the
    library as algorithms/NAME.py (gc3.algorithms.NAME) with its arguments and `gc3 compile`'s
    --instances/--protocol/--no-absorption/--no-tb-merge."""
    words = shlex.split(spec)
    path = PurePosixPath(words[0])
    if path.parent != PurePosixPath("algorithms") or path.suffix != ".py":
        if path.suffix != ".xml" or not (REPO / path).exists():
            raise GC3Error(f"measured point names {words[0]!r}, which is neither an XML file in {REPO} nor "
                           "algorithms/NAME.py (gc3.algorithms.NAME)")
        return read_xml(REPO / path)
    from .. import algorithms
    from ..toolchain import lower
    opts: Dict[str, str] = {}
    args = []
    rest = iter(words[1:])
    for w in rest:
        if w in ("--instances", "--protocol"):
            opts[w[2:]] = next(rest)
        elif w == "--no-absorption":
            opts["absorption"] = "off"
        elif w == "--no-tb-merge":
            opts["tb_merge"] = "off"
        else:
            args.append(w)
    inst = int(opts["instances"]) if "instances" in opts else None
    return lower(algorithms.trace(path.stem, args), instances=inst, protocol=opts.get("protocol"),
                 absorption=False if "absorption" in opts else None,
                 tb_merge=False if "tb_merge" in opts else None)


def config_for(point: MeasuredPoint, cfg: CostConfig) -> CostConfig:
    """`cfg` with the runtime settings the point ran under (slot size, tile split)."""
    if not point.env:
        return cfg
    for item in point.env.split(";"):
        name, value = item.split("=", 1)
        proto = name.rsplit("_", 1)[1]
        proto = {"SIMPLE": "Simple", "LL": "LL", "LL128": "LL128"}[proto]
        if name.startswith("GC3_SLOT_BYTES_"):
            slot = limits.slot_data_bytes(proto, int(value))
            cfg = replace(cfg, slot_data_bytes=dict(cfg.slot_data_bytes, **{proto: slot}))
        elif name.startswith("GC3_TILE_SPLIT_") and proto == "Simple":
            tiles, min_bytes = (int(x) for x in value.split(":"))
            cfg = replace(cfg, tile_split=(tiles, min_bytes))
        else:
            raise GC3Error(f"measured point {point.label}: the cost model does not know setting {name}")
    return cfg


class PointSet:
    """Measured points with their programs executed once each, ready to be
    predicted under any configuration."""

    def __init__(self, points: Sequence[MeasuredPoint]):
        self.points = list(points)
        self.timed: Dict[str, TimedProgram] = {}
        for p in self.points:
            if p.program not in self.timed:
                self.timed[p.program] = TimedProgram(compile_spec(p.program))
        self.measured_us = np.array([p.measured_us for p in self.points])

    def predict_us(self, cfg: CostConfig) -> np.ndarray:
        return np.array([self.timed[p.program].timing(count=p.count, cost=config_for(p, cfg)).total_s * 1e6
                         for p in self.points])

    def relative_errors(self, cfg: CostConfig) -> np.ndarray:
        """(predicted - measured) / measured, per point."""
        return self.predict_us(cfg) / self.measured_us - 1.0
