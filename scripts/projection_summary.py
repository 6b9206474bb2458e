"""The README's projection tables, from catalogs `gc3 tune --model-only` wrote:

    gc3 tune --model-only --ranks 8 -o p8/catalog.json
    gc3 tune --model-only --ranks 16 --nodes 2 -o p16/catalog.json
    python3 scripts/projection_summary.py p8/catalog.json p16/catalog.json

Per catalog: its provenance (rank and node count, cost-model preset and
calibration), then per collective (one placement, --place) the size ranges of
each algorithm the tuner chose, with its predicted time at the first and last
tuned size of the range and the busbw it implies at the last (nccl-tests'
factor).  Nothing is measured:
every number is the simulator's cost model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def summarize(path: Path, place: str = "outofplace") -> List[str]:
    from gc3.units import bus_factor
    from runtime_cuda.nccl.sizes import format_size

    try:
        prov = json.loads(path.read_text())["provenance"]
        choices, ranks, nodes = prov["choices"], prov["ranks"], prov["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"{path}: not a catalog written by gc3 tune ({type(exc).__name__}: {exc})") from None
    if prov.get("measured", True):
        raise SystemExit(f"{path}: a measured catalog; this summarizes cost-model projections only")
    model = prov.get("cost_model", {})
    out = [f"# PROJECTION (cost model, not measured): {ranks} ranks on {nodes} node(s), {place}, "
           f"preset {model.get('preset')} ({model.get('name')})",
           f"# {model.get('calibration')}; busbw at the last size of each range"]
    out.append(f"{'collective':13} {'sizes':>13}  {'algorithm':44} {'predicted us':>16} {'busbw':>9}")
    for coll, places in choices.items():
        picks = places.get(place)
        if picks is None:
            out.append(f"{coll:13} {'all':>13}  {'no candidate: NCCL'}")
            continue
        runs: List[list] = []
        for p in picks:
            if runs and runs[-1][0] == p["algorithm"]:
                runs[-1][1].append(p)
            else:
                runs.append([p["algorithm"], [p]])
        for alg, ps in runs:
            first, last = ps[0], ps[-1]
            sizes = format_size(first["bytes"]) + (f"-{format_size(last['bytes'])}" if len(ps) > 1 else "")
            if last["time_us"] is None:
                out.append(f"{coll:13} {sizes:>13}  {alg or 'NCCL'}")
                continue
            times = f"{first['time_us']:.1f}" + (f"-{last['time_us']:.1f}" if len(ps) > 1 else "")
            bw = last["bytes"] / (last["time_us"] * 1e-6) / 1e9 * bus_factor(coll, ranks)
            out.append(f"{coll:13} {sizes:>13}  {alg or 'NCCL':44} {times:>16} {bw:6.0f} GB/s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("catalogs", nargs="+", type=Path)
    ap.add_argument("--place", choices=("outofplace", "inplace"), default="outofplace")
    args = ap.parse_args(argv)
    for k, path in enumerate(args.catalogs):
        if k:
            print()
        print("\n".join(summarize(path, args.place)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
