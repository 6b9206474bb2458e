"""Compile speed: gc3 against msccl-tools on two large programs.

    python3 scripts/bench_compile.py [--repeat N] [--check]
    python3 -m gc3.benchmarks.compile_speed [--repeat N] [--check]

Times trace + lower + XML text for
  * a 64-rank ring AllReduce with 8 instances, and
  * a 16-rank all-pairs AllReduce with 2 instances (msccl-tools' example:
    256 chunks per rank, scatter to scratch, 240 local reduces per rank on 16
    threadblocks, gather; threadblocks placed by hand),
written below in both DSLs the same way.  msccl-tools is timed only if
`import msccl` works (it is not on PyPI); otherwise the table shows the
figures measured with msccl-tools on another machine (5.6 s and 9.9 s on their machine),
labelled as such, and the ratio is against those.  The target is at most one
fifth of msccl-tools' time.  Each time is the best of --repeat runs.
"""
from __future__ import annotations

import argparse
import sys
import time

from gc3 import Check, GC3Program, chunk
from gc3.ir.collectives import AllReduce
from gc3.compiler.pipeline import lower
from gc3.ir.xml_io import to_xml

REFERENCE_S = {"ring": 5.6, "allpairs": 9.9}   # msccl-tools, measured on another machine
TARGET = 5                                       # at least this many times faster


# The two programs are msccl-tools' formulations; tests/lower_programs.py
# uses these definitions, so the tests check that what is timed is correct.
def gc3_ring(size: int, instances: int = 1, **options) -> GC3Program:
    """msccl-tools' ring: chunk r starts at rank r, is reduced around the ring,
    and the rank that finished it passes it on."""
    with GC3Program("allreduce_ring", AllReduce(size, size, inplace=True), instances=instances,
                    **options) as prog:
        for r in range(size):
            c = chunk(r, "in", r)
            for step in range(1, size):
                c = chunk((r + step) % size, "in", r).reduce(c)
            for step in range(size - 1):
                c = c.copy((r + step) % size, "in", r)
        Check()
    return prog


def gc3_allpairs(size: int, instances: int = 1, **options) -> GC3Program:
    """msccl-tools' all-pairs AllReduce: scatter into scratch, local reduces on
    `size` threadblocks, gather; every op placed by hand (sendtb/recvtb)."""
    with GC3Program("allreduce_allpairs", AllReduce(size, size * size, inplace=True), instances=instances,
                    **options) as prog:
        for r1 in range(size):
            for r2 in range(size):
                if r1 != r2:
                    chunk(r1, "in", r2 * size, count=size).copy(r2, "scratch", sendtb=r2, recvtb=r1)
        for r in range(size):
            for index in range(size * (size - 1)):
                chunk(r, "in", r * size + index % size).reduce(chunk(r, "scratch", index), sendtb=index % size)
        for r1 in range(size):
            for r2 in range(size):
                if r1 != r2:
                    chunk(r1, "in", r1 * size, count=size).copy(r2, "in", r1 * size, sendtb=r2, recvtb=r1)
        Check()
    return prog


def gc3_compile(make, *args):
    """(trace, lower, xml) seconds and the step count of one compilation."""
    t0 = time.perf_counter()
    program = make(*args)
    t1 = time.perf_counter()
    ir = lower(program)
    t2 = time.perf_counter()
    text = to_xml(ir)
    t3 = time.perf_counter()
    steps = sum(len(tb.steps) for g in ir.gpus for tb in g.threadblocks)
    return (t1 - t0, t2 - t1, t3 - t2), steps, len(text)


def msccl_available() -> bool:
    try:
        import msccl.language  # noqa: F401
    except ImportError:
        return False
    return True


def msccl_compile(which: str, size: int, instances: int) -> float:
    """Seconds msccl-tools takes to trace and lower the same program to XML text."""
    from msccl.language import MSCCLProgram, chunk as mchunk, Check as mcheck, Buffer
    from msccl.language.collectives import AllReduce as MAllReduce
    from msccl.topologies import fully_connected as mfully_connected

    t0 = time.perf_counter()
    if which == "ring":
        prog = MSCCLProgram("allreduce_ring", mfully_connected(size), MAllReduce(size, size, True), instances)
        with prog:
            for r in range(size):
                c = mchunk(r, Buffer.input, r)
                for step in range(1, size):
                    c = mchunk((r + step) % size, Buffer.input, r).reduce(c)
                for step in range(size - 1):
                    c = c.copy((r + step) % size, Buffer.input, r)
            mcheck()
            prog.generate_xml()
    else:
        prog = MSCCLProgram("allreduce_allpairs", mfully_connected(size), MAllReduce(size, size * size, True),
                            instances)
        with prog:
            for r1 in range(size):
                for r2 in range(size):
                    if r1 != r2:
                        mchunk(r1, Buffer.input, r2 * size, size).copy(r2, "scratch", sendtb=r2, recvtb=r1)
            for r in range(size):
                for index in range(size * (size - 1)):
                    mchunk(r, Buffer.input, r * size + index % size).reduce(
                        mchunk(r, "scratch", index), sendtb=index % size)
            for r1 in range(size):
                for r2 in range(size):
                    if r1 != r2:
                        mchunk(r1, Buffer.input, r1 * size, size).copy(r2, Buffer.input, r1 * size,
                                                                         sendtb=r2, recvtb=r1)
            mcheck()
            prog.generate_xml()
    return time.perf_counter() - t0


CASES = [
    ("ring", "64-rank ring AllReduce, 8 instances", gc3_ring, 64, 8),
    ("allpairs", "16-rank all-pairs AllReduce, 2 instances", gc3_allpairs, 16, 2),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per program; the best is reported")
    ap.add_argument("--check", action="store_true", help="exit 1 if a program misses the target")
    args = ap.parse_args(argv)
    have_msccl = msccl_available()
    rows, ok = [], True
    for key, title, make, size, instances in CASES:
        best = None
        for _ in range(max(args.repeat, 1)):
            parts, steps, nbytes = gc3_compile(make, size, instances)
            if best is None or sum(parts) < sum(best):
                best = parts
        total = sum(best)
        if have_msccl:
            theirs = min(msccl_compile(key, size, instances) for _ in range(max(args.repeat, 1)))
            source = "measured here"
        else:
            theirs, source = REFERENCE_S[key], "issue author's figure, not measured here"
        ratio = total / theirs
        met = ratio <= 1 / TARGET
        ok &= met
        rows.append((title, steps, best, total, theirs, source, ratio, met))

    print(f"gc3 compile speed (best of {args.repeat}; python {sys.version.split()[0]})")
    print(f"{'program':42} {'steps':>6} {'trace':>7} {'lower':>7} {'xml':>7} {'gc3':>7} "
          f"{'msccl-tools':>11} {'ratio':>6}  target <= 1/{TARGET}")
    for title, steps, (tr, lo, xm), total, theirs, source, ratio, met in rows:
        print(f"{title:42} {steps:6d} {tr:6.3f}s {lo:6.3f}s {xm:6.3f}s {total:6.3f}s {theirs:10.2f}s "
              f"{ratio:6.3f}  {'met' if met else 'MISSED'}")
    if not have_msccl:
        print("msccl-tools is not installed (`import msccl` failed): its column holds the issue author's "
              "figures (5.6 s, 9.9 s), measured on their machine, not here.")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
