"""What the kernel A/B scripts (ab_kernels.py, probe_gemv_phases.py) share: compiled modules kept
alive across builds, and a call's time per call in CUDA-graph replays."""
import statistics

import cupy

# Every module compiled here stays loaded: the groups launch by raw kernel handle, and the
# compile caches are cleared between builds.
_Raw, KEEP = cupy.RawModule, []


def _keep(*a, **k):
    m = _Raw(*a, **k)
    KEEP.append(m)
    return m


cupy.RawModule = _keep


def graph_time(call, comm=None, reps=9, n=20):
    """us per call of call(stream) captured n times in one graph, the median of `reps` replays
    (the slowest rank's, under MPI)."""
    s = cupy.cuda.Stream(non_blocking=True)
    call(s); s.synchronize()
    if comm: comm.Barrier()
    s.begin_capture()
    for _ in range(n):
        call(s)
    g = s.end_capture()
    g.launch(s); s.synchronize()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    ts = []
    for _ in range(reps):
        if comm: comm.Barrier()
        e0.record(s); g.launch(s); e1.record(s); e1.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / n)
    t = statistics.median(ts)
    if comm:
        from mpi4py import MPI
        t = comm.allreduce(t, op=MPI.MAX)
    return t
