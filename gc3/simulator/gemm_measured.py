"""The cost model's GEMM figures, fitted to the chunked-GEMM measurement.

measured_gemm_1xh100.txt (next to this file: the one-H100 compute-side file
that scripts/bench_fused_gemm.py writes) times, per operator shape, one cuBLAS call (T_gemm) and the
fused operator's chunked, flag-releasing GEMMs (T_gemm_chunked).  Two figures
of `CostConfig` come from it, replacing the assumed ones:

* gemm_efficiency: the fraction of the tensor-core peak one call reaches; the
  model's time scales as 1/efficiency, so each point gives the efficiency that
  prices its one call exactly, and the median is taken.
* gemm_chunk_s: what a chunk costs beyond its share of the work: the measured
  chunked time less the one-call time scaled by the model's own chunked/one
  ratio (its wave quantization), per chunk; median over the points.

Only equal-split points are used (the model cuts M into equal row blocks).
The GPUs the presets describe (H100, H200 SXM) have the same tensor cores, so
the one H100 fit serves both.
"""
from __future__ import annotations

import functools
import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Union

from ..errors import GC3Error
from .cost_config import CostConfig
from .cost_model import _gemm_time

# A link to the benchmark's file (the compiler never names the runtime's folders), so the
# measurement has one copy.
MEASURED_GEMM = Path(__file__).with_name("measured_gemm_1xh100.txt")

_ROW = re.compile(r"(?P<op>\w+)\s+M=(?P<m>\d+)\s+K=(?P<k>\d+)\s+N=(?P<n>\d+)\s+(?P<split>\w+)\s+n=(?P<ranks>\d+)\s+"
                  r"T_gemm=(?P<one>[\d.]+)\s+T_gemm_chunked=(?P<chunked>[\d.]+)\s+\(x[\d.]+,\s*"
                  r"(?P<chunks>\d+) chunks of (?P<rows>\d+) rows\)\s*$")


@dataclass(frozen=True)
class GemmPoint:
    op: str
    m: int
    k: int
    n: int
    split: str           # "equal" or "skewed" (all-to-all's split vector)
    chunks: int
    one_s: float         # one cuBLAS call
    chunked_s: float     # `chunks` calls of m/chunks rows, each releasing a flag


def read_points(path: Union[str, Path] = MEASURED_GEMM) -> List[GemmPoint]:
    """The measured rows of `path` (times in ms there); GC3Error naming the line it cannot read."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GC3Error(f"{path}: cannot read the GEMM measurement: {exc.strerror}") from None
    points = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        got = _ROW.match(line)
        if got is None:
            raise GC3Error(f"{path}:{no}: not a measured GEMM row (op M= K= N= split n= T_gemm= T_gemm_chunked= "
                           f"(xR, C chunks of R rows)): {line.strip()[:100]!r}")
        d = got.groupdict()
        points.append(GemmPoint(d["op"], int(d["m"]), int(d["k"]), int(d["n"]), d["split"], int(d["chunks"]),
                                float(d["one"]) * 1e-3, float(d["chunked"]) * 1e-3))
    if not points:
        raise GC3Error(f"{path}: no measured GEMM rows")
    return points


def fit(points: List[GemmPoint], config: CostConfig) -> Dict[str, float]:
    """{gemm_efficiency, gemm_chunk_s} fitted to the equal-split `points` (see the module's docstring)."""
    equal = [p for p in points if p.split == "equal" and p.chunks >= 1 and p.m % p.chunks == 0]
    if not equal:
        raise GC3Error("no equal-split GEMM measurement to fit the GEMM figures to")
    peak = replace(config, gemm_efficiency=1.0)
    efficiency = statistics.median(_gemm_time(p.m, p.n, p.k, peak) / p.one_s for p in equal)
    fitted = replace(config, gemm_efficiency=efficiency)
    extra = []
    for p in equal:
        ratio = p.chunks * _gemm_time(p.m // p.chunks, p.n, p.k, fitted) / _gemm_time(p.m, p.n, p.k, fitted)
        extra.append(max(0.0, (p.chunked_s - p.one_s * ratio) / p.chunks))
    return {"gemm_efficiency": efficiency, "gemm_chunk_s": statistics.median(extra)}


@functools.lru_cache(maxsize=None)
def _points(path: str) -> tuple:
    return tuple(read_points(path))


def measured(config: CostConfig, path: Union[str, Path] = MEASURED_GEMM) -> CostConfig:
    """`config` with its GEMM figures fitted to the measurement at `path` (read once)."""
    figures = fit(list(_points(str(path))), config)
    return replace(config, calibration=f"{config.calibration}; GEMM figures fitted to {Path(path).name}", **figures)
