#!/usr/bin/env python3
"""Time `gc3.simulate` on an 8-rank all-pairs AllReduce with 2 instances.

The program is built by hand as IR (tests/sim_programs.py), written to XML
(about 265 KB) and simulated on a 1 MiB float32 buffer per rank, with data
checking, race detection and the cost model all on.

    python3 scripts/bench_simulate.py [--size 1MiB] [--repeat 5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gc3.simulator import simulate  # noqa: E402
from gc3.ir.xml_io import from_xml, to_xml  # noqa: E402
from sim_programs import allpairs_allreduce  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1MiB")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--per-peer", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    text = to_xml(allpairs_allreduce(args.ranks, args.instances, args.per_peer))
    t = time.perf_counter()
    prog = from_xml(text)
    parse_s = time.perf_counter() - t
    nsteps = sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks)
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        res = simulate(prog, size=args.size)
        times.append(time.perf_counter() - t)
    if not res.ok:
        print(res.summary())
        return 1
    t = time.perf_counter()
    simulate(text, size=args.size)
    end_to_end = time.perf_counter() - t
    print(f"program: {prog.name}, {nsteps} steps, XML {len(text) / 1e3:.0f} KB (parse {parse_s:.3f} s)")
    print(f"simulate {args.size}: best {min(times):.3f} s, median {sorted(times)[len(times) // 2]:.3f} s "
          f"over {args.repeat} runs; from XML text {end_to_end:.3f} s (one Python thread)")
    print(f"predicted: {res.predicted_time * 1e6:.1f} us ({res.timing.provenance})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
