"""Where a small call's GPU time goes, one process per GPU:

    GC3_TRACE=1 mpirun --allow-run-as-root -np 2 python3 scripts/profile_small.py [--size 1KiB]

For each 2-rank candidate of runtime_cuda.candidates.CANDIDATES named by --only, it
runs a few hundred calls, then one more, and prints that last call's
%globaltimer stamps per block (thread 0), relative to the earliest block
start of the rank: when the block started, finished its prologue, each
step's wait and data movement ended, and when it exited.  Stamps of two
GPUs are not on one clock, so compare only within a rank.  Without
GC3_TRACE=1 it prints the time per call only (as scripts/bench_runtime.py measures it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1KiB")
    ap.add_argument("--only", default="oneshot-LL-i1,direct-LL-i1")
    ap.add_argument("--colls", default="allreduce,alltoall,reducescatter,allgather")
    args = ap.parse_args()

    import cupy
    import numpy as np
    from mpi4py import MPI

    from gc3.units import parse_size
    from runtime_cuda.benchmarks.runtime_sweep import timed
    from runtime_cuda.candidates import CANDIDATES, compile_candidate
    from runtime_cuda.ranks.ipc import IpcRanks
    from runtime_cuda.core.perf import in_elems_for

    world = MPI.COMM_WORLD
    rank = world.rank
    cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    size = parse_size(args.size)
    trace = os.environ.get("GC3_TRACE", "0") not in ("", "0")
    wanted = set(args.only.split(","))
    colls = args.colls.split(",")
    for c in CANDIDATES:
        if c.label not in wanted or c.coll not in colls or not c.lo <= size <= c.hi:
            continue
        g = IpcRanks(compile_candidate(c), world, proto=c.proto)
        n_in = in_elems_for(g.prog, size, 4)
        n_out = g._shape(n_in, 4)[0].out_elems
        sbuf = cupy.ones(n_in, dtype=cupy.float32)
        rbuf = sbuf if g.prog.inplace and n_out == n_in else cupy.zeros(n_out, dtype=cupy.float32)
        call = lambda: g.run_ptrs([sbuf.data.ptr], [rbuf.data.ptr], n_in, "float32", "sum", stream)  # noqa: E731
        us, host = timed(call, 300, world, stream)
        # Host time of each layer of the call path: the public call, the
        # cached prepared call, the bare driver launch.
        key = next(iter(g._prepared))
        prepared = g._prepared[key]
        layers = {"run_ptrs": call, "prepared": lambda: prepared(stream.ptr)}
        if prepared.launch is not None:
            layers["launch"] = lambda: prepared.launch(stream.ptr)
        host_us = {}
        for name, fn in layers.items():
            stream.synchronize()
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            host_us[name] = (time.perf_counter() - t0) * 1e6 / 200
            stream.synchronize()
        if rank == 0:
            print(f"{c.coll} {c.label} {args.size}: {us:.2f} us/call, host {host:.2f} us/call"
                  f"{' (trace build)' if trace else ''}; host us by layer: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in host_us.items()), flush=True)
        if trace:
            world.Barrier()
            call()
            stream.synchronize()
            g.check()
            t = g.executor.trace().astype(np.int64)
            t0 = t[:, 0][t[:, 0] > 0].min()
            lines = [f"  rank {rank} block: start prologue | wait,step ... | end  (ns from first start)"]
            for b in range(t.shape[0]):
                row = t[b]
                stamps = [int(v - t0) if v else None for v in row]
                mid = [s for s in stamps[2:-1] if s is not None]
                lines.append(f"  r{rank} b{b:<3} {stamps[0]:>6} {stamps[1] if stamps[1] is not None else '-':>6} | "
                             + " ".join(f"{s:>6}" for s in mid) + f" | {stamps[-1]}")
            out = world.gather("\n".join(lines), root=0)
            if rank == 0:
                print("\n".join(out), flush=True)
        g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
