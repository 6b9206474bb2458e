"""Which algorithm the drop-in serves an in-place float32 allreduce of
argv[1] bytes with, under `mpirun -np N` (processes may share one GPU:
NcclCommunicator.from_mpi) and the catalog in GC3_CONFIG; the result is
checked exactly.  Prints `SERVED <name> wrong=<count>` on rank 0, after
`MACHINE origin=<origin> path=<catalog>`: the default the communicator chose by its
GPUs' fingerprint (runtime_cuda.nccl.machine; `MACHINE none` under GC3_CONFIG)."""
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
N = int(sys.argv[1]) // 4
s = cp.cuda.Stream(non_blocking=True)
x = cp.asarray(np.arange(N) % 97 + rank, dtype=cp.float32)
cp.cuda.Device().synchronize()
route = c.submit("allreduce", x.data.ptr, x.data.ptr, N, NCCL_FLOAT32, NCCL_SUM, s.ptr)
s.synchronize()
want = sum(np.arange(N) % 97 + r for r in range(n)).astype(np.float32)
wrong = comm.allreduce(int((x.get() != want).sum()))
routes = comm.gather(route, root=0)
machine = c.machine
c.destroy()
if rank == 0:
    print("MACHINE none" if machine is None else
          f"MACHINE origin={machine.origin.replace(' ', '_')} path={machine.path}", flush=True)
    print(f"SERVED {routes[0] if len(set(routes)) == 1 else routes} wrong={wrong}", flush=True)
    sys.exit(1 if wrong or len(set(routes)) != 1 else 0)
