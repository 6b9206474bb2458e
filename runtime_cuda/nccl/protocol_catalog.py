"""A GC3_CONFIG that runs every shipped sample for N ranks and every algorithm of the
library under one protocol (`gc3 catalog protocol`), so that a differential fuzz
exercises all of them with it; LL128's 128-byte stores, for one, only meet real
NVLink on several GPUs.

The drop-in takes the first entry that serves a call, so one entry per program and
placement would let only the first program of each collective run.  Instead the
sizes are cut into bands (x4 apart from 1 KiB) and each (collective, placement)
hands its bands to its programs in turn: every program serves small and large
calls once there are no more programs than half the bands.  Shipped samples keep
their XML's schedule; library algorithms are compiled with one instance.  In-place
entries come first, as in `gc3 tune`'s catalogs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from gc3.errors import InputError

from . import tune
from .catalog import DEFAULT_INDEX
from .samples import KiB

BANDS = 11        # [0, 1 KiB), then x4 per band; the last is unbounded


class Program(NamedTuple):
    name: str
    path: str
    inplace: bool          # the IR is in place
    serves_oop: bool       # it may serve out-of-place calls (in-place IRs after the runtime's copy)
    root: Optional[int]


def band(k: int) -> Tuple[int, Optional[int]]:
    lo = 0 if k == 0 else KiB << (2 * (k - 1))
    return lo, (None if k == BANDS - 1 else (KiB << (2 * k)) - 1)


def shipped(nranks: int, index: Path, protocol: str) -> Dict[str, List[Program]]:
    out: Dict[str, List[Program]] = {}
    for e in json.loads(index.read_text())["algorithms"]:
        if e.get("ranks") != nranks or "file" not in e:   # the small-message kernels have no protocol to change
            continue
        inplace = bool(e.get("inplace", True))
        p = Program(f"{Path(e['file']).stem}+{protocol}", str((index.parent / e["file"]).resolve()), inplace,
                    bool(e.get("outofplace", not inplace)), e.get("root"))
        if p not in out.setdefault(e["collective"], []):     # an IR listed twice (two ranges) is one program
            out[e["collective"]].append(p)
    return out


def library_programs(nranks: int, ir_dir: Path, protocol: str) -> Dict[str, List[Program]]:
    from gc3.ir.xml_io import to_xml

    grid = tune.Grid(instances=(1,), protocols=(protocol,), pipeline_chunks=(4,))
    out: Dict[str, List[Program]] = {}
    ir_dir.mkdir(parents=True, exist_ok=True)
    for coll in tune.applicable(nranks, 1, tune.COLLECTIVES):
        cands, _ = tune.candidates(coll, nranks, 1, grid)
        only_inplace = not any(not c.inplace for c in cands)     # allreduce: every IR serves both
        for c in cands:
            path = ir_dir / f"{c.label}.xml"
            path.write_text(to_xml(c.program))
            out.setdefault(coll, []).append(Program(c.label, str(path), c.inplace, not c.inplace or only_inplace,
                                                    c.root))
    return out


def config(nranks: int, ir_dir: Path, protocol: str = "LL128", index: Path = DEFAULT_INDEX) -> dict:
    """The catalog (a dict for JSON): every program for `nranks` ranks under `protocol`, its
    library IRs written into `ir_dir`."""
    progs = shipped(nranks, index, protocol)
    if not progs:
        raise InputError(f"no shipped sample for {nranks} ranks in {index}")
    for coll, more in library_programs(nranks, ir_dir, protocol).items():
        progs.setdefault(coll, []).extend(more)
    first, then = [], []
    for coll, ps in progs.items():
        for inplace, out in ((True, first), (False, then)):
            mine = [p for p in ps if p.inplace] if inplace else [p for p in ps if p.serves_oop]
            for k in range(BANDS):
                if not mine:
                    break
                p = mine[k % len(mine)]
                lo, hi = band(k)
                entry = {"file": p.path, "collective": coll, "ranks": nranks, "inplace": p.inplace,
                         "outofplace": not inplace, "protocol": protocol, "min_bytes": lo, "max_bytes": hi,
                         "name": p.name}
                if p.root is not None:
                    entry["root"] = p.root
                out.append(entry)
    return {"version": 1, "algorithms": first + then}
