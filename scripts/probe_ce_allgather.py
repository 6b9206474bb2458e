#!/usr/bin/env python3
"""Can copy engines beat NCCL's allgather at large sizes?  A throwaway measurement, one process
per GPU:

    mpirun --bind-to none -np 4 python3 scripts/probe_ce_allgather.py [--sizes 64M,256M,1G] [--iters 10]

Every rank opens its peers' output buffers through CUDA IPC and writes its own block into each
with cudaMemcpyAsync (a copy between two device addresses in one address space: the copy
engines, no SM), in three ways:

  ce-streams  one stream per peer, so that every peer's copy runs at once;
  ce-one      the same copies queued on one stream, one after another;
  nccl        NCCL's allgather (cupy.cuda.nccl) on the same buffers, for reference.

The SM-store path is what `gc3 bench` measures; this probe asks only whether the copy engines
move more than NCCL at these sizes, before any runtime code is written for it.  Each method is
timed as the slowest rank's CUDA-event time between two MPI barriers (the allgather is done
when the last sender is), median of --iters, and its output is checked against the expected
blocks after the timed loop.  busbw = (N-1)/N x output bytes / time, as nccl-tests reports it.
Nothing synchronizes receivers with senders here beyond the barriers: a runtime version would
need a flag per peer (stream memory operations), whose cost is not in these numbers.
"""
from __future__ import annotations

import argparse
import statistics
import sys


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64M,256M,1G", help="output bytes per rank (all blocks), comma-separated")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)

    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    local = rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(local).use()
    rt = cupy.cuda.runtime
    uid = world.bcast(nccl.get_unique_id() if rank == 0 else None)
    comm = nccl.NcclCommunicator(n, uid, rank)
    main_stream = cupy.cuda.Stream(non_blocking=True)
    peer_streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
    rows = []
    for total in (parse_size(s) for s in args.sizes.split(",")):
        block = total // n // 16 * 16
        send = cupy.full(block // 4, rank + 1, dtype=cupy.int32)
        # Its own cudaMalloc: an IPC handle names a whole allocation, and a pool's block may sit
        # at an offset inside one.
        mem = cupy.cuda.Memory(block * n)
        recv = cupy.ndarray((block * n // 4,), cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
        handles = world.allgather(rt.ipcGetMemHandle(recv.data.ptr))
        peers = [recv.data.ptr if p == rank else rt.ipcOpenMemHandle(handles[p]) for p in range(n)]
        rt.deviceSynchronize()

        def ce(streams):
            fork = rt.eventCreate()
            rt.eventRecord(fork, main_stream.ptr)
            for p in range(n):
                s = streams[p % len(streams)]
                rt.streamWaitEvent(s.ptr, fork, 0)
                rt.memcpyAsync(peers[p] + rank * block, send.data.ptr, block, rt.memcpyDeviceToDevice, s.ptr)
            for s in streams:
                done = rt.eventCreate()
                rt.eventRecord(done, s.ptr)
                rt.streamWaitEvent(main_stream.ptr, done, 0)
                rt.eventDestroy(done)
            rt.eventDestroy(fork)

        def nccl_allgather():
            comm.allGather(send.data.ptr, recv.data.ptr, block // 4, nccl.NCCL_INT32, main_stream.ptr)

        methods = [("ce-streams", lambda: ce(peer_streams)), ("ce-one", lambda: ce([main_stream])),
                   ("nccl", nccl_allgather)]
        for name, fn in methods:
            times = []
            for it in range(args.iters + 3):
                recv.fill(0)
                rt.deviceSynchronize()
                world.Barrier()
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(main_stream)
                fn()
                end.record(main_stream)
                end.synchronize()
                world.Barrier()   # every sender done: the peers' blocks have landed
                if it >= 3:
                    times.append(world.allreduce(cupy.cuda.get_elapsed_time(start, end) / 1e3, op=MPI.MAX))
            got = recv.reshape(n, block // 4)
            wrong = int(world.allreduce(int(sum(int((got[p] != p + 1).sum()) for p in range(n)))))
            t = statistics.median(times)
            rows.append((name, total, t, (n - 1) / n * block * n / t / 1e9, wrong))
        world.Barrier()
        for p in range(n):
            if p != rank:
                rt.ipcCloseMemHandle(peers[p])
        send = recv = mem = None   # freed before the next size allocates
    if rank == 0:
        dev = rt.getDeviceProperties(local)["name"]
        dev = dev.decode() if isinstance(dev, bytes) else dev
        print(f"# allgather by copy engines vs NCCL, {n} x {dev}, median of {args.iters}, slowest rank")
        print(f"{'method':12} {'bytes':>12} {'time_us':>10} {'busbw_GB/s':>11} {'wrong':>6}")
        for name, total, t, bw, wrong in rows:
            print(f"{name:12} {total:12d} {t * 1e6:10.1f} {bw:11.1f} {wrong:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
