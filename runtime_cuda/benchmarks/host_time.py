"""Host time per call on one GPU (small messages: what the host adds to each call):

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \\
        mpirun --bind-to none -np 2 python scripts/bench_host_time.py [--size 1KiB] [--calls 40] [--rounds 7]

(or `python -m runtime_cuda.benchmarks.host_time ...` in place of the script).

Processes may share a GPU (NcclCommunicator.from_mpi).  Every kind of launch
the drop-in makes gets a row: per collective one interpreter program (the first
LL candidate of the library, instances 1), and each small-message kernel
(gc3.limits.SMALL_KERNELS: one-shot allreduce, allgather and reducescatter,
two-shot allreduce), each served through the drop-in from a catalog written for
this run (one communicator per catalog), and timed on the same kernel and the
same pre-packed parameter block:

  bare      the drop-in's own launch (NcclCommunicator.prepared_launch),
            re-issued with cuLaunchKernel from Python, once through
            cuda.bindings when importable and once through CuPy's driver
            module -- no Python above the driver call;
  query     the stream-capture query alone (cudaStreamIsCapturing, as CuPy
            wraps it; no launch): every repeat asks it;
  launch    that launch object called (the broken-communicator check and the
            driver call: what a prepared call adds to a bare launch);
  reissue   the launch group's Reissue.issue (capture query, stream order,
            the bound driver call): what the drop-in's repeat path calls under
            the communicator's lookup;
  eager     the drop-in call through cupy.cuda.nccl's named method
            (comm.allReduce(...), comm.allGather(...), ...), back to back;
  graph100  a CUDA graph of 100 drop-in calls, replayed: per call = / 100;
  graph1    a CUDA graph of one drop-in call, replayed.

"host" is the time the issuing loop takes per call (`--calls` calls, fewer
than the launch queue holds, so the GPU does not throttle it); "gpu" is the
time per call until the stream drains.  The loops alternate, `--rounds` times
(the order reversed every other round, so none always goes first), so that a
slow stretch of a shared machine hits all alike: each is reported as the median
and the fastest of its rounds, and "eager-bare" is the median of the per-round
differences against the bare launcher of the lower median, with their range.
A second estimate pairs single calls: the bare launches and the eager call
take turns call by call (the order rotating), each timed alone, `--rounds` x
`--calls` turns in all, and "paired" is the median of the per-turn differences
eager - bare for each bare launcher, with their quartiles: the pairs see the
same moment of the machine, so the GPU's time-slicing and the launch queue's
state, which swing a 40-call loop by microseconds, mostly cancel.
Python's garbage collector is off while a loop runs; nothing is pinned (run
mpirun with --bind-to none: its default binds a rank to one core, where its
launches and its spinning peers compete; the header says how many CPUs rank 0
may run on).  The graphs are timed once, for reference.  Every row's data is
checked through the drop-in before and after the timed loops
(perf_gpu.run_case, as `gc3 bench` does).
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

COLLS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
# The layers of the drop-in's repeat path, timed alone between the bare launch and the named call.
LAYERS = ("query", "launch", "reissue")


def _uncounted(launch) -> int:
    """The launch's parameter block that bumps no stream-order counter (StreamOrder.counted)."""
    return launch.captured_params_ptr if getattr(launch, "counting", None) is not None else launch.params_ptr


