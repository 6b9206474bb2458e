"""Where a GEMV+AR call's time goes, and kernel build variants against the shipped one (dev
tooling): per decode shape, us per call in CUDA-graph replays of 20 for each variant (NAME/slices a
tile; the variants' graphs replayed in turn, the median of 9 rounds and ± the range of their middle
half, max over ranks), then, from a build with -DGC3_GV_PHASES, the latest replay's phase ends on rank
0 (global timer, us after the first block left its wait for the kernel ahead): slices done
(median and last block), the tile's slices seen, shares put, the ranks' sums, the exit.  Not a
result by itself (every side is gc3's): it says what a kernel change should target and whether it
pays before `gc3 bench --fused` measures it against the user's path.

    mpirun -np 4 python3 scripts/probe_gemv_phases.py [VARIANT ...]     (one GPU each)
    python3 scripts/probe_gemv_phases.py --virtual 2 [VARIANT ...]      (virtual ranks, one GPU)

A VARIANT is NAME=ITEM[,ITEM...], each ITEM a kernel build option (-DMACRO=V), rows:R (the host's
split-K plan with at least R rows a tensor-core slice) or dir:PATH (the kernels of another tree, e.g.
`git archive REV runtime_cuda/kernels | tar -x -C /tmp/old`, with this tree's host code)."""
import pathlib, sys
import cupy
import ml_dtypes
import numpy as np
from runtime_cuda.core import module
from runtime_cuda.fused import gemv_kernel as gk
from kernel_probe_common import graph_times

args = sys.argv[1:]
VIRTUAL = 0
if args[:1] == ["--virtual"]:
    VIRTUAL, args = int(args[1]), args[2:]
if VIRTUAL:
    comm, rank, nranks, nlocal = None, 0, VIRTUAL, VIRTUAL
else:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, nranks, nlocal = comm.rank, comm.size, 1
    cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()

VARIANTS = [("base", (), {})]
for a in args:
    name, spec = a.split("=", 1)
    items = spec.split(",")
    host = dict(i.split(":", 1) for i in items if ":" in i)
    VARIANTS.append((name, tuple(i for i in items if ":" not in i), host))

ORIG_OPTIONS, ORIG_ROWS, ORIG_DIR = module.options, gk.SPLIT_MIN_ROWS, module.KERNEL_DIR


def built(extra, host, fn):
    """fn() with kernels compiled with `extra` options and the host's plan as `host` says."""
    module.options = lambda *a, **k: ORIG_OPTIONS(*a, **k) + tuple(extra)
    gk.SPLIT_MIN_ROWS = int(host.get("rows", ORIG_ROWS))
    module.KERNEL_DIR = pathlib.Path(host.get("dir", ORIG_DIR)).resolve()
    gk._module.cache_clear()
    try:
        return fn()
    finally:
        module.options, gk.SPLIT_MIN_ROWS, module.KERNEL_DIR = ORIG_OPTIONS, ORIG_ROWS, ORIG_DIR


def worst(v, op=max):
    return comm.allreduce(v, op=MPI.MAX if op is max else MPI.MIN) if comm else v


def say(*a):
    if rank == 0: print(*a, flush=True)


def mk():
    return gk.GemvAllreduce.virtual(nranks, 20) if VIRTUAL else gk.GemvAllreduce.ipc(comm, timeout=20)


dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
say(f"# {dev}, {nranks} {'virtual ranks on one GPU' if VIRTUAL else 'GPUs, one process each'}, bf16; "
    f"variants: " + "; ".join(f"{n} {' '.join(e)} {' '.join(f'{a}:{b}' for a, b in h.items())}".strip()
                           for n, e, h in VARIANTS))
rng = np.random.default_rng(rank)
SHAPES = [(b, k // nranks, n) for k, n in ((8192, 8192), (14336, 4096), (28672, 8192)) for b in (1, 4, 8)]
PHASED = [("phases", ("-DGC3_GV_PHASES",), {})]
groups = {name: built(extra, host, mk) for name, extra, host in VARIANTS + PHASED}
PH = ("start last", "slices med", "slices last", "tile seen", "summed", "put", "peers seen", "ranks' sums", "exit")
for b, k, n in SHAPES:
    xs = [cupy.asarray((rng.standard_normal((b, k))).astype(ml_dtypes.bfloat16).view(np.uint16)) for _ in range(nlocal)]
    ws = [cupy.asarray((rng.standard_normal((k, n)) * 0.02).astype(ml_dtypes.bfloat16).view(np.uint16))
          for _ in range(nlocal)]
    ref = None
    calls, mods, same = {}, {}, {}
    for (name, extra, rows) in VARIANTS + PHASED:
        g = groups[name]
        o = [cupy.zeros((b, n), cupy.uint16) for _ in range(nlocal)]
        call = lambda s, g=g, o=o: g.run_ptrs([a.data.ptr for a in xs], [a.data.ptr for a in ws],
                                              [a.data.ptr for a in o], b, k, n, "bfloat16", s)
        # The module this shape's launch came from (the compile caches are per build).
        mods[name] = built(extra, rows, lambda: (call(cupy.cuda.Stream.null), gk._module("bfloat16", cupy.cuda.Device().id))[1])
        cupy.cuda.Device().synchronize()
        same[name] = ref is None or all(bool((o[i] == ref[i]).all()) for i in range(nlocal))
        ref = ref or o
        calls[name] = call
    times = graph_times(calls, comm)
    row = []
    ends = {}
    for (name, extra, rows) in VARIANTS + PHASED:
        g, mod, (t, spread) = groups[name], mods[name], times[name]
        tw, split = g._shape(b, k, n, "bfloat16")[2:4]
        row.append(f"{name}/{split} {t:5.1f}±{spread:.1f}{'' if worst(int(same[name]), min) else ' DIFF'}")
        if name.startswith("phases"):
            st = cupy.ndarray((8 * 1024, 10), cupy.uint64, mod.get_global("gc3_gv_phases"))
            grid = min(g._most_blocks(None), -(-n // tw) * max(split, 1))
            rel = (st[:grid].get().astype(np.int64) - int(st[:grid, 1].min())) / 1e3
            ends[name] = (np.median(rel[:, 0]), [rel[:, 1].max(), np.median(rel[:, 2]), rel[:, 2].max(), rel[:, 3].max(),
                          rel[:, 7].max(), rel[:, 4].max(), rel[:, 8].max(), rel[:, 5].max(), rel[:, 6].max()])
            st[:] = 0
    say(f"b={b} K={k:5d} N={n:5d} tw={tw:4d} | " + " | ".join(row))
    for name, (entry, e) in ends.items():
        say(f"    {name}: rank 0, us after the first block's wait (entry {entry:+.1f}): "
            + ", ".join(f"{p} {v:.1f}" for p, v in zip(PH, e)))
for g in groups.values():
    g.check()
