"""The program that showed the stream-reset bug, reduced: a stream selected with `s.use()`, the
first gc3 call sets up its launch group, then uploads and elementwise work
on CuPy's current stream around in-place allreduces on `s`.  Before the fix
the set-up reset the current stream to the legacy one, and the uploads raced
the collectives.  Runs under `mpirun -np N` with N processes on one GPU or
one GPU each (NcclCommunicator.from_mpi: no NCCL needed).  Prints, per rank,
whether the current stream was kept and what came out wrong."""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from runtime_cuda.nccl import NCCL_FLOAT32, NCCL_SUM, NcclCommunicator  # noqa: E402

comm = MPI.COMM_WORLD
rank, n = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
c = NcclCommunicator.from_mpi(comm)
s = cp.cuda.Stream(non_blocking=True)
s.use()
a = cp.ones(1, cp.float32)
before = cp.cuda.get_current_stream().ptr
c.allReduce(a.data.ptr, a.data.ptr, 1, NCCL_FLOAT32, NCCL_SUM, s.ptr)      # gc3 sets up its launch group
after = cp.cuda.get_current_stream().ptr
s.synchronize()
wrong = []
N = 1 << 24
for rep in range(3):                                          # upload (current stream), then allreduce on s
    x = cp.asarray(np.full(N, rank + 1, np.float32))
    c.allReduce(x.data.ptr, x.data.ptr, N, NCCL_FLOAT32, NCCL_SUM, s.ptr)
    s.synchronize()
    bad = int((x != n * (n + 1) / 2).sum())
    if bad:
        wrong.append(f"upload+allreduce rep {rep}: {bad} of {N} wrong")
g = cp.full(262144, rank + 1, cp.float32)                     # allreduce on s, then `g *= 1/n` (current stream)
s.synchronize()
comm.Barrier()
for it in range(20):
    c.allReduce(g.data.ptr, g.data.ptr, g.size, NCCL_FLOAT32, NCCL_SUM, s.ptr)
    g *= 1.0 / n
s.synchronize()
if not bool(cp.allclose(g, (n + 1) / 2)):
    wrong.append(f"20-step allreduce+scale loop: g[0]={float(g[0])}, expected {(n + 1) / 2}")
res = comm.gather((before, after, s.ptr, wrong, dict(c.served)), root=0)
c.destroy()
if rank == 0:
    for r, (b, a_, sp, w, sv) in enumerate(res):
        print(f"rank {r}: current stream before first call={b:#x} after={a_:#x} "
              f"({'RESET' if a_ != sp else 'kept'}); served {sv}; wrong: {w or 'none'}", flush=True)
    sys.exit(1 if any(w for *_, w, _ in res) or any(a_ != sp for _, a_, sp, _, _ in res) else 0)
