"""Host time per call on one GPU (issue 18, "small messages at the floor"):

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \\
        mpirun -np 2 python scripts/bench_host_time.py [--size 1KiB] [--calls 40] [--rounds 7]

Processes may share a GPU (NcclCommunicator.from_mpi).  Per collective, one
small-message candidate (the first LL one of the library, instances 1) is
served through the drop-in from a catalog written for this run, and timed
four ways, all on the same kernel and the same pre-packed parameter block:

  bare      the drop-in's own Launch (NcclCommunicator.prepared_launch),
            re-issued with cuLaunchKernel from Python, once through
            cuda.bindings when importable and once through CuPy's driver
            module -- no Python above the driver call;
  eager     the drop-in call (`NcclCommunicator.submit`), back to back;
  graph100  a CUDA graph of 100 drop-in calls, replayed: per call = / 100;
  graph1    a CUDA graph of one drop-in call, replayed.

"host" is the time the issuing loop takes per call (`--calls` calls, fewer
than the launch queue holds, so the GPU does not throttle it); "gpu" is the
time per call until the stream drains.  The bare and eager loops alternate,
`--rounds` times (the order reversed every other round, so neither always
goes first), so that a slow stretch of a shared machine hits both alike: each
is reported as the median and the fastest of its rounds, and "eager-bare" is
the median of the per-round differences against the bare launcher of the
lower median, with their range.  Python's garbage collector is off while a
loop runs; nothing is pinned (mpirun binds as it likes; the header says how
many CPUs rank 0 may run on).  The graphs are timed once, for reference.
Every collective's data is checked through the drop-in before and after the
timed loops (perf_gpu.run_case, as `gc3 bench` does).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLLS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")


def bare_launchers():
    """[(name, make(launch, stream) -> a no-argument launch)]: cuda.bindings'
    cuLaunchKernel when importable, and CuPy's driver module, each issuing the
    drop-in's own Launch (the same function, grid, block and parameter block;
    cooperative where the drop-in launches it so) with the handles converted
    once, outside the timed loop."""
    from cupy_backends.cuda.api import driver

    def make_cupy(launch, stream):
        fn, grid, block, params = launch.fn, launch.grid, launch.block, launch.params_ptr
        if launch.coop:
            return lambda: driver.launchCooperativeKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params)
        return lambda: driver.launchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, 0)

    out = []
    try:
        from cuda.bindings import driver as cb
    except ImportError:
        cb = None
    if cb is not None:
        def make_cb(launch, stream):
            f, s = cb.CUfunction(launch.fn), cb.CUstream(stream)
            grid, block, params = launch.grid, launch.block, launch.params_ptr
            ok = cb.CUresult.CUDA_SUCCESS

            if launch.coop:
                def go():
                    err, = cb.cuLaunchCooperativeKernel(f, grid, 1, 1, block, 1, 1, 0, s, params)
                    if err != ok:
                        raise RuntimeError(f"cuLaunchCooperativeKernel failed: {err}")
            else:
                def go():
                    err, = cb.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, params, 0)
                    if err != ok:
                        raise RuntimeError(f"cuLaunchKernel failed: {err}")
            return go
        out.append(("cuda.bindings", make_cb))
    out.append(("cupy", make_cupy))
    return out


def write_catalog(folder: Path, nranks: int) -> dict:
    """One LL candidate per collective, out of place where the library has one
    (else in place, and called in place), every size: {collective: (label, inplace)}."""
    from gc3.ir.xml_io import write_xml
    from runtime_cuda.nccl import tune

    grid = tune.Grid(instances=(1,), protocols=("LL",), pipeline_chunks=(1,))
    chosen, entries = {}, []
    for coll in tune.applicable(nranks, 1, COLLS):
        cands, _ = tune.candidates(coll, nranks, 1, grid)
        cand = next((c for c in cands if not c.inplace), cands[0] if cands else None)
        if cand is None:
            continue
        write_xml(cand.program, folder / f"{cand.label}.xml")
        entries.append({"file": f"{cand.label}.xml", "collective": coll, "ranks": nranks, "inplace": cand.inplace,
                        "name": cand.label, **({"root": 0} if coll == "broadcast" else {})})
        chosen[coll] = (cand.label, cand.inplace)
    (folder / "catalog.json").write_text(json.dumps({"version": 1, "algorithms": entries}))
    return chosen


def parse_args(argv=None) -> argparse.Namespace:
    from gc3.units import parse_size

    ap = argparse.ArgumentParser(description="host time per drop-in call against a bare launch (mpirun -np N)")
    ap.add_argument("--size", default="1KiB", help="nccl-tests size (the larger buffer), e.g. 1KiB")
    ap.add_argument("--calls", type=int, default=40, help="calls per timed loop (below the launch queue depth)")
    ap.add_argument("--rounds", type=int, default=7, help="alternations of the bare and eager loops")
    args = ap.parse_args(argv)
    try:
        args.nbytes = parse_size(args.size)
    except Exception as exc:   # parse_size's own message names the value
        ap.error(f"--size: {exc}")
    if args.nbytes <= 0:
        ap.error(f"--size must be positive, got {args.size}")
    if not 2 <= args.calls <= 1000:
        ap.error(f"--calls must be in 2..1000 (a longer loop fills the launch queue and times the GPU), "
                 f"got {args.calls}")
    if not 1 <= args.rounds <= 100:
        ap.error(f"--rounds must be in 1..100, got {args.rounds}")
    return args


def summarize(rounds: dict) -> dict:
    """rounds: {column: [(host us, gpu us) per round]} for the bare:<launcher>... columns and
    eager, all with the same number of rounds.  Per column its median and fastest host time;
    "eager-bare": against the bare launcher of the lower median host time, the per-round
    differences' median, min and max, and that launcher's column."""
    counts = {k: len(v) for k, v in rounds.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise ValueError(f"every column needs the same, nonzero number of rounds, got {counts}")
    bares = [k for k in rounds if k.startswith("bare:")]
    if "eager" not in rounds or not bares:
        raise ValueError(f"need eager and at least one bare:<launcher> column, got {sorted(rounds)}")
    out = {k: {"median": statistics.median(h for h, _ in v), "min": min(h for h, _ in v)} for k, v in rounds.items()}
    ref = min(bares, key=lambda k: out[k]["median"])
    diffs = [e[0] - b[0] for e, b in zip(rounds["eager"], rounds[ref])]
    out["eager-bare"] = {"median": statistics.median(diffs), "min": min(diffs), "max": max(diffs), "bare": ref}
    return out


def format_table(rows, size: str, nprocs: int, device: str, rounds: int, calls: int, cpus: int) -> list:
    """rows: (collective, algorithm, summarize(...) with the columns graph100 and graph1 added as
    (host us, gpu us), graph100 already per call)."""
    bares = [k for k in rows[0][2] if k.startswith("bare:")] if rows else []
    head = {"graph100": "graph100/100"}
    lines = [f"# host time per call, {size}, {nprocs} processes on {device}; {rounds} rounds of {calls} calls, "
             f"bare and eager alternating; rank 0 may run on {cpus} CPU(s)",
             "# bare, eager: host us per call as median/fastest of the rounds; graphs: host/gpu us, timed once; "
             "eager-bare: median of the per-round differences against the bare launcher of the lower median "
             "(marked *), and their range"]
    lines.append(f"{'collective':14} {'algorithm':34} "
                 + " ".join(f"{head.get(c, c):>18}" for c in bares + ["eager", "graph100", "graph1"])
                 + f" {'eager-bare':>10} {'range':>13}")
    for coll, label, t in rows:
        d = t["eager-bare"]
        cells = [f"{t[c]['median']:.2f}/{t[c]['min']:.2f}" + ("*" if c == d["bare"] else "") for c in bares + ["eager"]]
        cells += [f"{t[c][0]:.2f}/{t[c][1]:.2f}" for c in ("graph100", "graph1")]
        spread = f"{d['min']:.2f}..{d['max']:.2f}"
        lines.append(f"{coll:14} {label:34} " + " ".join(f"{c:>18}" for c in cells)
                     + f" {d['median']:10.2f} {spread:>13}")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    try:
        return run(args)
    except BaseException:
        # One rank failing alone would leave the others waiting in a collective: stop them all.
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1


def run(args) -> int:
    import cupy
    from mpi4py import MPI

    from runtime_cuda.nccl import NcclCommunicator
    from runtime_cuda.nccl.constants import DTYPE_CODES, ITEMSIZE, OP_CODES
    from runtime_cuda.nccl.perf import element_count, nccl_count
    from runtime_cuda.nccl.perf_gpu import BenchConfig, Host, local_device, place, run_case

    world = MPI.COMM_WORLD
    host = Host()
    cupy.cuda.Device(local_device(host.rank)).use()
    folder = Path(world.bcast(tempfile.mkdtemp(prefix="gc3-host-time-") if host.rank == 0 else None))
    chosen = world.bcast(write_catalog(folder, host.size) if host.rank == 0 else None)
    os.environ["GC3_CONFIG"] = str(folder / "catalog.json")
    os.environ.pop("GC3_DEBUG", None)   # TRACE would take every call through selection: not the hot path
    comm = NcclCommunicator.from_mpi(world)
    launchers = bare_launchers()
    nbytes = args.nbytes
    stream = cupy.cuda.Stream(non_blocking=True)
    buf_bytes = nbytes * host.size + 4096
    send, recv = cupy.zeros(buf_bytes, cupy.uint8), cupy.zeros(buf_bytes, cupy.uint8)
    code = DTYPE_CODES["float32"]
    rows = []
    for coll, (label, inplace) in chosen.items():
        count = nccl_count(coll, element_count(coll, nbytes, ITEMSIZE[code], host.size), host.size)
        op = OP_CODES["sum"] if coll in ("allreduce", "reducescatter") else None
        _, wrong, first, route = run_case(comm.submit, host, BenchConfig((), (), warmup=2, iters=5), coll, nbytes,
                                          inplace, send, recv, stream)
        routes = world.allgather(route)
        if wrong or any(r != label for r in routes):
            raise SystemExit(f"{coll}: {wrong} wrong ({first}), served by {routes} (expected {label} everywhere)")
        p = place(coll, inplace, send, recv, count, host.rank, ITEMSIZE[code])
        args_ = (coll, p.send, p.recv, count, code, op, stream.ptr, 0)

        def call():
            comm.submit(*args_)

        call()   # a repeat of exactly these arguments: prepared_launch knows its launch now
        launch = comm.prepared_launch(*args_)
        if launch is None:
            raise SystemExit(f"{coll}: the drop-in keeps no prepared launch for a repeat of {label}")

        def timed(fn, n):
            stream.synchronize()
            world.Barrier()
            gc.disable()
            try:
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                t1 = time.perf_counter()
            finally:
                gc.enable()
            stream.synchronize()
            return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6

        columns = [(f"bare:{name}", make(launch, stream.ptr)) for name, make in launchers] + [("eager", call)]
        samples = {name: [] for name, _ in columns}
        for r in range(args.rounds):
            # Every rank runs the same order: each loop's kernels meet their peers'.
            for name, fn in (columns if r % 2 == 0 else columns[::-1]):
                samples[name].append(timed(fn, args.calls))
        t = summarize(samples)
        stream.begin_capture()
        for _ in range(100):
            call()
        g100 = stream.end_capture()
        stream.begin_capture()
        call()
        g1 = stream.end_capture()
        h100 = timed(lambda: g100.launch(stream=stream), 1)
        t["graph100"] = (h100[0] / 100, h100[1] / 100)
        t["graph1"] = timed(lambda: g1.launch(stream=stream), args.calls)
        rows.append((coll, label, t))
        comm.check_async_error()
        # Every timed launch ran the real collective: its data must still be right.
        _, wrong, first, _ = run_case(comm.submit, host, BenchConfig((), (), warmup=0, iters=1), coll, nbytes,
                                      inplace, send, recv, stream)
        if wrong:
            raise SystemExit(f"{coll}: {wrong} wrong after the timed loops ({first})")
    comm.destroy()
    if host.rank == 0:
        dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        dev = dev.decode() if isinstance(dev, bytes) else dev
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print("\n".join(format_table(rows, args.size, host.size, dev, args.rounds, args.calls, cpus)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
