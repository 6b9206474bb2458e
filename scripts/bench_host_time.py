"""Host time per call on one GPU (issue 18, "small messages at the floor"):

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \\
        mpirun -np 2 python scripts/bench_host_time.py [--size 1KiB] [--calls 200]

Processes may share a GPU (NcclCommunicator.from_mpi).  Per collective, one
small-message candidate (the first LL one of the library, instances 1) is
served through the drop-in from a catalog written for this run, and timed
four ways, all on the same kernel and the same pre-packed parameter block:

  bare      the drop-in's own Launch, re-issued with cuLaunchKernel from
            Python (cuda.bindings when importable, else CuPy's driver
            module: the line says which) -- no Python above the driver call;
  eager     the drop-in call (`NcclCommunicator.submit`), back to back;
  graph100  a CUDA graph of 100 drop-in calls, replayed: per call = / 100;
  graph1    a CUDA graph of one drop-in call, replayed.

"host" is the time the issuing loop takes per call (`--calls` calls, fewer
than the launch queue holds, so the GPU does not throttle it); "gpu" is the
time per call until the stream drains.  Every collective's data is first
checked once through the drop-in (perf_gpu.run_case, as `gc3 bench` does).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLLS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")


def bare_launcher():
    """(name, make(fn, grid, block, stream, params) -> a no-argument launch),
    through cuda.bindings when importable, else CuPy's driver module; the
    handles are converted once, outside the timed loop."""
    try:
        from cuda.bindings import driver as cb
    except ImportError:
        from cupy_backends.cuda.api import driver

        def make(fn, grid, block, stream, params):
            return lambda: driver.launchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, 0)
        return "CuPy driver.launchKernel (cuda.bindings not importable)", make

    def make(fn, grid, block, stream, params):
        f, s = cb.CUfunction(fn), cb.CUstream(stream)

        def launch():
            err, = cb.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, params, 0)
            if err != cb.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuLaunchKernel failed: {err}")
        return launch
    return "cuda.bindings cuLaunchKernel", make


def write_catalog(folder: Path, nranks: int) -> dict:
    """One LL candidate per collective, out of place where the library has one
    (allreduce's are all in place: called in place), every size:
    {collective: (label, inplace)}."""
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1KiB")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()

    import cupy
    from mpi4py import MPI

    from runtime_cuda.nccl import NcclCommunicator
    from runtime_cuda.nccl.call import Call
    from runtime_cuda.nccl.constants import DTYPE_CODES, ITEMSIZE, OP_CODES
    from runtime_cuda.nccl.perf import element_count, nccl_count
    from runtime_cuda.nccl.perf_gpu import BenchConfig, Host, local_device, place, run_case
    from runtime_cuda.perf import parse_size

    world = MPI.COMM_WORLD
    host = Host()
    cupy.cuda.Device(local_device(host.rank)).use()
    folder = Path(world.bcast(tempfile.mkdtemp(prefix="gc3-host-time-") if host.rank == 0 else None))
    chosen = world.bcast(write_catalog(folder, host.size) if host.rank == 0 else None)
    os.environ["GC3_CONFIG"] = str(folder / "catalog.json")
    comm = NcclCommunicator.from_mpi(world)
    how, bare = bare_launcher()
    nbytes = parse_size(args.size)
    stream = cupy.cuda.Stream(non_blocking=True)
    buf_bytes = nbytes * host.size + 4096
    send, recv = cupy.zeros(buf_bytes, cupy.uint8), cupy.zeros(buf_bytes, cupy.uint8)
    code = DTYPE_CODES["float32"]
    rows = []
    for coll, (label, inplace) in chosen.items():
        count = nccl_count(coll, element_count(coll, nbytes, ITEMSIZE[code], host.size), host.size)
        op = OP_CODES["sum"] if coll in ("allreduce", "reducescatter") else None

        def issue(*a):
            return comm.submit(*a)

        _, wrong, first, route = run_case(issue, host, BenchConfig((), (), warmup=2, iters=5), coll, nbytes,
                                          inplace, send, recv, stream)
        if wrong or route != label:
            raise SystemExit(f"{coll}: {wrong} wrong ({first}), served by {route} (expected {label})")
        p = place(coll, inplace, send, recv, count, host.rank, ITEMSIZE[code])

        def call():
            comm.submit(coll, p.send, p.recv, count, code, op, stream.ptr, 0)

        group = next(g for k, g in comm._backend._groups.items() if k[1] == label)
        call()                     # the prepared call of exactly these buffers
        in_elems = Call(coll, p.send, p.recv, count, code, op, stream.ptr, host.size, host.rank, 0).in_elems
        launch = group._prepared[((p.send,), (p.recv,), in_elems, "float32", "sum")].launch
        bare_call = bare(launch.fn, launch.grid, launch.block, stream.ptr, launch.params_ptr)

        def timed(fn, n):
            stream.synchronize()
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            stream.synchronize()
            return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6

        stream.begin_capture()
        for _ in range(100):
            call()
        g100 = stream.end_capture()
        stream.begin_capture()
        call()
        g1 = stream.end_capture()
        b = timed(bare_call, args.calls)
        e = timed(call, args.calls)
        h100 = timed(lambda: g100.launch(stream=stream), max(args.calls // 100, 2))
        h1 = timed(lambda: g1.launch(stream=stream), args.calls)
        rows.append((coll, label, b, e, (h100[0] / 100, h100[1] / 100), h1))
        comm.check_async_error()
    comm.destroy()
    if host.rank == 0:
        dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        dev = dev.decode() if isinstance(dev, bytes) else dev
        print(f"# host time per call, {args.size}, {host.size} processes on {dev}; bare launch: {how}")
        print(f"# us per call as host/gpu; eager-bare = the drop-in's host time above a bare launch")
        print(f"{'collective':14} {'algorithm':34} {'bare':>13} {'eager':>13} {'eager-bare':>10} "
              f"{'graph100/100':>13} {'graph1':>13}")
        for coll, label, b, e, h100, h1 in rows:
            f = lambda t: f"{t[0]:5.2f}/{t[1]:6.2f}"  # noqa: E731
            print(f"{coll:14} {label:34} {f(b):>13} {f(e):>13} {e[0] - b[0]:10.2f} {f(h100):>13} {f(h1):>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
