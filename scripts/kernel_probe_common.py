"""What the kernel A/B scripts (ab_kernels.py, probe_gemv_phases.py) share: compiled modules kept
alive across builds, and calls' times per call in CUDA-graph replays taken in turn."""
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


def graph_times(calls, comm=None, rounds=9, n=20):
    """{name: (us per call, spread)} of each call(stream) in `calls` (name -> call), each captured
    n times in a graph of its own; the graphs replay in turn, `rounds` times, the order reversed
    every other round, so that a drift of the GPU's clocks or of the links falls on every variant
    alike (timed one after another, the same build moved by 1 us between two jobs).  The time is
    the median round, the spread the range of the middle half of the rounds; under MPI, the
    slowest rank's of each."""
    s = cupy.cuda.Stream(non_blocking=True)
    graphs = {}
    for name, call in calls.items():
        call(s); s.synchronize()
        if comm: comm.Barrier()
        s.begin_capture()
        for _ in range(n):
            call(s)
        graphs[name] = s.end_capture()
        graphs[name].launch(s); s.synchronize()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    ts = {name: [] for name in graphs}
    for r in range(rounds):
        for name in (list(graphs) if r % 2 == 0 else list(reversed(graphs))):
            if comm: comm.Barrier()
            e0.record(s); graphs[name].launch(s); e1.record(s); e1.synchronize()
            ts[name].append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / n)
    out = {}
    for name, v in ts.items():
        v = sorted(v)
        t, spread = statistics.median(v), v[(3 * len(v)) // 4] - v[len(v) // 4]
        if comm:
            from mpi4py import MPI
            t, spread = comm.allreduce(t, op=MPI.MAX), comm.allreduce(spread, op=MPI.MAX)
        out[name] = (t, spread)
    return out
