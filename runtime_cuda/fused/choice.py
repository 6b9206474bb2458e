"""Which path a fused operator takes for one shape, decided by what was measured.

A machine's catalog (the JSON the drop-in loads) may carry a `fused` section,
written by `gc3 tune --fused` on that machine:

    "fused": {"provenance": {...},
              "entries": [{"op": "gemm_rs", "gpus": 4, "dtype": "bfloat16",
                           "shape": {"M": 8192, "K": 7168, "N": 8192},
                           "path": "fused", "chunks": 4,
                           "fused_us": 1234.5, "sequential_us": 1400.1}, ...]}

An entry may also carry `graph_path` (with `graph_fused_us`, `graph_sequential_us`):
the faster path when the call is captured into a CUDA graph and replayed, where
the host's time per call no longer counts and the answer can differ (a fused
GEMV wins eager calls by its host time and may lose replays by its GPU time).
A captured call takes `graph_path` where the entry has one, else `path`.

An entry of a tile-store GEMM + reduce-scatter, + all-reduce or + all-to-all may carry
`peer_tiles` ("store" or "copy-engine", with `fused_store_us` and `fused_ce_us`): how
its eager fused calls send the peers' tiles, the faster where the tune measured both
(GC3_FUSED_PEER_TILES, where set, decides instead; a captured call stores them).

`choose` answers, in this order: the caller's `path`, GC3_FUSED=0/1, the entry
measured for this shape, the entry of the nearest measured size along the op's
size axis (M, b, samples or bytes; every other dimension equal) within a factor
of 2, the path both measured sizes around it agree on, and otherwise the
sequential path: fusing where nobody measured it could be the slower choice, and
the sequential path is what the user would run anyway.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from gc3 import limits, settings
from gc3.errors import InputError

OPS = ("ag_gemm", "gemm_rs", "gemm_ar", "gemm_a2a", "gemv_ar", "ebag_a2a", "ar_epilogue")
PATHS = ("fused", "sequential")
# How the tile-store GEMM sends the peers' tiles of an eager call (GC3_FUSED_PEER_TILES), and
# the operators that may leave them to the copy engines (their first hop is the same).
PEER_TILES = ("store", "copy-engine")
PEER_TILE_OPS = ("gemm_rs", "gemm_ar", "gemm_a2a")
# The chunk count a forced fused call takes where nothing was measured.
DEFAULT_CHUNKS = 4
# Each op's size axis: the dimension along which a measured shape may stand in for an
# unmeasured one (FusedTable.lookup); the other dimensions must be equal.
SIZE_AXIS = {"ag_gemm": "M", "gemm_rs": "M", "gemm_ar": "M", "gemm_a2a": "M", "gemv_ar": "b",
             "ebag_a2a": "samples", "ar_epilogue": "bytes"}
# How far (as a factor along the size axis) the nearest measured shape may stand in.
NEAREST_FACTOR = 2.0
# Sizes where an op's fused path changes mechanism (the epilogue: one small kernel up to the
# small kernels' limit, the group's allreduce then a pass above it): a measured size never
# stands in for one across a break.
SIZE_BREAKS = {"ar_epilogue": (limits.SMALL_ALLREDUCE_MAX_BYTES,)}


def _regime(op: str, size: int) -> int:
    return sum(size > b for b in SIZE_BREAKS.get(op, ()))


@dataclass(frozen=True)
class Choice:
    fused: bool
    chunks: int
    why: str
    peer_tiles: str = "store"


def entry_key(op: str, gpus: int, dtype: str, shape: Mapping[str, int]) -> Tuple:
    return (op, int(gpus), dtype, tuple(sorted((k, int(v)) for k, v in shape.items())))


class FusedTable:
    """The measured entries of one catalog, by (op, gpus, dtype, shape)."""

    def __init__(self, entries: List[dict], source: str):
        self.source = source
        self.entries: Dict[Tuple, dict] = {}
        for i, e in enumerate(entries):
            where = f"{source}: fused.entries[{i}]"
            try:
                op, gpus, dtype, shape, path = e["op"], e["gpus"], e["dtype"], e["shape"], e["path"]
                chunks = int(e.get("chunks", DEFAULT_CHUNKS))
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError(f"{where}: malformed entry ({exc!r}); expected op, gpus, dtype, shape, path")
            graph = e.get("graph_path", path)
            if op not in OPS or path not in PATHS or graph not in PATHS or chunks < 1 or not isinstance(shape, dict):
                raise InputError(f"{where}: op {op!r} (one of {OPS}), path {path!r} and graph_path {graph!r} (one "
                                 f"of {PATHS}), chunks {chunks} (>= 1) and shape {shape!r} (a dict)")
            if e.get("peer_tiles", "store") not in PEER_TILES:
                raise InputError(f"{where}: peer_tiles {e['peer_tiles']!r} (one of {PEER_TILES})")
            self.entries[entry_key(op, gpus, dtype, shape)] = dict(e, chunks=chunks)

    @classmethod
    def from_catalog(cls, path: Path) -> "FusedTable":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: cannot read the catalog's fused section: {exc}")
        section = data.get("fused") if isinstance(data, dict) else None
        if section is None:
            return cls([], str(path))
        if not isinstance(section, dict) or not isinstance(section.get("entries"), list):
            raise InputError(f"{path}: 'fused' must be an object with an 'entries' list")
        return cls(section["entries"], str(path))

    def lookup(self, op: str, gpus: int, dtype: str, shape: Mapping[str, int],
               captured: bool = False) -> Tuple[Optional[dict], str]:
        """The entry that decides `shape`: the one measured there; else, along the op's size
        axis (SIZE_AXIS) with every other dimension equal and no SIZE_BREAKS between, the
        nearest measured size within a factor of 2; else the nearer of the two measured sizes
        around it where both took the same path (between two sizes that agree, the answer
        holds), the path of a captured call where `captured` (decided())."""
        hit = self.entries.get(entry_key(op, gpus, dtype, shape))
        if hit is not None:
            return hit, "measured at this shape"
        axis = SIZE_AXIS.get(op, "M")
        size = shape.get(axis, 0)
        if size <= 0:
            return None, "not measured at this shape"
        rest = {k: v for k, v in shape.items() if k != axis}
        below, above = None, None     # (log distance, entry) of the nearest measured size each side
        for (o, g, d, s), e in self.entries.items():
            s = dict(s)
            if (o, g, d) != (op, gpus, dtype) or s.get(axis, 0) <= 0 or _regime(op, s[axis]) != _regime(op, size) \
                    or {k: v for k, v in s.items() if k != axis} != rest:
                continue
            gap = math.log(s[axis] / size)
            if gap < 0 and (below is None or -gap < below[0]):
                below = (-gap, e)
            elif gap > 0 and (above is None or gap < above[0]):
                above = (gap, e)
        near = min((x for x in (below, above) if x is not None), key=lambda x: x[0], default=None)
        if near is not None and near[0] <= math.log(NEAREST_FACTOR):
            return near[1], f"nearest measured {axis}={near[1]['shape'][axis]}"
        if below is not None and above is not None and \
                decided(below[1], captured) == decided(above[1], captured):
            return near[1], (f"between measured {axis}={below[1]['shape'][axis]} and {above[1]['shape'][axis]}, "
                             f"both {decided(near[1], captured)}")
        return None, f"not measured at this shape, within a factor of 2 in {axis} or between two agreeing sizes"


def decided(entry: Mapping, captured: bool) -> str:
    """The path an entry gives a call: its graph_path for a call captured into a CUDA graph
    where it has one, else its path."""
    return entry.get("graph_path", entry["path"]) if captured else entry["path"]


_loaded: Dict[Tuple[str, float], FusedTable] = {}
# choose() reads the table on every call; a caller on a hot path keeps its answers (the torch
# operators, per process group), keyed by this number among the rest, which forget() bumps.
generation = 0


def forget() -> None:
    """Have the callers that keep choices decide every shape again (a catalog was rewritten
    in place, or another one named)."""
    global generation
    generation += 1


def _default_catalog() -> Optional[Path]:
    raw = settings.get("GC3_CONFIG")
    return Path(raw) if raw.endswith(".json") else None


# Where the catalog of this machine is; the drop-in's machine selection replaces it.
catalog_path: Callable[[], Optional[Path]] = _default_catalog


def table(path: Optional[Path] = None) -> Optional[FusedTable]:
    path = path if path is not None else catalog_path()
    if path is None:
        return None
    try:
        stamp = os.stat(path).st_mtime
    except OSError:
        return None
    key = (str(path), stamp)
    got = _loaded.get(key)
    if got is None:
        got = _loaded[key] = FusedTable.from_catalog(path)
    return got


def forced(path: Optional[str], env=None) -> Optional[bool]:
    """True/False where the caller or GC3_FUSED forces a path, None for auto."""
    if path is not None:
        if path not in PATHS + ("auto",):
            raise InputError(f"path must be one of fused, sequential, auto; got {path!r}")
        return None if path == "auto" else path == "fused"
    return settings.get("GC3_FUSED", env)


def choose(op: str, gpus: int, dtype: str, shape: Mapping[str, int], path: Optional[str] = None,
           chunks: Optional[int] = None, env=None, catalog: Optional[Path] = None,
           captured: bool = False) -> Choice:
    """`catalog`: the machine catalog the caller's communicator serves (runtime_cuda.nccl.machine);
    GC3_CONFIG's, where it names a JSON catalog, wins as it does for the collectives.
    `captured`: the call is being captured into a CUDA graph (decided())."""
    source = catalog_path() or catalog
    force = forced(path, env)
    measured = table(source) if source is not None else None
    hit, how = (None, "no measured catalog for this machine") if measured is None else \
        measured.lookup(op, gpus, dtype, shape, captured)
    n = chunks or (hit["chunks"] if hit else DEFAULT_CHUNKS)
    tiles = hit.get("peer_tiles", "store") if hit else "store"
    if force is not None:
        return Choice(force, n, f"{'fused' if force else 'sequential'} forced (path= or GC3_FUSED)", tiles)
    if hit is None:
        return Choice(False, n, f"sequential: {how}")
    picked = decided(hit, captured)
    if captured and "graph_path" in hit:
        times = f"in a CUDA graph: fused {hit.get('graph_fused_us')} us, sequential {hit.get('graph_sequential_us')} us"
    else:
        times = f"fused {hit.get('fused_us')} us, sequential {hit.get('sequential_us')} us"
    return Choice(picked == "fused", n, f"{picked} ({how} in {measured.source}: {times})", tiles)
