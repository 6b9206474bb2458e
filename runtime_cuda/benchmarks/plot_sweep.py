"""busbw and ratio to NCCL vs size, per collective, from bench_runtime.py logs:

    python3 scripts/plot_sweep.py                      # the 2x H200 sweep of runtime_cuda/README.md
    python3 scripts/plot_sweep.py LOG [LOG ...] --upto 1MiB -o out.png --title "..."
    python3 -m runtime_cuda.benchmarks.plot_sweep ...   # the same, without the script

A log holds one row per candidate and size (`bench_runtime.py --log`: coll, size,
program, gc3 us, ..., nccl us, ...).  Per (collective, size) the fastest candidate
is kept, as the README's table does; with several logs, sizes up to each log's
--upto bound come from that log (the README: rows up to 1 MiB from the run after
LL threadblock merging, the larger ones from the full sweep before it).  The
allreduce candidates run in place (bench_runtime times in-place schedules in
place, NCCL too); the others out of place.  Drawn by runtime_cuda.nccl.perf.plot.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from runtime_cuda import measured_file

DEFAULT_LOGS = (measured_file("sweep_2xh200_2026-11-22_rows_small_tbmerge.txt"),
                measured_file("sweep_2xh200_2026-11-22_rows.txt"))
DEFAULT_UPTO = ("1MiB", "")
DEFAULT_OUT = measured_file("sweep_2xh200_2026-11-22.png")
DEFAULT_TITLE = "2x H200 (NV18), float32, fastest gc3 candidate per size vs NCCL, bench_runtime.py, 2026-11-22"
INPLACE = ("allreduce",)


def read_log(path: Path) -> Dict[Tuple[str, int], Tuple[str, float, float]]:
    """{(coll, bytes): (program, gc3 us, nccl us)} of the fastest candidate per size."""
    from gc3.errors import InputError
    from gc3.units import parse_size

    lines = path.read_text().splitlines()
    if not lines:
        raise SystemExit(f"{path}: empty")
    fields = _fields(lines[0].split())
    missing = [f for f in ("coll", "size", "program", "gc3 us", "nccl us") if f not in fields]
    if missing:
        raise SystemExit(f"{path}:1: the header has no {', '.join(missing)} column ({lines[0].strip()})")
    best: Dict[Tuple[str, int], Tuple[str, float, float]] = {}
    for n, line in enumerate(lines[1:], start=2):
        cells = line.split()
        if not cells:
            continue
        if len(cells) != len(fields):
            raise SystemExit(f"{path}:{n}: {len(cells)} cells, the header names {len(fields)}")
        row = dict(zip(fields, cells))
        try:
            key = (row["coll"], parse_size(row["size"]))
            gc3_us, nccl_us = float(row["gc3 us"]), float(row["nccl us"])
        except (ValueError, InputError) as exc:
            raise SystemExit(f"{path}:{n}: {exc}") from None
        if key not in best or gc3_us < best[key][1]:
            best[key] = (row["program"], gc3_us, nccl_us)
    return best


def _fields(words: Sequence[str]) -> List[str]:
    """Join the header's two-word column names ("gc3 us", "nccl graph", ...)."""
    out, k = [], 0
    while k < len(words):
        if k + 1 < len(words) and words[k + 1] in ("us", "busbw", "graph"):
            out.append(f"{words[k]} {words[k + 1]}")
            k += 2
        else:
            out.append(words[k])
            k += 1
    return out


def rows_of(logs: Sequence[Path], upto: Sequence[Optional[int]], nranks: int) -> list:
    from runtime_cuda.nccl.perf import Row, measure

    merged: Dict[Tuple[str, int], Tuple[str, float, float]] = {}
    for path, limit in zip(logs, upto):
        for key, val in read_log(path).items():
            if key not in merged and (limit is None or key[1] <= limit):
                merged[key] = val
    rows = []
    for (coll, nbytes), (program, g_us, n_us) in sorted(merged.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1])):
        place = "ip" if coll in INPLACE else "oop"
        row = Row(coll, nbytes, 0, "float32", "sum", 0, nranks)
        row.results = {"gc3": {place: measure(coll, nbytes, nranks, g_us, None, program)},
                       "nccl": {place: measure(coll, nbytes, nranks, n_us, None, "NCCL")}}
        rows.append(row)
    return rows


def _order(coll: str) -> int:
    from runtime_cuda.nccl.call import COLLECTIVES
    return COLLECTIVES.index(coll) if coll in COLLECTIVES else len(COLLECTIVES)


def main(argv=None) -> int:
    from gc3.units import parse_size
    from runtime_cuda.nccl import perf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*", type=Path, help="bench_runtime.py --log files, earlier ones win")
    ap.add_argument("--upto", action="append", default=None,
                    help="per log, the largest size taken from it ('' = all); default: all")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("-o", "--output", type=Path, default=None)
    ap.add_argument("--title", default=None)
    ap.add_argument("--dpi", type=int, default=60)
    args = ap.parse_args(argv)
    if not args.logs:
        args.logs, args.upto = list(DEFAULT_LOGS), list(DEFAULT_UPTO)
        args.output, args.title = args.output or DEFAULT_OUT, args.title or DEFAULT_TITLE
    if args.output is None:
        ap.error("-o is required with log files")
    upto = args.upto or [""] * len(args.logs)
    if len(upto) != len(args.logs):
        ap.error(f"--upto given {len(upto)} times for {len(args.logs)} log(s)")
    rows = rows_of(args.logs, [parse_size(u) if u else None for u in upto], args.ranks)
    if not rows:
        raise SystemExit("no rows in the logs")
    perf.plot(rows, args.output, title=args.title or "", dpi=args.dpi)
    print(f"wrote {args.output} ({args.output.stat().st_size // 1024} KiB, {len(rows)} sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
