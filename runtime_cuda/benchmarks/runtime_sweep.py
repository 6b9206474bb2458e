"""Time gc3's CUDA runtime against NCCL, one process per GPU:

    mpirun --allow-run-as-root -np 2 python3 scripts/bench_runtime.py [--max 1GiB] [--out table.txt]

For allreduce, allgather, reducescatter and alltoall at sizes from 1 KiB to
--max (x4 steps, sizes as nccl-tests counts them), it runs every candidate
program of runtime_cuda.candidates.CANDIDATES that serves the size (2-rank algorithms from
gc3/algorithms/, a protocol, a channel count, and optionally environment
settings such as the slot size), each through runtime_cuda.ranks.ipc, and NCCL
(cupy.cuda.nccl) on the same buffers in the same processes.  The table shows
the fastest candidate per size (`program`), its time and busbw, NCCL's, and
the ratio of busbw (ours / NCCL); --log writes every candidate's row.
Every size is checked once, before it is timed, on the GPU: inputs are small
integers generated from (rank, index), the output is compared exactly with
what it must hold (runtime_cuda.nccl.datacheck), and a wrong case prints its
first wrong element and is never hidden behind a faster right one.
Columns host_us (CPU time to enqueue one call) and, with --graph, graph_us
and nccl_graph_us (one call replayed from a CUDA graph, ours and NCCL's) show
where small-message time goes: without the CPU's launch path, both sides'
GPU time alone.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# The candidates live in the runtime, where `gc3 calibrate --from-sweep` reads a sweep's rows by them.
from runtime_cuda.candidates import CANDIDATES, MiB, compile_candidate


class _Env:
    """Environment settings in force while a launch group is built (it reads them once)."""

    def __init__(self, pairs):
        self.pairs, self.saved = pairs, {}

    def __enter__(self):
        for k, v in self.pairs:
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def nccl_call(nccl, comm, coll, sbuf, rbuf, n_in, stream, nranks):
    s, r, p = sbuf.data.ptr, rbuf.data.ptr, stream.ptr
    if coll == "allreduce":
        comm.allReduce(s, r, n_in, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, p)
    elif coll == "allgather":
        comm.allGather(s, r, n_in, nccl.NCCL_FLOAT32, p)
    elif coll == "reducescatter":
        comm.reduceScatter(s, r, n_in // nranks, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, p)
    else:
        blk = n_in // nranks
        nccl.groupStart()
        for peer in range(nranks):
            comm.send(s + peer * blk * 4, blk, nccl.NCCL_FLOAT32, peer, p)
            comm.recv(r + peer * blk * 4, blk, nccl.NCCL_FLOAT32, peer, p)
        nccl.groupEnd()


def timed(fn, iters, mpi_comm, stream) -> Tuple[float, float]:
    """(device us per call, host us to enqueue one call), the slower rank's."""
    import cupy
    from mpi4py import MPI

    for _ in range(3):
        fn()
    stream.synchronize()
    mpi_comm.Barrier()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / iters
    stop.record(stream)
    stop.synchronize()
    us = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / iters
    return mpi_comm.allreduce(us, op=MPI.MAX), mpi_comm.allreduce(host, op=MPI.MAX)


def check_once(call, coll, sbuf, rbuf, n_in, mpi_comm, stream) -> Tuple[int, str]:
    """Run `call` once on generated float32 inputs and compare every output
    element on the GPU: (#wrong over all ranks, the lowest wrong rank's first
    wrong element)."""
    import cupy

    from runtime_cuda.core import streams
    from runtime_cuda.nccl import datacheck

    rank, n = mpi_comm.rank, mpi_comm.size
    count = n_in // n if coll in ("reducescatter", "alltoall") else n_in
    with streams.current(stream):
        rbuf.fill(cupy.nan)
        datacheck.fill_input(cupy, sbuf, 0, rank, n_in, "sum", "float32", n)
    stream.synchronize()
    mpi_comm.Barrier()
    call()
    with streams.current(stream):
        res = datacheck.check_output(cupy, coll, rank, n, count, "sum", "float32", 0, rbuf)
    firsts = [f for f in mpi_comm.allgather(res.describe(rank)) if f]
    return mpi_comm.allreduce(res.wrong), (firsts[0] if firsts else "")


