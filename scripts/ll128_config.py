"""A GC3_CONFIG that runs every shipped sample for N ranks and every algorithm of
the library with the LL128 protocol, so the fuzz exercises all of them under
that protocol (its 128-byte stores only meet real NVLink on several GPUs):

    python scripts/ll128_config.py 4 > /tmp/ll128.json      # IRs written to /tmp/gc3_ll128_4r/
    GC3_CONFIG=/tmp/ll128.json mpirun -np 4 gc3 fuzz ...

The drop-in takes the first entry that serves a call, so one entry per program
and placement would let only the first program of each collective run.  Instead
the sizes are cut into bands (x4 apart from 1 KiB) and each (collective,
placement) hands its bands to its programs in turn: every program serves small
and large calls once there are no more programs than half the bands.  Shipped
samples keep their XML's schedule; library algorithms are compiled with one
instance.  In-place entries come first, as in `gc3 tune`'s catalogs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:      # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

KiB = 1 << 10
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


def shipped(nranks: int, index: Path) -> Dict[str, List[Program]]:
    out: Dict[str, List[Program]] = {}
    for e in json.loads(index.read_text())["algorithms"]:
        if e.get("ranks") != nranks or "file" not in e:   # the small-message kernels have no protocol to change
            continue
        inplace = bool(e.get("inplace", True))
        p = Program(f"{Path(e['file']).stem}+LL128", str((index.parent / e["file"]).resolve()), inplace,
                    bool(e.get("outofplace", not inplace)), e.get("root"))
        if p not in out.setdefault(e["collective"], []):     # an IR listed twice (two ranges) is one program
            out[e["collective"]].append(p)
    return out


def library_programs(nranks: int, ir_dir: Path) -> Dict[str, List[Program]]:
    from gc3.ir.xml_io import to_xml
    from runtime_cuda.nccl import tune

    grid = tune.Grid(instances=(1,), protocols=("LL128",), pipeline_chunks=(4,))
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


def config(nranks: int, index: Path = ROOT / "ir_samples" / "index.json", ir_dir: Optional[Path] = None) -> dict:
    ir_dir = ir_dir or Path(f"/tmp/gc3_ll128_{nranks}r")
    progs = shipped(nranks, index)
    if not progs:
        raise SystemExit(f"no shipped sample for {nranks} ranks in {index}")
    for coll, more in library_programs(nranks, ir_dir).items():
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
                         "outofplace": not inplace, "protocol": "LL128", "min_bytes": lo, "max_bytes": hi,
                         "name": p.name}
                if p.root is not None:
                    entry["root"] = p.root
                out.append(entry)
    return {"version": 1, "algorithms": first + then}


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        raise SystemExit("usage: python scripts/ll128_config.py NRANKS")
    print(json.dumps(config(int(sys.argv[1])), indent=1))