def bare_launchers():
    """[(name, make(launch, stream) -> a no-argument launch)]: cuda.bindings'
    cuLaunchKernel when importable, and CuPy's driver module, each issuing the
    drop-in's own launch (`head`: the same function, grid and block; the same
    parameter block, less the stream order's counter where the launch counts
    itself: a bare launch is no call the order counted; cooperative where the
    drop-in launches it so) with the handles converted once, outside the timed loop."""
    from cupy_backends.cuda.api import driver

    def make_cupy(launch, stream):
        head, params = launch.head, _uncounted(launch)
        if launch.coop:
            return lambda: driver.launchCooperativeKernel(*head, stream, params)
        return lambda: driver.launchKernel(*head, stream, params, 0)

    out = []
    try:
        from cuda.bindings import driver as cb
    except ImportError:
        cb = None
    if cb is not None:
        def make_cb(launch, stream):
            f, s = cb.CUfunction(launch.head[0]), cb.CUstream(stream)
            gx, gy, gz, bx, by, bz, shmem = launch.head[1:]
            params = _uncounted(launch)
            ok = cb.CUresult.CUDA_SUCCESS

            if launch.coop:
                def go():
                    err, = cb.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params)
                    if err != ok:
                        raise RuntimeError(f"cuLaunchCooperativeKernel failed: {err}")
            else:
                def go():
                    err, = cb.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, 0)
                    if err != ok:
                        raise RuntimeError(f"cuLaunchKernel failed: {err}")
            return go
        out.append(("cuda.bindings", make_cb))
    out.append(("cupy", make_cupy))
    return out


def named_call(comm, coll: str, send: int, recv: int, count: int, dtype: int, op, stream: int, root: int = 0):
    """A no-argument call of cupy.cuda.nccl's own method for `coll`, as a user's program makes it."""
    if coll == "allreduce":
        return lambda: comm.allReduce(send, recv, count, dtype, op, stream)
    if coll == "reducescatter":
        return lambda: comm.reduceScatter(send, recv, count, dtype, op, stream)
    if coll == "allgather":
        return lambda: comm.allGather(send, recv, count, dtype, stream)
    if coll == "alltoall":
        return lambda: comm.allToAll(send, recv, count, dtype, stream)
    if coll == "broadcast":
        return lambda: comm.broadcast(send, recv, count, dtype, root, stream)
    raise ValueError(f"no named call for {coll!r} (known: {', '.join(COLLS)})")


def write_catalogs(folder: Path, nranks: int) -> list:
    """The catalogs one run serves its rows from, each with at most one entry per
    collective: [(catalog file name, {collective: (label, inplace)})].  First one
    LL interpreter program per collective, out of place where the library has one
    (else in place, and called in place), every size; then one catalog per
    small-message kernel name, for the collectives that kernel serves."""
    from gc3 import limits
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
    out = [("interpreter.json", chosen, entries)]
    for kernel in limits.SMALL_ALLREDUCE_KERNELS:
        colls = [c for c in COLLS if kernel in limits.SMALL_KERNELS.get(c, ())]
        cands = [k for c in colls for k in tune.kernel_candidates(c, nranks, 1) if k.kernel == kernel]
        out.append((f"{kernel}.json", {k.collective: (k.label, False) for k in cands},
                    [{"kernel": kernel, "collective": k.collective, "ranks": nranks, "name": k.label} for k in cands]))
    for name, _, algorithms in out:
        (folder / name).write_text(json.dumps({"version": 1, "algorithms": algorithms}))
    return [(name, rows) for name, rows, _ in out]


def parse_args(argv=None) -> argparse.Namespace:
    from gc3.units import parse_size

    ap = argparse.ArgumentParser(description="host time per drop-in call against a bare launch (mpirun -np N)")
    ap.add_argument("--size", default="1KiB", help="nccl-tests size (the larger buffer), e.g. 1KiB")
    ap.add_argument("--calls", type=int, default=40, help="calls per timed loop (below the launch queue depth)")
    ap.add_argument("--rounds", type=int, default=7, help="alternations of the bare and eager loops")
    ap.add_argument("--current", action="store_true",
                    help="make the calls' stream CuPy's current one (stream.use(), as `with stream:` does); "
                         "the drop-in then holds it between calls instead of marking each call's end")
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