def graph_timed(fn, reps, mpi_comm, stream) -> float:
    """us per call when `reps` calls are replayed from one CUDA graph, the
    slower rank's (nan if either rank cannot capture)."""
    from mpi4py import MPI

    from runtime_cuda.nccl.perf_gpu import graph_us

    mpi_comm.Barrier()
    us = graph_us(fn, reps, 5, stream, lambda ok: mpi_comm.allreduce(int(ok), op=MPI.MIN) == 1)
    return mpi_comm.allreduce(us, op=MPI.MAX)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", default="1GiB")
    ap.add_argument("--min", default="1KiB")
    ap.add_argument("--colls", default="allreduce,allgather,reducescatter,alltoall")
    ap.add_argument("--only", default="", help="comma-separated candidate labels (default: all)")
    ap.add_argument("--graph", default="0", help="also time CUDA-graph replay for sizes up to this (0: never)")
    ap.add_argument("--out", default=None, help="write the table here")
    ap.add_argument("--log", default=None, help="write every candidate's row here")
    args = ap.parse_args(argv)

    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI

    from gc3.errors import RuntimeTimeoutError
    from runtime_cuda.ranks.ipc import IpcRanks
    from gc3.units import bus_factor, parse_size
    from runtime_cuda.core.perf import in_elems_for, nbytes_of

    world = MPI.COMM_WORLD
    rank, n = world.rank, world.size
    cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
    uid = nccl.get_unique_id() if rank == 0 else None
    ncomm = nccl.NcclCommunicator(n, world.bcast(uid, root=0), rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    sizes = []
    s = parse_size(args.min)
    while s <= parse_size(args.max):
        sizes.append(s)
        s *= 4
    graph_max = parse_size(args.graph)
    only = set(filter(None, args.only.split(",")))
    head = (f"{'coll':<14}{'size':>8}  {'program':<20}{'gc3 us':>9}{'gc3 busbw':>10}{'nccl us':>9}"
            f"{'nccl busbw':>11}{'ratio':>7}  check")
    loghead = (f"{'coll':<14}{'size':>8}  {'program':<20}{'gc3 us':>9}{'host us':>9}{'graph us':>9}"
               f"{'gc3 busbw':>10}{'nccl us':>9}{'nccl graph':>11}{'ratio':>7}  check")
    table, log = [head], [loghead]
    if rank == 0:
        print(head, flush=True)
    for coll in args.colls.split(","):
        cands = [c for c in CANDIDATES if c.coll == coll and (not only or c.label in only)]
        groups: Dict[str, object] = {}
        for size in sizes:
            rows: List[Tuple[float, str]] = []
            nccl_us: Optional[float] = None
            nccl_graph = math.nan
            for c in cands:
                if not c.lo <= size <= c.hi:
                    continue
                if c.label not in groups:
                    with _Env(c.env):
                        groups[c.label] = IpcRanks(compile_candidate(c), world, proto=c.proto)
                g = groups[c.label]
                if g is None or g.executor.broken:
                    continue
                n_in = in_elems_for(g.prog, size, 4)
                nbytes = nbytes_of(g.prog, n_in, 4)
                n_out = g._shape(n_in, 4)[0].out_elems
                sbuf = cupy.empty(n_in, dtype=cupy.float32)
                # In-place schedules (the allreduces) are timed in place, NCCL too.
                rbuf = sbuf if g.prog.inplace and n_out == n_in else cupy.empty(n_out, dtype=cupy.float32)
                iters = 200 if size <= MiB else 40 if size <= 64 * MiB else 8
                call = lambda: g.run_ptrs([sbuf.data.ptr], [rbuf.data.ptr], n_in, "float32", "sum", stream)  # noqa: E731
                try:
                    wrong, first = check_once(call, coll, sbuf, rbuf, n_in, world, stream)
                    ours, host = timed(call, iters, world, stream)
                    graph = graph_timed(call, 20, world, stream) if size <= graph_max else math.nan
                    g.check()
                except RuntimeTimeoutError as exc:   # both ranks get here (abort words); the rest goes on
                    msg = f"{coll:<14}{_h(size):>8}  {c.label:<20}TIMEOUT {exc}"
                    log.append(msg)
                    table.append(msg)
                    if rank == 0:
                        print(msg, flush=True)
                    sbuf = rbuf = None
                    continue
                if nccl_us is None:
                    ncall = lambda: nccl_call(nccl, ncomm, coll, sbuf, rbuf, n_in, stream, n)  # noqa: E731
                    nccl_us, _ = timed(ncall, iters, world, stream)
                    if size <= graph_max:
                        nccl_graph = graph_timed(ncall, 20, world, stream)
                f = bus_factor(coll, n)
                bw, bw_nccl = nbytes / ours / 1e3 * f, nbytes / nccl_us / 1e3 * f
                ok = "ok" if wrong == 0 else f"{wrong} WRONG; first: {first}"
                ratio = bw / bw_nccl if bw_nccl else 0.0
                log.append(f"{coll:<14}{_h(nbytes):>8}  {c.label:<20}{ours:>9.1f}{host:>9.1f}{graph:>9.1f}"
                           f"{bw:>10.2f}{nccl_us:>9.1f}{nccl_graph:>11.1f}{ratio:>7.2f}  {ok}")
                if rank == 0 and args.log:
                    print("  " + log[-1], flush=True)
                if wrong == 0:
                    rows.append((ours, f"{coll:<14}{_h(nbytes):>8}  {c.label:<20}{ours:>9.1f}{bw:>10.2f}"
                                       f"{nccl_us:>9.1f}{bw_nccl:>11.2f}{ratio:>7.2f}  {ok}"))
                else:   # a wrong result is never hidden behind a faster right one
                    table.append(log[-1])
                    if rank == 0:
                        print(table[-1], flush=True)
                # The buffers go back before the next size allocates larger ones; rebinding (not
                # `del`) because the lambdas above close over these names.
                sbuf = rbuf = None
            if rows:
                table.append(min(rows)[1])
                if rank == 0:
                    print(table[-1], flush=True)
        for g in groups.values():
            g.close()
    if rank == 0 and args.out:
        Path(args.out).write_text("\n".join(table) + "\n")
    if rank == 0 and args.log:
        Path(args.log).write_text("\n".join(log) + "\n")
    return 0


def _h(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g}{unit}"
    return f"{n}B"


if __name__ == "__main__":
    sys.exit(main())
