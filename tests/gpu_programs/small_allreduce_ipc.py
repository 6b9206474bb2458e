"""The small-message allreduce kernels under `mpirun -np N`, one rank per
process (processes may share one GPU; CUDA IPC between them).

1. runtime_cuda.ranks.small_allreduce.SmallAllreduce.ipc directly: every dtype,
   sum/max/avg, every kernel, odd counts up to the largest served, in and out
   of place, buffers offset by one element.
2. Through the drop-in (NcclCommunicator.from_mpi, a catalog naming every
   kernel): calls served by each kernel; 200 calls back to back on a
   non-blocking stream with changing inputs; a captured call replayed 20 times
   with new inputs, every fifth iteration an eager call instead; then the host
   time per call (eager, a graph of 100 calls / 100, a graph of one call) --
   time-sliced and meaningless when processes share a GPU.
Every result is compared bit for bit with an exact reference (small_cases.py).
Prints one SMALL line per rank; exits 1 on any wrong result."""
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..")))
sys.path.insert(0, HERE)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import small_cases as cases  # noqa: E402
from gc3 import limits  # noqa: E402
from runtime_cuda.core import avg  # noqa: E402
from runtime_cuda.ranks.small_allreduce import SmallAllreduce  # noqa: E402

comm = MPI.COMM_WORLD
rank, n = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
s = cp.cuda.Stream(non_blocking=True)
wrong = []


def compare(what, got, want):
    bad = cases.first_wrong(got, want)
    if bad:
        wrong.append(f"{what}: {bad}")


# --- 1. the launch group directly -------------------------------------------------------------
group = SmallAllreduce.ipc(comm, timeout=20, max_bytes=limits.SMALL_ALLREDUCE_MAX_BYTES)
for dtype in cases.DTYPES:
    info = cases.dtype_info(dtype)
    top = max(cases.counts(dtype))
    st = cases.storage(np.zeros(1, info.np)).dtype
    x, y = cp.zeros(top + 1, st), cp.zeros(top + 1, st)
    cp.cuda.Device().synchronize()      # zeroed on the legacy stream; s does not wait for it
    for op in cases.OPS:
        for kind in limits.SMALL_ALLREDUCE_KERNELS:
            for i, count in enumerate(cases.counts(dtype)):
                inplace, off = bool(i & 1), (i >> 1) & 1
                ins = cases.inputs(((cases.DTYPES.index(dtype) * 10 + cases.OPS.index(op)) * 10 + i), n, count,
                                   dtype, op)
                x[off:off + count].set(cases.storage(ins[rank]), stream=s)
                cp.cuda.runtime.memsetAsync(y.data.ptr, 0x55, y.nbytes, s.ptr)   # poisoned, on s
                src = x.data.ptr + off * st.itemsize
                dst = src if inplace else y.data.ptr + off * st.itemsize
                group.run_ptrs([src], [dst], count, dtype, "sum" if op == "avg" else op, s, kind=kind)
                if op == "avg":
                    avg.divide(dst, count, dtype, n, s.ptr)
                s.synchronize()
                group.check()
                out = x if inplace else y
                compare(f"direct {kind} {dtype} {op} count={count} {'in' if inplace else 'out-of'}-place off={off}",
                        out[off:off + count].get().view(info.np), cases.expected(ins, op, dtype))
group.close()

# --- 2. through the drop-in -------------------------------------------------------------------
path = None
if rank == 0:
    folder = tempfile.mkdtemp(prefix="gc3_small_")
    path = os.path.join(folder, "catalog.json")
    with open(path, "w") as f:
        json.dump({"version": 1, "algorithms": [{"kernel": "oneshot", "ranks": n, "max_bytes": 8192},
                                                {"kernel": "oneshot_ll128", "ranks": n, "min_bytes": 8193,
                                                 "max_bytes": "64KiB"},
                                                {"kernel": "twoshot_ll128", "ranks": n, "min_bytes": 65537,
                                                 "max_bytes": 262136},
                                                {"kernel": "twoshot", "ranks": n, "max_bytes": "2MiB"}]}, f)
os.environ["GC3_CONFIG"] = comm.bcast(path)
from runtime_cuda.nccl import (NCCL_AVG, NCCL_FLOAT32, NCCL_INT32, NCCL_MAX, NCCL_SUM,  # noqa: E402
                               NcclCommunicator)

