"""runtime_cuda.fused.allreduce_epilogue on a communicator of the drop-in, one rank per process
(`mpirun -np N`; processes may share one GPU: NcclCommunicator.from_mpi, no NCCL).  Every
process draws every rank's inputs from one seed (integer-valued, exact in every float type) and
checks its own result bit for bit against the float64 reference: fused (the small kernels'
epilogue build, and above their limit the allreduce then the epilogue pass) and sequential paths,
fp32 and bf16, each call twice into poisoned outputs on a non-default stream.
Prints "epilogue_ops ok" per rank that saw no wrong element, and exits 1 on any."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from epilogue_cases import case, wrong  # noqa: E402
from fused_cases import poisoned, to_host  # noqa: E402
from runtime_cuda.fused import allreduce_epilogue, check  # noqa: E402
from runtime_cuda.nccl import NcclCommunicator  # noqa: E402

world = MPI.COMM_WORLD
rank, n = world.rank, world.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
comm = NcclCommunicator.from_mpi(world)
s = cp.cuda.Stream(non_blocking=True)
bad_calls = []
for dtype in ("float32", "bfloat16"):
    for variant, shape in enumerate(((9, 17), (129, 131), (1031, 1030))):     # the last above 2 MiB
        xs, scale, bias, res, want, skipped, _ = case(np.random.default_rng([7, variant]), n, shape, dtype, "all")
        assert wrong(skipped[rank], want[rank])
        for path in ("fused", "sequential"):
            for rep in range(2):
                out = poisoned(shape, dtype)
                allreduce_epilogue(xs[rank], comm, scale=scale, bias=bias[rank], residual=res[rank], out=out,
                                   stream=s, path=path)
                s.synchronize()
                bad = wrong(to_host(out, dtype), want[rank])
                if bad:
                    bad_calls.append(f"{dtype} {shape} {path} call {rep}: {bad} of {out.size} wrong")
comm.check_async_error()
check(comm)
print(f"rank {rank}: " + ("epilogue_ops ok" if not bad_calls else "WRONG: " + "; ".join(bad_calls)), flush=True)
world.Barrier()
sys.exit(1 if bad_calls else 0)
