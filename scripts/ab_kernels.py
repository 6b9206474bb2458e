"""Kernel A/B (dev tooling): the kernels of another revision against the working tree's, in one job,
GEMV+AR at the decode shapes and every small kernel (allreduce one-shot and two-shot, allgather and
reducescatter one-shot, on LL and LL128 lines), us per call from CUDA-graph replays of 20 calls (the
variants in turn, the median of 9 rounds, max over ranks).  Not a result by itself (both sides are gc3's): it tells whether a
kernel change pays before `gc3 bench` measures it against the user's path.

    git archive REV runtime_cuda/kernels | tar -x -C /tmp/old
    mpirun -np 4 python3 scripts/ab_kernels.py /tmp/old/runtime_cuda/kernels     (one GPU each)
    python3 scripts/ab_kernels.py /tmp/old/runtime_cuda/kernels 2                (virtual ranks)

The old side runs with this tree's host code, which must still match its kernels' parameters."""
import os, pathlib, sys
import cupy
import ml_dtypes
import numpy as np
from runtime_cuda.core import module
from runtime_cuda.fused import gemv_kernel as gk
from runtime_cuda.ranks import small_allreduce as sa
from kernel_probe_common import graph_times

NEW = module.KERNEL_DIR
OLD = pathlib.Path(sys.argv[1]).resolve()
MPI_MODE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
if MPI_MODE:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, nranks = comm.rank, comm.size
    cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
    nlocal = 1
else:
    comm, rank = None, 0
    nranks = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    nlocal = nranks
ORIG_OPTIONS = module.options

def build(d, extra, fn):
    module.KERNEL_DIR = d
    module.options = lambda *a, **k: ORIG_OPTIONS(*a, **k) + extra
    gk._module.cache_clear(); sa._module.cache_clear()
    try:
        return fn()
    finally:
        module.KERNEL_DIR = NEW
        module.options = ORIG_OPTIONS

def say(*a):
    if rank == 0: print(*a, flush=True)

def same_everywhere(arrs):
    import hashlib
    h = hashlib.sha1(b"".join(a.get().tobytes() for a in arrs)).hexdigest()
    return all(x == h for x in comm.allgather(h)) if comm else True

def all_true(v):
    return all(comm.allgather(v)) if comm else v

dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
where = f"{nranks} GPUs, one process each" if MPI_MODE else f"{nranks} virtual ranks on one GPU"
say(f"# {dev}, {where}: old = {OLD}, new = this tree; us per call in CUDA-graph replays of 20, "
    f"median of 9, max over ranks")
rng = np.random.default_rng(rank)


def mk(cls, **kw):
    return cls.ipc(comm, timeout=20, **kw) if MPI_MODE else cls.virtual(nranks, 20, **kw)


def bf16(shape, scale=1.0):
    """One array a local rank, random bfloat16 (as uint16, the way gc3 takes bfloat16 from CuPy)."""
    return [cupy.asarray((rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16).view(np.uint16))
            for _ in range(nlocal)]


def ptrs(arrays):
    return [a.data.ptr for a in arrays]


gv = {"old": build(OLD, (), lambda: mk(gk.GemvAllreduce)), "new": mk(gk.GemvAllreduce),
      "new_ct": mk(gk.GemvAllreduce)}
gv["old"].split_max_batch = 2         # the plan of the revision before tensor-core split-K
gv["new_ct"].split_max_batch = 2      # the new kernel with that plan (column tiles from 3 rows)
say("## gemv_ar bf16 (new_ct: new kernel, old plan)")
for k, n in ((8192 // nranks, 8192), (14336 // nranks, 4096), (28672 // nranks, 8192)):
    for b in (1, 4, 8):
        xs, ws = bf16((b, k)), bf16((k, n), 0.02)
        t, outs = {}, {}
        for name, g in gv.items():
            if name == "new_ct" and b <= 2:
                continue
            o = [cupy.zeros((b, n), cupy.uint16) for _ in range(nlocal)]
            call = lambda s, g=g, o=o: g.run_ptrs(ptrs(xs), ptrs(ws), ptrs(o), b, k, n, "bfloat16", s)
            build(OLD if name == "old" else NEW, (), lambda: call(cupy.cuda.Stream.null))
            cupy.cuda.Device().synchronize()
            outs[name], t[name] = o, call
        times = {name: v for name, (v, _) in graph_times(t, comm).items()}
        agree = all_true(same_everywhere(outs["new"]) and same_everywhere(outs["old"]))
        split = gv["new"]._shape(b, k, n, "bfloat16")[2]
        row = "  ".join(f"{nm} {v:6.1f}" for nm, v in times.items())
        say(f"b={b} K={k:5d} N={n:5d} split={split:3d}  {row}  old/new {times['old'] / times['new']:4.2f}  "
            f"ranks_agree={agree}")
for g in gv.values():
    g.check()

MB = 2 << 20
sg = {"old": build(OLD, (), lambda: mk(sa.SmallAllreduce, max_bytes=MB)),
      "new": mk(sa.SmallAllreduce, max_bytes=MB)}
for coll, kind in sa.KINDS:   # every kernel of the small kernels' two entries, LL and LL128
    say(f"## small {coll} {kind} bf16")
    for nbytes in (1024, 16384, 65536, 262144) + ((2 << 20,) if coll == "allreduce" else ()):
        elems = nbytes // 2
        if sa.refusal("bfloat16", "sum", elems, MB, coll, nranks):   # past what the scratch holds
            continue
        ins = [cupy.asarray(rng.integers(-8, 8, elems).astype(ml_dtypes.bfloat16).view(np.uint16))
               for _ in range(nlocal)]
        t, outs = {}, {}
        for name, g in sg.items():
            o = [cupy.zeros(elems * nranks, cupy.uint16) for _ in range(nlocal)]   # allgather's output is the largest
            call = lambda s, g=g, o=o: g.run_ptrs(ptrs(ins), ptrs(o), elems, "bfloat16", "sum", s, kind=kind, coll=coll)
            build(OLD if name == "old" else NEW, (), lambda: call(cupy.cuda.Stream.null))
            cupy.cuda.Device().synchronize()
            outs[name], t[name] = o, call
        times = {name: v for name, (v, _) in graph_times(t, comm).items()}
        same = all_true(all((outs["old"][r] == outs["new"][r]).all() for r in range(nlocal)))
        say(f"{nbytes:8d} B  " + "  ".join(f"{nm} {v:6.2f}" for nm, v in times.items()) + f"  same_bits={same}")
for g in sg.values():
    g.check()