def paired_summary(turns: dict) -> dict:
    """turns: {column: [host us of one call per turn]} for the bare:<launcher> columns and eager,
    all of one length (turn k of each column ran in the same turn).  Per bare launcher: the
    median of eager - bare over the turns and the quartiles of those differences."""
    counts = {k: len(v) for k, v in turns.items()}
    if len(set(counts.values())) != 1 or min(counts.values(), default=0) < 4:
        raise ValueError(f"every column needs the same number of turns, at least 4, got {counts}")
    if "eager" not in turns or not any(k.startswith("bare:") for k in turns):
        raise ValueError(f"need eager and at least one bare:<launcher> column, got {sorted(turns)}")
    out = {}
    for k in turns:
        if k.startswith("bare:"):
            diffs = [e - b for e, b in zip(turns["eager"], turns[k])]
            q1, med, q3 = statistics.quantiles(diffs, n=4)   # the middle cut is the median
            out[k] = {"median": med, "q1": q1, "q3": q3}
    return out


def format_table(rows, size: str, nprocs: int, device: str, rounds: int, calls: int, cpus: int) -> list:
    """rows: (collective, algorithm, summarize(...) with the columns graph100 and graph1 added as
    (host us, gpu us), graph100 already per call)."""
    bares = [k for k in rows[0][2] if k.startswith("bare:")] if rows else []
    timed = bares + [k for k in LAYERS if rows and k in rows[0][2]] + ["eager"]
    head = {"graph100": "graph100/100"}
    lines = [f"# host time per call, {size}, {nprocs} processes on {device}; {rounds} rounds of {calls} calls, "
             f"bare and eager alternating; rank 0 may run on {cpus} CPU(s)",
             "# bare, eager: host us per call as median/fastest of the rounds; graphs: host/gpu us, timed once; "
             "eager-bare: median of the per-round differences against the bare launcher of the lower median "
             "(marked *), and their range; paired-<launcher>: median [quartiles] of eager - bare over single "
             "calls taking turns"]
    lines.append(f"{'collective':14} {'algorithm':34} "
                 + " ".join(f"{head.get(c, c):>18}" for c in timed + ["graph100", "graph1"])
                 + f" {'eager-bare':>10} {'range':>13}"
                 + "".join(f" {'paired-' + b[len('bare:'):]:>22}" for b in bares))
    for coll, label, t in rows:
        d = t["eager-bare"]
        cells = [f"{t[c]['median']:.2f}/{t[c]['min']:.2f}" + ("*" if c == d["bare"] else "") for c in timed]
        cells += [f"{t[c][0]:.2f}/{t[c][1]:.2f}" for c in ("graph100", "graph1")]
        spread = f"{d['min']:.2f}..{d['max']:.2f}"
        pairs = [t["paired"][b] for b in bares]
        lines.append(f"{coll:14} {label:34} " + " ".join(f"{c:>18}" for c in cells)
                     + f" {d['median']:10.2f} {spread:>13}"
                     + "".join(f" {p['median']:.2f}[{p['q1']:.2f},{p['q3']:.2f}]".rjust(23) for p in pairs))
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
    from runtime_cuda.nccl.constants import DTYPE_CODES
    from runtime_cuda.nccl.perf_gpu import Host, local_device

    world = MPI.COMM_WORLD
    host = Host()
    cupy.cuda.Device(local_device(host.rank)).use()
    folder = Path(world.bcast(tempfile.mkdtemp(prefix="gc3-host-time-") if host.rank == 0 else None))
    catalogs = world.bcast(write_catalogs(folder, host.size) if host.rank == 0 else None)
    os.environ.pop("GC3_DEBUG", None)   # TRACE would take every call through selection: not the hot path
    launchers = bare_launchers()
    nbytes = args.nbytes
    stream = cupy.cuda.Stream(non_blocking=True)
    if args.current:
        stream.use()
    buf_bytes = nbytes * host.size + 4096
    send, recv = cupy.zeros(buf_bytes, cupy.uint8), cupy.zeros(buf_bytes, cupy.uint8)
    code = DTYPE_CODES["float32"]
    rows = []
    for name, chosen in catalogs:
        os.environ["GC3_CONFIG"] = str(folder / name)
        comm = NcclCommunicator.from_mpi(world)
        for coll, (label, inplace) in chosen.items():
            rows.append((coll, label, time_row(args, comm, host, launchers, coll, label, inplace, send, recv,
                                               stream, code)))
        comm.destroy()
    if host.rank == 0:
        dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        dev = dev.decode() if isinstance(dev, bytes) else dev
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print("\n".join(format_table(rows, args.size, host.size, dev, args.rounds, args.calls, cpus)), flush=True)
    return 0


