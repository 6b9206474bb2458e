"""A communicator made under `mpirun -np N` with GC3_AUTOTUNE=1 in the environment
(processes may share one GPU: NcclCommunicator.from_mpi), then one in-place float32
allreduce of argv[1] bytes, checked exactly.  Prints, on rank 0,
`MACHINE origin=<origin> path=<catalog> route=<what served the call> wrong=<count>`."""
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
    print(f"MACHINE origin={machine.origin.replace(' ', '_')} path={machine.path} "
          f"route={routes[0] if len(set(routes)) == 1 else routes} wrong={wrong}", flush=True)
    sys.exit(1 if wrong or len(set(routes)) != 1 else 0)
