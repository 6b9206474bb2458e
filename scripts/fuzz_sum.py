"""Fold fuzz summary lines of one configuration (mode, gpus, ranks, hw; consecutive
seeds) into the one line measured/fuzz.txt keeps.

    python scripts/fuzz_sum.py out/fuzz_v4.txt [more files] >> measured/fuzz.txt
"""
import sys
from collections import OrderedDict


def parse(line: str) -> "OrderedDict[str, str]":
    words = line.split()
    if not words or words[0] != "fuzz":
        raise ValueError(f"not a fuzz summary line: {line!r}")
    rest = " ".join(words[1:])
    head, hw = rest.split(" hw=", 1)
    hw, date = hw.rsplit(" date=", 1)
    fields = OrderedDict(w.split("=", 1) for w in head.split())
    fields["hw"], fields["date"] = hw, date
    return fields


def fold(lines):
    rows = [parse(x) for x in lines if x.strip()]
    if not rows:
        raise ValueError("no lines")
    same = ("mode", "gpus", "ranks", "hw")
    for r in rows[1:]:
        for k in same:
            if r[k] != rows[0][k]:
                raise ValueError(f"lines differ in {k}: {rows[0][k]!r} vs {r[k]!r}")
    seeds = sorted((int(a), int(b)) for a, b in (r["seed"].split("..") for r in rows))
    for (_, b), (a, _) in zip(seeds, seeds[1:]):
        if a != b + 1:
            raise ValueError(f"seeds are not consecutive: {seeds}")
    out = OrderedDict(rows[0])
    for k in ("calls", "gc3_served", "mismatches", "hangs"):
        out[k] = str(sum(int(r[k]) for r in rows))
    for k in ("max_bytes", "streams"):
        out[k] = str(max(int(r[k]) for r in rows))
    out["seed"] = f"{seeds[0][0]}..{seeds[-1][1]}"
    out["date"] = max(r["date"] for r in rows)
    return "fuzz " + " ".join(f"{k}={v}" for k, v in out.items())


if __name__ == "__main__":
    lines = [line for path in sys.argv[1:] for line in open(path)]
    print(fold(lines))
