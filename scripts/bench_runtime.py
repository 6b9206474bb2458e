"""Time gc3's CUDA runtime against NCCL, one process per GPU:

    mpirun --allow-run-as-root -np 2 python3 scripts/bench_runtime.py [--max 1GiB] [--out table.txt]

For allreduce, allgather, reducescatter and alltoall at sizes from 1 KiB to
--max (x4 steps, sizes as nccl-tests counts them), it compiles a 2-rank gc3
algorithm per size class (LL below --ll-max, Simple with --instances channels
above), runs it through runtime_cuda.ipc, runs NCCL (cupy.cuda.nccl) on the
same buffers in the same processes, and prints time, busbw and the ratio of
busbw (ours / NCCL).  Results are checked once per size against numpy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (collective, algorithm script, its argv for 2 ranks)
ALGORITHMS = {
    "allreduce": {"LL": ("allreduce_allpairs.py", ["2"]), "Simple": ("allreduce_ring.py", ["2"])},
    "allgather": {"LL": ("allgather_direct.py", ["2"]), "Simple": ("allgather_direct.py", ["2"])},
    "reducescatter": {"LL": ("reducescatter_direct.py", ["2"]), "Simple": ("reducescatter_direct.py", ["2"])},
    "alltoall": {"LL": ("alltoall_direct.py", ["2"]), "Simple": ("alltoall_direct.py", ["2"])},
}


def compile_program(coll: str, proto: str, instances: int):
    from gc3.lower import lower
    from gc3.program import run_script

    script, argv = ALGORITHMS[coll][proto]
    traced = run_script(str(ROOT / "algorithms" / script), argv)
    return lower(traced, instances=instances, protocol=proto)


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


def timed(fn, iters, mpi_comm, stream):
    import cupy

    for _ in range(3):
        fn()
    stream.synchronize()
    mpi_comm.Barrier()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        fn()
    stop.record(stream)
    stop.synchronize()
    us = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / iters
    return mpi_comm.allreduce(us, op=__import__("mpi4py").MPI.MAX)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", default="1GiB")
    ap.add_argument("--ll-max", default="256KiB", help="largest size run with the LL algorithm")
    ap.add_argument("--instances", type=int, default=32, help="channels of the Simple algorithms")
    ap.add_argument("--ll-instances", type=int, default=4, help="channels of the LL algorithms")
    ap.add_argument("--min", default="1KiB")
    ap.add_argument("--colls", default="allreduce,allgather,reducescatter,alltoall")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI

    from runtime_cuda.checking import run_checked
    from runtime_cuda.ipc import IpcRanks
    from runtime_cuda.perf import bus_factor, in_elems_for, nbytes_of, parse_size

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
    ll_max = parse_size(args.ll_max)
    lines = [f"{'coll':<14}{'size':>10}{'proto':>8}{'gc3 us':>11}{'gc3 busbw':>11}{'nccl us':>11}"
             f"{'nccl busbw':>12}{'ratio':>8}  check"]
    if rank == 0:
        print(lines[0], flush=True)
    for coll in args.colls.split(","):
        groups = {}
        for proto in ("LL", "Simple"):
            prog = compile_program(coll, proto, args.ll_instances if proto == "LL" else args.instances)
            groups[proto] = IpcRanks(prog, world, proto=proto)
        for size in sizes:
            proto = "LL" if size <= ll_max else "Simple"
            g = groups[proto]
            n_in = in_elems_for(g.prog, size, 4)
            nbytes = nbytes_of(g.prog, n_in, 4)
            res = run_checked(g, n_in, "float32", "sum", inplace=g.prog.inplace)
            wrong = world.allreduce(res.wrong)
            n_out = g._shape(n_in, 4)[0].out_elems
            sbuf = cupy.ones(n_in, dtype=cupy.float32)
            # In-place schedules (the allreduces) are timed in place, NCCL too.
            rbuf = sbuf if g.prog.inplace and n_out == n_in else cupy.zeros(n_out, dtype=cupy.float32)
            iters = 200 if size <= (1 << 20) else 40 if size <= (64 << 20) else 8
            ours = timed(lambda: g.run_ptrs([sbuf.data.ptr], [rbuf.data.ptr], n_in, "float32", "sum", stream),
                         iters, world, stream)
            g.check()
            theirs = timed(lambda: nccl_call(nccl, ncomm, coll, sbuf, rbuf, n_in, stream, n), iters, world, stream)
            f = bus_factor(coll, n)
            bw_ours, bw_nccl = nbytes / ours / 1e3 * f, nbytes / theirs / 1e3 * f
            line = (f"{coll:<14}{_h(nbytes):>10}{proto:>8}{ours:>11.1f}{bw_ours:>11.2f}{theirs:>11.1f}"
                    f"{bw_nccl:>12.2f}{bw_ours / bw_nccl if bw_nccl else 0:>8.2f}  "
                    f"{'ok' if wrong == 0 else f'{wrong} WRONG'}")
            lines.append(line)
            if rank == 0:
                print(line, flush=True)
            del sbuf, rbuf
        for g in groups.values():
            g.close()
    if rank == 0 and args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def _h(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g}{unit}"
    return f"{n}B"


if __name__ == "__main__":
    sys.exit(main())
