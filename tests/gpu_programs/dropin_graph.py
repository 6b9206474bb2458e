"""CUDA graphs through the drop-in, under `mpirun -np N` (processes may share
one GPU: NcclCommunicator.from_mpi, no NCCL).  GC3_XML_FILES names the one
allreduce program that serves the calls.

1. An allreduce captured on a non-blocking stream before any eager call (so
   the launch group is set up during the capture), replayed 30 times with new
   input contents each time, every fifth iteration an eager call instead:
   each result checked exactly (integer-valued float32).
2. A graph of 100 calls and a graph of one call, replayed: host time per call
   against eager calls back to back (as scripts/bench_host_time.py times).
Prints one GRAPH line per rank and exits 1 on any wrong result."""
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from gc3.ir.xml_io import read_xml  # noqa: E402
from runtime_cuda.nccl import NCCL_FLOAT32, NCCL_SUM, NcclCommunicator  # noqa: E402

comm = MPI.COMM_WORLD
rank, n = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
inplace = read_xml(os.environ["GC3_XML_FILES"].split(os.pathsep)[0]).inplace
c = NcclCommunicator.from_mpi(comm)
s = cp.cuda.Stream(non_blocking=True)
N = (1 << 16) + 3
x = cp.zeros(N, cp.float32)
y = x if inplace else cp.zeros(N, cp.float32)
cp.cuda.Device().synchronize()


def data(it, r):
    return np.random.default_rng(1000 * it + r).integers(-1000, 1000, N).astype(np.float32)


def call():
    c.allReduce(x.data.ptr, y.data.ptr, N, NCCL_FLOAT32, NCCL_SUM, s.ptr)


wrong = []
s.begin_capture()
call()
g1 = s.end_capture()
for it in range(30):
    x.set(data(it, rank), stream=s)
    (call if it % 5 == 4 else lambda: g1.launch(stream=s))()
    s.synchronize()
    expected = sum(data(it, r) for r in range(n))
    got = y.get()
    if not np.array_equal(got, expected):
        bad = np.flatnonzero(got != expected)
        wrong.append(f"{'eager' if it % 5 == 4 else 'replay'} {it}: {bad.size} wrong, first [{bad[0]}] "
                     f"{got[bad[0]]} != {expected[bad[0]]}")
c.check_async_error()

s.begin_capture()
for _ in range(100):
    call()
g100 = s.end_capture()


def timed(fn, reps):
    comm.Barrier()
    s.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    s.synchronize()
    return (time.perf_counter() - t0) / reps


eager_us = timed(call, 200) * 1e6
g100_us = timed(lambda: g100.launch(stream=s), 5) * 1e6 / 100
g1_us = timed(lambda: g1.launch(stream=s), 200) * 1e6
x.set(data(99, rank), stream=s)          # after 1000+ more calls, one more checked replay
g1.launch(stream=s)
s.synchronize()
if not np.array_equal(y.get(), sum(data(99, r) for r in range(n))):
    wrong.append("replay after the timing loops: wrong")
c.check_async_error()
res = comm.gather((wrong, dict(c.served), eager_us, g100_us, g1_us), root=0)
c.destroy()
if rank == 0:
    for r, (w, sv, e, h, o) in enumerate(res):
        print(f"GRAPH rank {r}: {'in' if inplace else 'out-of'}-place N={N}; served {sv}; per call: eager {e:.1f} us, "
              f"100-call graph {h:.1f} us, 1-call graph {o:.1f} us; wrong: {w or 'none'}", flush=True)
    sys.exit(1 if any(w for w, *_ in res) else 0)
