"""A GC3_CONFIG that runs every shipped sample for N ranks with the LL128
protocol (keeping the XML's schedule), so the fuzz exercises those programs
under that protocol:

    python scripts/ll128_config.py 2 > /tmp/ll128.json
    GC3_CONFIG=/tmp/ll128.json mpirun -np 2 python scripts/fuzz_dropin.py ...
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def config(nranks: int, index: Path = ROOT / "ir_samples" / "index.json") -> dict:
    entries = json.loads(index.read_text())["algorithms"]
    out = []
    for e in entries:
        if e.get("ranks") != nranks or "file" not in e:   # the small-message kernels have no protocol to change
            continue
        e = dict(e, file=str((index.parent / e["file"]).resolve()), protocol="LL128",
                 name=f"{Path(e['file']).stem}+LL128")
        out.append(e)
    if not out:
        raise SystemExit(f"no shipped sample for {nranks} ranks in {index}")
    return {"version": 1, "algorithms": out}


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        raise SystemExit("usage: python scripts/ll128_config.py NRANKS")
    print(json.dumps(config(int(sys.argv[1])), indent=1))