def turns(stream, world, columns, n: int, per_sync: int) -> dict:
    """{column: [host us]}: `n` turns in which every column's call runs once, timed alone,
    in an order that rotates by one each turn; the stream is drained every `per_sync` turns
    (each turn queues one kernel per column: the launch queue must not fill)."""
    clock = time.perf_counter_ns
    out = {name: [] for name, _ in columns}
    stream.synchronize()
    world.Barrier()
    gc.disable()
    try:
        for k in range(n):
            if k and k % per_sync == 0:
                stream.synchronize()
            j = k % len(columns)
            for name, fn in columns[j:] + columns[:j]:
                t0 = clock()
                fn()
                out[name].append((clock() - t0) / 1e3)
    finally:
        gc.enable()
    stream.synchronize()
    return out


def time_row(args, comm, host, launchers, coll, label, inplace, send, recv, stream, code) -> dict:
    """One row: the collective served by `label` through `comm`, checked, then timed every way."""
    from runtime_cuda.core import streams
    from runtime_cuda.nccl.constants import ITEMSIZE, OP_CODES
    from runtime_cuda.nccl.perf import element_count, nccl_count
    from runtime_cuda.nccl.perf_gpu import BenchConfig, place, run_case

    world = host.comm
    nbytes = args.nbytes
    count = nccl_count(coll, element_count(coll, nbytes, ITEMSIZE[code], host.size), host.size)
    op = OP_CODES["sum"] if coll in ("allreduce", "reducescatter") else None
    _, wrong, first, route = run_case(comm.submit, host, BenchConfig((), (), warmup=2, iters=5), coll, nbytes,
                                      inplace, send, recv, stream)
    routes = world.allgather(route)
    if wrong or any(r != label for r in routes):
        raise SystemExit(f"{coll}: {wrong} wrong ({first}), served by {routes} (expected {label} everywhere)")
    p = place(coll, inplace, send, recv, count, host.rank, ITEMSIZE[code])
    args_ = (coll, p.send, p.recv, count, code, op, stream.ptr, 0)
    call = named_call(comm, *args_)
    call()   # a repeat of exactly these arguments: prepared_launch knows its launch now
    launch = comm.prepared_launch(*args_)
    reissue = comm.prepared_reissue(*args_)
    if launch is None or reissue is None:
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

    ptr = stream.ptr
    columns = [(f"bare:{name}", make(launch, ptr)) for name, make in launchers]
    query, issue = streams.capture_query(), reissue.issue
    columns += [("query", lambda: query(ptr)), ("launch", lambda: launch(ptr)), ("reissue", lambda: issue(ptr)),
                ("eager", call)]
    samples = {name: [] for name, _ in columns}
    for r in range(args.rounds):
        # Every rank runs the same order: each loop's kernels meet their peers'.
        for name, fn in (columns if r % 2 == 0 else columns[::-1]):
            samples[name].append(timed(fn, args.calls))
    t = summarize(samples)
    t["paired"] = paired_summary(turns(stream, world, [(n, f) for n, f in columns if n.startswith("bare:")]
                                       + [("eager", call)], args.rounds * args.calls, args.calls))
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
    comm.check_async_error()
    # Every timed launch ran the real collective: its data must still be right.
    _, wrong, first, _ = run_case(comm.submit, host, BenchConfig((), (), warmup=0, iters=1), coll, nbytes,
                                  inplace, send, recv, stream)
    if wrong:
        raise SystemExit(f"{coll}: {wrong} wrong after the timed loops ({first})")
    return t


if __name__ == "__main__":
    sys.exit(main())