c = NcclCommunicator.from_mpi(comm)
# Each kernel serves a call below (16396 B: oneshot_ll128; 262132 B: twoshot_ll128; 262140 B: twoshot).
TOP = 400003    # the largest call below: the drop-in sized the scratch for the 2 MiB entry
xs = cp.zeros(TOP, cp.float32)
ys = cp.zeros(TOP, cp.float32)
cp.cuda.Device().synchronize()
for k, (count, inplace, code, op, dt) in enumerate([(1, False, NCCL_SUM, "sum", NCCL_FLOAT32),
                                                     (1001, True, NCCL_AVG, "avg", NCCL_FLOAT32),
                                                     (2047, False, NCCL_MAX, "max", NCCL_INT32),
                                                     (4099, True, NCCL_SUM, "sum", NCCL_FLOAT32),
                                                     (65535, False, NCCL_AVG, "avg", NCCL_FLOAT32),
                                                     (65533, True, NCCL_MAX, "max", NCCL_INT32)]):
    dtype = "float32" if dt == NCCL_FLOAT32 else "int32"
    ins = cases.inputs(500 + k, n, count, dtype, op)
    xs[:count].set(ins[rank].view(np.float32), stream=s)
    cp.cuda.runtime.memsetAsync(ys.data.ptr, 0x55, ys.nbytes, s.ptr)
    out = xs if inplace else ys
    c.allReduce(xs.data.ptr, out.data.ptr, count, dt, code, s.ptr)
    s.synchronize()
    compare(f"drop-in {dtype} {op} count={count}", out[:count].get().view(ins[0].dtype),
            cases.expected(ins, op, dtype))
c.check_async_error()
served = dict(c.served)
if set(served) != {f"{k}_allreduce_{n}r" for k in limits.SMALL_ALLREDUCE_KERNELS}:
    wrong.append(f"served by {served}, expected every kernel and nothing else")

# 200 calls back to back, nothing waiting for the host, inputs changing on the stream, and
# grids of 1 to the most blocks taking turns (every block must agree on the call number)
SIZES, CALLS = (3001, 17, 20001, 400003), 200
srcs = [cp.asarray(cases.inputs(900 + i, n, SIZES[i % 4], "float32", "sum")[rank]) for i in range(CALLS)]
results = [cp.zeros(SIZES[i % 4], cp.float32) for i in range(CALLS)]
cp.cuda.Device().synchronize()
d2d = 3   # cudaMemcpyDeviceToDevice
for i in range(CALLS):
    count = SIZES[i % 4]
    cp.cuda.runtime.memcpyAsync(xs.data.ptr, srcs[i].data.ptr, 4 * count, d2d, s.ptr)
    c.allReduce(xs.data.ptr, ys.data.ptr, count, NCCL_FLOAT32, NCCL_SUM, s.ptr)
    cp.cuda.runtime.memcpyAsync(results[i].data.ptr, ys.data.ptr, 4 * count, d2d, s.ptr)
s.synchronize()
c.check_async_error()
for i in range(CALLS):
    compare(f"back-to-back call {i}", results[i].get(),
            cases.expected(cases.inputs(900 + i, n, SIZES[i % 4], "float32", "sum"), "sum", "float32"))

# graph capture: the epoch must advance per replay
N = 30001


def call():
    c.allReduce(xs.data.ptr, ys.data.ptr, N, NCCL_FLOAT32, NCCL_SUM, s.ptr)


s.begin_capture()
call()
g1 = s.end_capture()
for it in range(20):
    ins = cases.inputs(700 + it, n, N, "float32", "sum")
    xs[:N].set(ins[rank], stream=s)
    (call if it % 5 == 4 else lambda: g1.launch(stream=s))()
    s.synchronize()
    compare(f"{'eager' if it % 5 == 4 else 'replay'} {it}", ys[:N].get(), cases.expected(ins, "sum", "float32"))
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


eager_us = timed(call, 50) * 1e6
g100_us = timed(lambda: g100.launch(stream=s), 2) * 1e6 / 100
g1_us = timed(lambda: g1.launch(stream=s), 50) * 1e6
ins = cases.inputs(999, n, N, "float32", "sum")
xs[:N].set(ins[rank], stream=s)
g1.launch(stream=s)
s.synchronize()
compare("replay after the timing loops", ys[:N].get(), cases.expected(ins, "sum", "float32"))
c.check_async_error()
served = dict(c.served)
res = comm.gather((wrong, served, eager_us, g100_us, g1_us), root=0)
c.destroy()
if rank == 0:
    for r, (w, sv, e, h, o) in enumerate(res):
        print(f"SMALL rank {r} of {n}: served {sv}; per call ({N} float32): eager {e:.1f} us, 100-call graph "
              f"{h:.1f} us, 1-call graph {o:.1f} us; wrong: {w[:5] if w else 'none'}", flush=True)
    sys.exit(1 if any(w for w, *_ in res) else 0)
