"""Data-checks XML programs with one process per GPU:

    mpirun --allow-run-as-root -np 2 python3 -m runtime_cuda.ranks.ipc_check a.xml [b.xml ...] [--quick | --large]
        [--proto=PROTO] [--dtypes=D1,D2,...]

Runs each program for sizes from one lane per chunk to tens of MiB, uneven
ones included, every dtype and op, in and out of place, plus a broken
program (a receive with no send) that must end in RuntimeTimeoutError.
With --large, only the large sizes instead: 256 MiB per rank (or the most
ir_samples/index.json recommends the program for) in float32 and an uneven
count just below it in bfloat16 (checking.large_cases).  Each program runs
with its XML's protocol and another one, or with --proto=PROTO only;
--dtypes limits the dtype sweep to those dtypes with op sum (fewer kernels to
build).
Prints one summary line per program on rank 0 and exits 1 on any wrong
element or unexpected error."""
from __future__ import annotations

import copy
import sys
import time
from typing import Optional, Sequence

from gc3.dtypes import DTYPES
from gc3.errors import GC3Error, RuntimeTimeoutError
from gc3.ir.xml_io import read_xml

from ..core.checking import LARGE_BYTES, CheckResult, geometry, large_cases, recommended_max_bytes, run_checked
from .ipc import IpcRanks

OPS = ("sum", "prod", "max", "min")


def sizes(prog, quick: bool):
    bi, c = geometry(prog)
    out = [bi * c, bi * (c + 1), bi * (2 * c - 1), bi * (c * 1000 + 3), bi * c * 65537]
    # The large sizes stay at tens of MiB however many chunks (channels) a program has.
    lanes = max(1, (1 << 22) // (bi * c))
    return out if quick else out + [bi * (c * min(1048576, lanes) + c - 1), bi * c * min(4194304, 4 * lanes)]


def check_program(path: str, comm, quick: bool, proto_only: Optional[str] = None,
                  dtypes: Optional[Sequence[str]] = None) -> CheckResult:
    prog = read_xml(path)
    total = CheckResult()
    protos = (proto_only,) if proto_only else (None, "LL" if prog.proto != "LL" else "Simple")
    for proto in protos:
        group = IpcRanks(prog, comm, proto=proto)
        for n in sizes(prog, quick):
            for inplace in (False, True):
                total.add(run_checked(group, n, "float32", "sum", inplace))
        for dtype in dtypes or sorted(DTYPES):
            for op in ("sum",) if dtypes else OPS:
                for n in sizes(prog, True)[1::2]:
                    total.add(run_checked(group, n, dtype, op, inplace=bool(n % 2)))
        total.add(run_checked(group, sizes(prog, True)[-1], "bfloat16", "sum", False, repeat=20))
        group.close()
    return total


def check_large(path: str, comm) -> CheckResult:
    prog = read_xml(path)
    group = IpcRanks(prog, comm)
    total = CheckResult()
    for n, dtype, inplace in large_cases(prog, recommended_max_bytes(path) or LARGE_BYTES):
        total.add(run_checked(group, n, dtype, "sum", inplace))
    group.close()
    return total


def check_timeout(path: str, comm) -> str:
    """Drop rank 0's first send: rank 1 must time out naming where; rank 0 is told by the abort word."""
    prog = copy.deepcopy(read_xml(path))
    tb = next(t for t in prog.gpu(0).threadblocks if any(s.type == "s" for s in t.steps))
    k = next(i for i, s in enumerate(tb.steps) if s.type == "s")
    tb.steps[k].type = "nop"
    tb.steps[k].depid = tb.steps[k].deps = -1
    group = IpcRanks(prog, comm, timeout=0.5)
    msg = ""
    try:
        run_checked(group, 4096 * geometry(prog)[0], "float32", "sum", False)
    except RuntimeTimeoutError as exc:
        msg = str(exc)
    comm.Barrier()
    if not msg:   # this rank finished; the peer that gave up must have told it through its abort word
        try:
            group.executor.check()
        except RuntimeTimeoutError as exc:
            msg = str(exc)
    return msg


def check_setup_failure(path: str, comm) -> str:
    """Rank 1 alone asks for a GPU that does not exist: every rank must raise,
    none may be left waiting for it in a collective."""
    import cupy

    bad = cupy.cuda.runtime.getDeviceCount() + 7 if comm.rank == 1 else None
    try:
        IpcRanks(read_xml(path), comm, device=bad).close()
    except GC3Error as exc:
        return str(exc)
    return ""


def main(argv) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    quick = "--quick" in argv
    large = "--large" in argv
    proto = next((a.split("=", 1)[1] for a in argv if a.startswith("--proto=")), None)
    dtypes = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--dtypes=")), None)
    unknown = sorted(set(dtypes or ()) - set(DTYPES))
    if unknown:
        raise SystemExit(f"ipc_check: unknown dtype(s) {', '.join(unknown)} in --dtypes; known: {', '.join(sorted(DTYPES))}")
    paths = [a for a in argv if not a.startswith("--")]
    failed = False
    for path in paths:
        t0 = time.perf_counter()
        try:
            res = check_large(path, comm) if large else check_program(path, comm, quick, proto, dtypes)
            err = ""
        except Exception as exc:  # reported with the rank, then the job fails
            res, err = CheckResult(), f"{type(exc).__name__}: {exc}"
        results = comm.gather((res.checked, res.wrong, res.first, err), root=0)
        if comm.rank == 0:
            checked = sum(r[0] for r in results)
            wrong = sum(r[1] for r in results)
            errs = [f"rank {i}: {r[3]}" for i, r in enumerate(results) if r[3]]
            firsts = [r[2] for r in results if r[2]]
            print(f"IPC-CHECK {path}: {checked} elements checked, {wrong} wrong, "
                  f"{time.perf_counter() - t0:.1f} s {'; ' + firsts[0] if firsts else ''}{'; ' + '; '.join(errs) if errs else ''}",
                  flush=True)
            failed |= bool(wrong or errs or not checked)
    if paths and not large:
        msgs = comm.gather(check_timeout(paths[0], comm), root=0)
        if comm.rank == 0:
            print(f"IPC-TIMEOUT rank 0: {msgs[0] or 'NO ERROR RAISED'}", flush=True)
            print(f"IPC-TIMEOUT rank 1: {msgs[1] or 'NO ERROR RAISED'}", flush=True)
            failed |= not all(msgs)
        msgs = comm.gather(check_setup_failure(paths[0], comm), root=0)
        if comm.rank == 0:
            for r, m in enumerate(msgs):
                print(f"IPC-SETUP rank {r}: {m or 'NO ERROR RAISED'}", flush=True)
            failed |= not all(msgs)
    failed = comm.bcast(failed, root=0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
