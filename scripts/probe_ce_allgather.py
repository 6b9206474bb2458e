#!/usr/bin/env python3
"""Can copy engines beat NCCL's allgather at large sizes?  A throwaway measurement, one process
per GPU:

    mpirun --bind-to none -np 4 python3 scripts/probe_ce_allgather.py [--sizes 64M,256M,1G] [--iters 10]

Every rank opens its peers' output buffers through CUDA IPC and writes its own block into each
with cudaMemcpyAsync (a copy between two device addresses in one address space: the copy
engines, no SM), in three ways:

  ce-streams  one stream per peer, so that every peer's copy runs at once;
  ce-one      the same copies queued on one stream, one after another;
  ce-flags    ce-streams with the ordering a runtime version needs, by stream memory operations
              (cuda.bindings: cuStreamWriteValue32 / cuStreamWaitValue32 on flags that peers map
              through CUDA IPC): a receiver's stream tells each sender it has reached the call,
              a sender's copy waits for that, then tells the receiver its block landed, and the
              receiver's stream waits for every peer's word;
  nccl        NCCL's allgather (cupy.cuda.nccl) on the same buffers, for reference.

The SM-store path is what `gc3 bench` measures; this probe asks only whether the copy engines
move more than NCCL at these sizes, before any runtime code is written for it.  Each method is
timed as the slowest rank's CUDA-event time between two MPI barriers (the allgather is done
when the last sender is), median of --iters, and its output is checked against the expected
blocks after the timed loop.  busbw = (N-1)/N x output bytes / time, as nccl-tests reports it.
Only ce-flags orders receivers and senders by itself; the other two rely on the barriers, as a
runtime version could not.  If the driver refuses a memory operation on a peer's mapped word,
ce-flags says so and is left out.
"""
from __future__ import annotations

import argparse
import statistics
import sys


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


class memops:
    """cuStreamWriteValue32 / cuStreamWaitValue32 (wait until >=) through cuda.bindings; `ok`
    false, with `why`, after the driver refused one."""

    def __new__(cls):
        try:
            from cuda.bindings import driver
            if driver.cuDriverGetVersion()[0] != driver.CUresult.CUDA_SUCCESS:
                return None
        except Exception:
            return None
        self = super().__new__(cls)
        self.d, self.ok, self.why = driver, True, ""
        return self

    def _check(self, result, what):
        err = result[0] if isinstance(result, tuple) else result
        if err != self.d.CUresult.CUDA_SUCCESS and self.ok:
            self.ok, self.why = False, f"{what}: {err}"

    def write(self, stream, addr, value):
        d = self.d
        self._check(d.cuStreamWriteValue32(d.CUstream(stream), d.CUdeviceptr(addr), value, 0), "cuStreamWriteValue32")

    def wait(self, stream, addr, value):
        d = self.d
        self._check(d.cuStreamWaitValue32(d.CUstream(stream), d.CUdeviceptr(addr), value,
                                          d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")


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
    # Flag words, n "ready" then n "landed", one per peer, then n for the trial below, in memory
    # every peer maps.
    flag_mem = cupy.cuda.Memory(12 * n)
    rt.memset(flag_mem.ptr, 0, 12 * n)
    rt.deviceSynchronize()
    flag_handles = world.allgather(rt.ipcGetMemHandle(flag_mem.ptr))
    flags = [flag_mem.ptr if p == rank else rt.ipcOpenMemHandle(flag_handles[p]) for p in range(n)]
    drv = memops()
    if drv is not None:
        # A trial on words of their own, so that a refused write can never leave a timed wait
        # spinning: every rank's writes into its peers first, then (all accepted) the waits.
        for p in range(n):
            drv.write(main_stream.ptr, flags[p] + 4 * (2 * n + rank), 1)
        main_stream.synchronize()
        if world.allreduce(int(drv.ok), op=MPI.MIN):
            for p in range(n):
                drv.wait(main_stream.ptr, flags[rank] + 4 * (2 * n + p), 1)
            main_stream.synchronize()
        elif drv.ok:
            drv.ok, drv.why = False, "a peer's driver refused a write to mapped memory"
    epoch = [0]
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

        def ce_flags():
            epoch[0] += 1
            e = epoch[0]
            for p in range(n):   # to every sender: this stream has reached the call
                if p != rank:
                    drv.write(main_stream.ptr, flags[p] + 4 * rank, e)
            fork = rt.eventCreate()
            rt.eventRecord(fork, main_stream.ptr)
            rt.memcpyAsync(recv.data.ptr + rank * block, send.data.ptr, block, rt.memcpyDeviceToDevice,
                           main_stream.ptr)
            for p in range(n):
                if p == rank:
                    continue
                s = peer_streams[p]
                rt.streamWaitEvent(s.ptr, fork, 0)
                drv.wait(s.ptr, flags[rank] + 4 * p, e)            # receiver p is ready
                rt.memcpyAsync(peers[p] + rank * block, send.data.ptr, block, rt.memcpyDeviceToDevice, s.ptr)
                drv.write(s.ptr, flags[p] + 4 * (n + rank), e)     # my block landed in p's output
                done = rt.eventCreate()
                rt.eventRecord(done, s.ptr)
                rt.streamWaitEvent(main_stream.ptr, done, 0)       # send may be reused after the call
                rt.eventDestroy(done)
            for p in range(n):
                if p != rank:
                    drv.wait(main_stream.ptr, flags[rank] + 4 * (n + p), e)
            rt.eventDestroy(fork)

        def nccl_allgather():
            comm.allGather(send.data.ptr, recv.data.ptr, block // 4, nccl.NCCL_INT32, main_stream.ptr)

        methods = [("ce-streams", lambda: ce(peer_streams)), ("ce-one", lambda: ce([main_stream])),
                   ("ce-flags", ce_flags), ("nccl", nccl_allgather)]
        for name, fn in methods:
            if name == "ce-flags" and not world.allreduce(int(drv is not None and drv.ok), op=MPI.MIN):
                if rank == 0:
                    print(f"ce-flags left out: {'no cuda.bindings driver' if drv is None else drv.why}")
                continue
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
    for p in range(n):
        if p != rank:
            rt.ipcCloseMemHandle(flags[p])
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
