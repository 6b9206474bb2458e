"""Both fused operators of runtime_cuda.fused on a communicator of the drop-in, one rank per
process (`mpirun -np N`; processes may share one GPU: NcclCommunicator.from_mpi, no NCCL).
Every process draws every rank's inputs from one seed, so each checks its own result against
the float64 reference of all of them; fused and sequential paths, bf16 and fp32, a
non-default stream, poisoned outputs, each call twice.  Prints "fused_ops ok" per rank that
saw no wrong element, and exits 1 on any."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from fused_cases import count_wrong, ebag_case, gemv_case, poisoned, to_host  # noqa: E402
from runtime_cuda.fused import check, embedding_bag_alltoall, gemv_allreduce  # noqa: E402
from runtime_cuda.nccl import NcclCommunicator  # noqa: E402

world = MPI.COMM_WORLD
rank, n = world.rank, world.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
comm = NcclCommunicator.from_mpi(world)
s = cp.cuda.Stream(non_blocking=True)
wrong = []
for dtype in ("bfloat16", "float32"):
    xs, ws, want, scale = gemv_case(np.random.default_rng(7), n, 5, 96, 520, dtype)
    for path in ("fused", "sequential"):
        for rep in range(2):
            out = poisoned((5, 520), dtype)
            gemv_allreduce(xs[rank], ws[rank], comm, out=out, stream=s, path=path)
            s.synchronize()
            bad = count_wrong(to_host(out, dtype), want, scale, dtype)
            if bad:
                wrong.append(f"gemv_allreduce {dtype} {path} call {rep}: {bad} of {want.size} wrong")
    t, dim, b = 2, 40, 6
    tables, indices, offsets, expected = ebag_case(np.random.default_rng(8), n, t, 33, dim, b, dtype)
    for path in ("fused", "sequential"):
        for rep in range(2):
            out = poisoned((n, b, t * dim), dtype)
            embedding_bag_alltoall(tables[rank], indices[rank], offsets[rank], comm, out=out, stream=s, path=path)
            s.synchronize()
            bad = count_wrong(to_host(out, dtype), *expected[rank], dtype)
            if bad:
                wrong.append(f"embedding_bag_alltoall {dtype} {path} call {rep}: {bad} of {out.size} wrong")
comm.check_async_error()
check(comm)
print(f"rank {rank}: " + ("fused_ops ok" if not wrong else "WRONG: " + "; ".join(wrong)), flush=True)
world.Barrier()
sys.exit(1 if wrong else 0)
