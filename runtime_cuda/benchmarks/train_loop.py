"""A training-style loop of in-place allreduces, gc3's drop-in against NCCL.

    mpirun -np N python scripts/bench_train_loop.py [--steps 200] [--gc3-only] [--no-nccl]

Each rank binds GPU `rank % ndev` and holds 4 float32 gradient buffers of
1,024 / 262,144 / 5,000,000 / 17 elements. Everything runs on one
non-blocking stream made current with `s.use()`, as a CuPy program would:
each step does, for every buffer, an in-place allreduce SUM through the
communicator (passing `s.ptr`) and then `g /= n` on the same stream.

The data make the result exact: every buffer starts as base + deviation,
where base depends on the buffer and element and the deviations of all ranks
sum to zero, so each allreduce gives exactly n * base and `g /= n` gives
base again (a correctly rounded division of an exact multiple). After the
timed steps every element must equal base bit for bit; any missed ordering
(a scaling racing an allreduce, an upload still in flight) shows as a wrong
value.

Reported per backend: wall time of the steps (ending with s.synchronize()),
time per step, the host time spent inside the collective calls per call
(time.perf_counter around each call: whether gc3's Python call path
dominates a step), and whether the result is right. The slowest rank's
times are shown.

The NCCL side is cupy.cuda.nccl's own communicator. Where it cannot be made
(several ranks on one GPU, which NCCL refuses, or --no-nccl), the gc3 side is
built over MPI with `NcclCommunicator.from_mpi` (calls gc3 cannot serve then
go to a host-staged MPI stand-in) and NCCL's row says why it is missing.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_SUM

SIZES = (1024, 262_144, 5_000_000, 17)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="timed steps (default 200)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (algorithm set-up, default 5)")
    ap.add_argument("--gc3-only", action="store_true", help="do not run the NCCL side")
    ap.add_argument("--no-nccl", action="store_true",
                    help="build gc3's communicator over MPI (from_mpi) and do not run NCCL")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps must be at least 1 (got {args.steps})")
    if args.warmup < 0:
        ap.error(f"--warmup must not be negative (got {args.warmup})")
    return args


# --- the data: exact under allreduce SUM then division by n -------------------------

def base_values(xp, buffer: int, size: int):
    """What every element must hold after each step: integers in [-30, 30]."""
    i = xp.arange(size, dtype=xp.int64)
    return ((i * 7 + buffer * 13) % 61 - 30).astype(xp.float32)


def deviation(xp, rank: int, nranks: int, buffer: int, size: int):
    """This rank's offset from base; the offsets of all ranks sum to zero, so
    the allreduce mixes different data on every rank but sums to n * base."""
    i = xp.arange(size, dtype=xp.int64)
    c = ((i * 5 + buffer * 3 + 1) % 7 - 3).astype(xp.float32)
    return c * (-(nranks - 1) if rank == 0 else 1)


def initial_values(xp, rank: int, nranks: int, buffer: int, size: int):
    return base_values(xp, buffer, size) + deviation(xp, rank, nranks, buffer, size)


def first_mismatch(xp, got, want):
    """(#wrong, first wrong index, got, want), compared on the device."""
    bad = got != want
    k = int(xp.count_nonzero(bad))
    if not k:
        return 0, -1, 0.0, 0.0
    i = int(xp.argmax(bad))
    return k, i, float(got[i]), float(want[i])


def nccl_version_string(code: int) -> str:
    """NCCL's version code (major * 10000 + minor * 100 + patch since 2.9) as text."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


# --- one backend ------------------------------------------------------------------

@dataclass
class Result:
    backend: str
    total_ms: float = 0.0
    step_us: float = 0.0
    host_us_per_call: float = 0.0
    correct: Optional[bool] = None
    note: str = ""              # why it did not run, or the first wrong element, or who served the calls


def run_loop(comm, world, stream, steps: int, warmup: int, name: str) -> Result:
    import cupy

    rank, n = world.rank, world.size

    def fill(grads):
        for b, g in enumerate(grads):
            g[...] = initial_values(cupy, rank, n, b, g.size)

    def step(grads) -> float:
        host = 0.0
        for g in grads:
            t = time.perf_counter()
            comm.allReduce(g.data.ptr, g.data.ptr, g.size, NCCL_FLOAT32, NCCL_SUM, stream.ptr)
            host += time.perf_counter() - t
            g /= n
        return host

    # The current stream is `stream` (set by main with s.use()): the uploads and
    # the scaling run on it, as in a user program.
    grads = [cupy.empty(size, dtype=cupy.float32) for size in SIZES]
    fill(grads)
    for _ in range(warmup):
        step(grads)
    fill(grads)                     # start from rank-specific data again
    stream.synchronize()
    world.Barrier()
    host = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        host += step(grads)
    stream.synchronize()
    wall = time.perf_counter() - t0

    wrong, first = 0, ""
    for b, g in enumerate(grads):
        k, i, got, want = first_mismatch(cupy, g, base_values(cupy, b, g.size))
        if k and not wrong:
            first = f"rank {rank} buffer {b} ({g.size} floats) [{i}] = {got!r}, expected {want!r}"
        wrong += k
    stream.synchronize()
    del grads

    from mpi4py import MPI
    wall = world.allreduce(wall, op=MPI.MAX)
    host = world.allreduce(host, op=MPI.MAX)
    wrong = world.allreduce(wrong, op=MPI.SUM)
    firsts = [f for f in world.allgather(first) if f]
    served = getattr(comm, "served", None)
    note = firsts[0] if firsts else (_served_note(served) if served is not None else "")
    return Result(name, wall * 1e3, wall * 1e6 / steps, host * 1e6 / (steps * len(SIZES)), wrong == 0,
                  note if wrong == 0 else f"{wrong} wrong elements; first: {note}")


def _served_note(served) -> str:
    total = sum(served.values())
    by_nccl = served.get("NCCL", 0)
    return f"gc3 served {total - by_nccl} of {total} calls" if total else ""


def _agree(world, ok: bool, reason: str):
    """Every rank learns whether all ranks succeeded, and the first failure."""
    gathered = world.allgather((ok, reason))
    bad = [r for o, r in gathered if not o]
    return (not bad), (bad[0] if bad else "")


def shared_gpus(world, device: int) -> bool:
    """Whether two ranks of `world` use the same GPU (NCCL refuses that)."""
    import socket

    import cupy
    bus = cupy.cuda.Device(device).pci_bus_id
    places = world.allgather((socket.gethostname(), bus))
    return len(set(places)) < len(places)


def make_nccl(world, originals):
    """cupy.cuda.nccl's communicator, or (None, why not) on every rank."""
    uid = world.bcast(originals["get_unique_id"]() if world.rank == 0 else None, root=0)
    comm, reason = None, ""
    try:
        comm = originals["NcclCommunicator"](world.size, uid, world.rank)
    except Exception as exc:    # NCCL's own refusal, reported in the table
        reason = f"{type(exc).__name__}: {exc}"
    ok, reason = _agree(world, comm is not None, reason)
    return (comm if ok else None), reason


def make_gc3(world, over_mpi: bool):
    """gc3's drop-in communicator: through NCCL's uid exchange, or over MPI."""
    from runtime_cuda import nccl as dropin

    if over_mpi:
        return dropin.NcclCommunicator.from_mpi(world), "over MPI (from_mpi)"
    uid = world.bcast(dropin.get_unique_id() if world.rank == 0 else None, root=0)
    return dropin.NcclCommunicator(world.size, uid, world.rank), "through NCCL's unique id"


def table(results: List[Result], header: Sequence[str]) -> List[str]:
    lines = list(header)
    lines.append(f"{'backend':<14}{'total ms':>10}{'per-step us':>13}{'host us/call':>14}{'in calls':>10}"
                 f"  {'correct':<8} note")
    for r in results:
        if r.correct is None:
            lines.append(f"{r.backend:<14}{'-':>10}{'-':>13}{'-':>14}{'-':>10}  {'-':<8} {r.note}")
        else:
            # share of a step's wall time the host spent inside the collective calls
            share = r.host_us_per_call * len(SIZES) / r.step_us * 100 if r.step_us > 0 else 0.0
            lines.append(f"{r.backend:<14}{r.total_ms:>10.1f}{r.step_us:>13.1f}{r.host_us_per_call:>14.1f}"
                         f"{share:>9.0f}%  {'yes' if r.correct else 'NO':<8} {r.note}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import cupy
    from mpi4py import MPI

    try:
        from runtime_cuda.nccl.fallback import originals
        real = originals()       # cupy.cuda.nccl's own, even where GC3_NCCL=1 swapped the module
    except ImportError:
        from cupy.cuda import nccl as real_mod
        real = {k: getattr(real_mod, k) for k in ("NcclCommunicator", "get_unique_id")}

    world = MPI.COMM_WORLD
    rank, n = world.rank, world.size
    ndev = cupy.cuda.runtime.getDeviceCount()
    device = rank % ndev
    cupy.cuda.Device(device).use()
    s = cupy.cuda.Stream(non_blocking=True)
    s.use()

    nccl_comm, nccl_why = None, ""
    if args.no_nccl:
        nccl_why = "--no-nccl"
    elif shared_gpus(world, device):
        nccl_why = f"{n} ranks on {min(n, ndev)} GPU(s): NCCL refuses two ranks on one GPU"
    else:
        nccl_comm, nccl_why = make_nccl(world, real)

    results: List[Result] = []
    over_mpi = nccl_comm is None
    try:
        gc3_comm, how = make_gc3(world, over_mpi)
        ok, why = _agree(world, True, "")
    except Exception as exc:
        gc3_comm, how = None, ""
        ok, why = _agree(world, False, f"rank {rank}: {type(exc).__name__}: {exc}")
    if ok:
        r = run_loop(gc3_comm, world, s, args.steps, args.warmup, "gc3 drop-in")
        r.note = f"{r.note}; built {how}" if r.note else f"built {how}"
        results.append(r)
        gc3_comm.destroy()
    else:
        results.append(Result("gc3 drop-in", note=f"not available ({why})"))

    if args.gc3_only:
        pass
    elif nccl_comm is not None:
        results.append(run_loop(nccl_comm, world, s, args.steps, args.warmup, "NCCL"))
        nccl_comm.destroy()
    else:
        results.append(Result("NCCL", note=f"not available ({nccl_why})"))

    if rank == 0:
        props = cupy.cuda.runtime.getDeviceProperties(device)
        gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        try:
            from cupy.cuda import nccl as cnccl
            nver = nccl_version_string(cnccl.get_version())
        except Exception as exc:   # cupy built without NCCL
            nver = f"unavailable ({type(exc).__name__})"
        rt = cupy.cuda.runtime.runtimeGetVersion()
        header = [
            f"# training-style loop: {len(SIZES)} float32 buffers of {', '.join(f'{x:,}' for x in SIZES)} elements, "
            f"{args.steps} steps (+{args.warmup} warm-up), each: in-place allreduce SUM on a non-blocking "
            f"stream made current with s.use(), then g /= n",
            f"# device: {gpu}; {n} ranks on {min(n, ndev)} of {ndev} GPU(s); cupy {cupy.__version__}; "
            f"CUDA runtime {rt // 1000}.{rt % 1000 // 10}; NCCL {nver}",
            "# times: the slowest rank's; host us/call: time inside one allreduce call; in calls: the share "
            "of a step's wall time spent inside the calls",
        ]
        print("\n".join(table(results, header)), flush=True)
    return 0 if all(r.correct for r in results if r.correct is not None) and results[0].correct else 1


if __name__ == "__main__":
    sys.exit(main())
