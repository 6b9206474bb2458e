"""The NCCL replacement on real GPUs: one process per GPU (multiprocessing,
spawned), results checked against numpy.

* a program written for cupy.cuda.nccl, run unchanged on NCCL, on
  runtime_cuda.nccl, and through the GC3_NCCL=1 hook;
* groups (all-gc3, and a group that NCCL must take whole);
* fallback when the catalog has no match and when gc3's runtime cannot serve;
* the array API over several sizes (uneven included), dtypes and ops.
Skipped without 2 GPUs (tests/conftest.py).  cupy is imported only inside.
"""
import multiprocessing as mp
import os
import queue
import traceback
from pathlib import Path

import numpy as np
import pytest

from gc3.simulator.reference import reference

pytestmark = pytest.mark.multigpu
N = 2
ROOT = Path(__file__).resolve().parents[1]


# --- running a function on N ranks ------------------------------------------------

# The runtime's IPC set-up imports mpi4py; outside mpirun that is an MPI
# singleton, which Open MPI refuses to start as root unless told it may.
_SINGLETON_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _child(fn, rank, n, uid, env, args, out):
    try:
        os.environ.update(_SINGLETON_ENV)
        os.environ.update(env)
        import cupy
        cupy.cuda.Device(rank).use()
        out.put((rank, "ok", fn(rank, n, uid, *args)))
    except BaseException:  # the parent reports it with the rank
        out.put((rank, "error", traceback.format_exc()))


def run_ranks(fn, *args, env=None, timeout=240):
    from cupy.cuda import nccl
    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, N, uid, dict(env or {}), args, out)) for r in range(N)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(N):
            rank, status, value = out.get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    except queue.Empty:
        raise AssertionError(f"ranks {sorted(set(range(N)) - set(results))} did not finish in {timeout} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(N)]


@pytest.fixture(scope="module")
def irs(tmp_path_factory):
    """gc3 IRs for 2 ranks compiled from gc3/algorithms/: ring allreduce (in-place),
    ring allgather and direct alltoall (out-of-place)."""
    from gc3.compiler.pipeline import lower
    from gc3.dsl.program import run_script
    from gc3.ir.xml_io import write_xml
    folder = tmp_path_factory.mktemp("irs")
    for name in ("allreduce_ring", "allgather_ring", "alltoall_direct"):
        write_xml(lower(run_script(str(ROOT / "gc3" / "algorithms" / f"{name}.py"), [str(N)])), folder / f"{name}.xml")
    return folder


def inputs(n_elems, dtype, seed):
    return [(np.arange(n_elems) % 13 + 3 * r + seed).astype(dtype) for r in range(N)]


# --- a cupy.cuda.nccl program, written once ---------------------------------------

def cupy_program(nccl, rank, n, uid, count):
    """Only cupy.cuda.nccl's API: what an existing user program does."""
    import cupy
    comm = nccl.NcclCommunicator(n, uid, rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    x = [cupy.asarray(v) for v in inputs(count * n, np.float32, 0)][rank]
    out = {"ids": (comm.rank_id(), comm.size(), comm.device_id())}
    with stream:
        a = x[:count].copy()
        comm.allReduce(a.data.ptr, a.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        b = cupy.empty(count, dtype=cupy.float32)
        comm.allReduce(x.data.ptr, b.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_MAX, stream.ptr)
        g = cupy.empty(count * n, dtype=cupy.float32)
        comm.allGather(x.data.ptr, g.data.ptr, count, nccl.NCCL_FLOAT32, stream.ptr)
        rs = cupy.empty(count, dtype=cupy.float32)
        comm.reduceScatter(x.data.ptr, rs.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        bc = x[:count].copy()
        comm.bcast(bc.data.ptr, count, nccl.NCCL_FLOAT32, 1, stream.ptr)
        rd = cupy.zeros(count, dtype=cupy.float32)
        comm.reduce(x.data.ptr, rd.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 1, stream.ptr)
        p2p = cupy.empty(count, dtype=cupy.float32)
        nccl.groupStart()
        comm.send(x.data.ptr, count, nccl.NCCL_FLOAT32, (rank + 1) % n, stream.ptr)
        comm.recv(p2p.data.ptr, count, nccl.NCCL_FLOAT32, (rank - 1) % n, stream.ptr)
        nccl.groupEnd()
        stream.synchronize()
    out.update(allreduce=a.get(), allreduce_max=b.get(), allgather=g.get(), reducescatter=rs.get(),
               bcast=bc.get(), reduce=rd.get(), p2p=p2p.get(), served=dict(getattr(comm, "served", {})),
               kind=type(comm).__module__)
    comm.destroy()
    return out


def check_program(results, count):
    xs = inputs(count * N, np.float32, 0)
    heads = [x[:count] for x in xs]
    for rank, r in enumerate(results):
        assert r["ids"][:2] == (rank, N)
        np.testing.assert_array_equal(r["allreduce"], reference("allreduce", heads, "sum", N)[rank])
        np.testing.assert_array_equal(r["allreduce_max"], reference("allreduce", heads, "max", N)[rank])
        np.testing.assert_array_equal(r["allgather"], reference("allgather", heads, "sum", N)[rank])
        np.testing.assert_array_equal(r["reducescatter"], reference("reducescatter", xs, "sum", N)[rank])
        np.testing.assert_array_equal(r["bcast"], heads[1])
        np.testing.assert_array_equal(r["p2p"], xs[(rank - 1) % N][:count])
    np.testing.assert_array_equal(results[1]["reduce"], reference("reduce", heads, "sum", N, root=1)[1])


def program_on_module(rank, n, uid, module, count):
    import importlib
    return cupy_program(importlib.import_module(module), rank, n, uid, count)


def program_through_hook(rank, n, uid, count):
    import runtime_cuda.auto  # noqa: F401  (GC3_NCCL=1 in the environment)
    from cupy.cuda import nccl
    import runtime_cuda.nccl as gc3_nccl
    assert nccl.NcclCommunicator is gc3_nccl.NcclCommunicator
    out = cupy_program(nccl, rank, n, uid, count)
    runtime_cuda.auto.uninstall()
    assert nccl.NcclCommunicator is not gc3_nccl.NcclCommunicator
    return out


@pytest.mark.parametrize("count", [4096, 1001])
def test_cupy_program_runs_unchanged_on_gc3(irs, count):
    env = {"GC3_XML_FILES": str(irs)}
    nccl_results = run_ranks(program_on_module, "cupy.cuda.nccl", count, env=env)
    check_program(nccl_results, count)
    gc3_results = run_ranks(program_on_module, "runtime_cuda.nccl", count, env=env)
    check_program(gc3_results, count)
    for r in gc3_results:
        assert r["kind"] == "runtime_cuda.nccl.communicator"
        # The in-place allreduce and the allgather have gc3 IRs; max, reduce, bcast ... go to NCCL.
        assert r["served"].get("allreduce_ring.xml") == 1 and r["served"].get("allgather_ring.xml") == 1, r["served"]
        assert r["served"]["NCCL"] >= 5


def test_hook_swaps_cupy_nccl(irs):
    results = run_ranks(program_through_hook, 2048, env={"GC3_NCCL": "1", "GC3_XML_FILES": str(irs)})
    check_program(results, 2048)
    assert all(r["served"].get("allreduce_ring.xml") == 1 for r in results)


# --- groups and fallback ----------------------------------------------------------

def grouped(rank, n, uid, count):
    import cupy
    from runtime_cuda import nccl
    comm = nccl.NcclCommunicator(n, uid, rank)
    xs = [cupy.asarray(v) for v in inputs(count, np.float32, 5)]
    a, b = xs[rank].copy(), (xs[rank] * 2).copy()
    s = cupy.cuda.Stream.null.ptr
    nccl.groupStart()
    comm.allReduce(a.data.ptr, a.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
    comm.allReduce(b.data.ptr, b.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
    nccl.groupEnd()
    all_gc3 = dict(comm.served)
    comm.served.clear()
    c = xs[rank].copy()
    got = cupy.empty(count, dtype=cupy.float32)
    nccl.groupStart()
    comm.allReduce(c.data.ptr, c.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
    comm.send(c.data.ptr, count, nccl.NCCL_FLOAT32, 1 - rank, s)
    comm.recv(got.data.ptr, count, nccl.NCCL_FLOAT32, 1 - rank, s)
    nccl.groupEnd()
    cupy.cuda.Stream.null.synchronize()
    return dict(a=a.get(), b=b.get(), c=c.get(), all_gc3=all_gc3, mixed=dict(comm.served))


def test_groups(irs):
    count = 3000
    results = run_ranks(grouped, count, env={"GC3_XML_FILES": str(irs)})
    xs = inputs(count, np.float32, 5)
    want = xs[0] + xs[1]
    for r in results:
        np.testing.assert_array_equal(r["a"], want)
        np.testing.assert_array_equal(r["b"], 2 * want)
        np.testing.assert_array_equal(r["c"], want)
        assert r["all_gc3"] == {"allreduce_ring.xml": 2}
        assert r["mixed"] == {"NCCL": 3}


def unavailable_runtime(rank, n, uid, count):
    import cupy
    from runtime_cuda.nccl import backend, communicator
    communicator.make_backend = backend.unavailable_backend("test: runtime switched off")
    comm = communicator.NcclCommunicator(n, uid, rank)
    x = cupy.asarray(inputs(count, np.float32, 1)[rank])
    y = comm.all_reduce(x, out=x)
    cupy.cuda.Stream.null.synchronize()
    return dict(y=y.get(), served=dict(comm.served))


def test_fallback_when_runtime_cannot_serve(irs):
    count = 777
    results = run_ranks(unavailable_runtime, count, env={"GC3_XML_FILES": str(irs)})
    xs = inputs(count, np.float32, 1)
    for r in results:
        np.testing.assert_array_equal(r["y"], xs[0] + xs[1])
        assert r["served"] == {"NCCL": 1}


def bad_catalog(rank, n, uid, good, bad, count):
    import io
    import sys
    import cupy
    from runtime_cuda import nccl
    err, sys.stderr = sys.stderr, io.StringIO()
    try:
        comm = nccl.NcclCommunicator(n, uid, rank)
        x = cupy.asarray(inputs(count, np.float32, 2)[rank])
        y = comm.all_reduce(x, out=x.copy())
        z = comm.all_reduce(x, out=x.copy(), op="min")
        cupy.cuda.Stream.null.synchronize()
        log = sys.stderr.getvalue()
    finally:
        sys.stderr = err
    return dict(y=y.get(), z=z.get(), served=dict(comm.served), log=log)


def test_malformed_xml_warns_once_and_falls_back(irs, tmp_path):
    bad = tmp_path / "broken.xml"
    bad.write_text("<algo name='x'")
    count = 1000
    results = run_ranks(bad_catalog, None, None, count,
                        env={"GC3_XML_FILES": f"{bad}:{tmp_path / 'missing.xml'}", "GC3_DEBUG": "INFO"})
    xs = inputs(count, np.float32, 2)
    for r in results:
        np.testing.assert_array_equal(r["y"], xs[0] + xs[1])
        np.testing.assert_array_equal(r["z"], np.minimum(xs[0], xs[1]))
        warns = [l for l in r["log"].splitlines() if " WARNING " in l]
        assert len(warns) == 2 and "broken.xml" in warns[0] and "missing.xml" in warns[1], r["log"]
        assert "no gc3 algorithm loaded" in r["log"]
        assert r["served"] == {"NCCL": 2}


# --- the array API ------------------------------------------------------------------

def array_api(rank, n, uid, cases):
    import cupy
    from runtime_cuda import nccl
    comm = nccl.NcclCommunicator(n, uid, rank)
    out = []
    for coll, n_elems, dtype, op in cases:
        x = cupy.asarray(inputs(n_elems, dtype, 7)[rank])
        if coll == "allreduce":
            y = comm.all_reduce(x, op=op)
        elif coll == "allgather":
            y = comm.all_gather(x)
        elif coll == "reducescatter":
            y = comm.reduce_scatter(x, op=op)
        elif coll == "alltoall":
            y = comm.all_to_all(x)
        elif coll == "broadcast":
            y = comm.broadcast(x.copy(), root=1)
        else:
            y = comm.reduce(x, root=0, op=op)
        cupy.cuda.Stream.null.synchronize()
        out.append(y.get().ravel())
    return dict(out=out, served=dict(comm.served))


CASES = [(c, n, d, o) for c in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
         for n, d, o in ((4096, "float32", "sum"), (1002, "float16", "max"), (98, "int32", "sum"))]


def test_array_api(irs):
    results = run_ranks(array_api, CASES, env={"GC3_XML_FILES": str(irs)})
    for i, (coll, n_elems, dtype, op) in enumerate(CASES):
        xs = inputs(n_elems, dtype, 7)
        root = 1 if coll == "broadcast" else 0
        want = reference(coll, xs, op, N, root=root)
        for rank, r in enumerate(results):
            if want[rank] is not None:
                np.testing.assert_array_equal(r["out"][i], want[rank], err_msg=f"{coll} {n_elems} {dtype} {op} rank {rank}")
    assert all(sum(v for k, v in r["served"].items() if k != "NCCL") > 0 for r in results), results[0]["served"]


def temporary_current_streams(rank, n, uid, count, rounds):
    """Each round on a new CuPy stream made current (`with stream:`), dropped right after
    its calls: the communicator holds the last one until the next round's call marks its
    end.  In-place allreduces chain through one buffer, so a hand-over that did not wait
    would read a half-reduced buffer."""
    import gc

    import cupy
    from runtime_cuda.nccl import NcclCommunicator
    from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_SUM
    comm = NcclCommunicator(n, uid, rank)
    x = cupy.asarray(inputs(count, np.float32, 0)[rank])
    cupy.cuda.Device().synchronize()    # x is written on the null stream; the rounds use their own
    prev = None
    for _ in range(rounds):
        s = cupy.cuda.Stream(non_blocking=True)
        if prev is not None:
            s.wait_event(prev)          # the user orders the data; gc3 orders its own scratch
        with s:
            comm.allReduce(x.data.ptr, x.data.ptr, count, NCCL_FLOAT32, NCCL_SUM, s.ptr)
            comm.allReduce(x.data.ptr, x.data.ptr, count, NCCL_FLOAT32, NCCL_SUM, s.ptr)   # a repeat
            prev = s.record()
        del s
        gc.collect()
    prev.synchronize()
    out = (x.get(), dict(comm.served))
    comm.destroy()
    return out


def test_streams_dropped_between_calls_are_ordered_and_released(irs):
    count, rounds = 4096, 6
    results = run_ranks(temporary_current_streams, count, rounds, env={"GC3_XML_FILES": str(irs)})
    xs = inputs(count, np.float32, 0)
    want = xs[0] + xs[1]
    for _ in range(2 * rounds - 1):
        want = want * N
    for got, served in results:
        np.testing.assert_array_equal(got, want)
        assert served.get("allreduce_ring.xml") == 2 * rounds, served


def nccl_and_gc3_on_dropped_streams(rank, n, uid, count, rounds):
    """Each call on a new stream passed by handle (no owner the drop-in could hold), destroyed
    right after the next one is made, alternating NCCL (out of place) and gc3 (in place), each reading what the
    one before wrote, NCCL's held back by a busy kernel.  NCCL orders its own calls; a gc3
    call after an NCCL call waits through StreamOrder.bridge, which this counts."""
    import cupy
    from runtime_cuda.fused import gemm_signal
    from runtime_cuda.nccl import NcclCommunicator
    from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_SUM
    comm = NcclCommunicator(n, uid, rank)
    order = comm._dispatch.order
    bridges, bridge = [0], order.bridge
    if bridge is not None:
        def counting(stream):
            bridges[0] += 1
            bridge(stream)
        order.bridge = counting
    x = cupy.asarray(inputs(count, np.float32, 0)[rank])
    y = cupy.zeros_like(x)
    cupy.cuda.Device().synchronize()
    ptrs = (x.data.ptr, y.data.ptr)
    prev, handles = None, set()
    for i in range(3 * rounds):
        # The previous stream is destroyed only once this one exists: a stream destroyed first
        # may hand its handle to the next one, which the order then takes for the same stream.
        s = cupy.cuda.Stream(non_blocking=True)
        handles.add(s.ptr)
        if i % 3 != 1:                  # NCCL's calls start late: a gc3 call that did not wait would not
            gemm_signal.spin(s.ptr, 1e-3)
        src, dst = ptrs if i % 3 == 0 else (ptrs[1], ptrs[1]) if i % 3 == 1 else ptrs[::-1]
        comm.allReduce(src, dst, count, NCCL_FLOAT32, NCCL_SUM, s.ptr)
        del prev
        prev = s
    del prev
    assert len(handles) >= 2
    cupy.cuda.Device().synchronize()
    out = (x.get(), dict(comm.served), bridges[0], bridge is not None)
    comm.destroy()
    return out


@pytest.mark.parametrize("fault", [None, "nccl-bridge"])
def test_gc3_calls_wait_for_nccl_calls_on_dropped_streams(irs, fault):
    """Out of place to NCCL, in place to gc3 (the IRs hold only an in-place allreduce): the
    chain is x -> y (NCCL), y -> y (gc3), y -> x (NCCL) a round, each a sum over the ranks.
    With GC3_FAULT=nccl-bridge the gc3 call does not wait for the NCCL call before it, which a
    busy kernel holds back, so it must read y too early: the check has to fail then."""
    count, rounds = 4096, 4
    env = {"GC3_XML_FILES": str(irs)}
    if fault:
        env["GC3_FAULT"] = fault
    results = run_ranks(nccl_and_gc3_on_dropped_streams, count, rounds, env=env)
    xs = inputs(count, np.float32, 0)
    want = xs[0] + xs[1]
    for _ in range(3 * rounds - 1):
        want = want * N
    for got, served, bridges, ordered in results:
        assert served.get("allreduce_ring.xml") == rounds and served.get("NCCL") == 2 * rounds, served
        if not ordered:   # an NCCL older than 2.14 or GC3_ORDER_COUNT=0: event marks, no bridge
            np.testing.assert_array_equal(got, want)
            continue
        # The first gc3 call's set-up exchange (NCCL on the set-up stream, synchronized) may order it instead.
        assert rounds - 1 <= bridges <= rounds
        if fault:
            assert not np.array_equal(got, want), "the gc3 calls read NCCL's output too early, yet all is right"
        else:
            np.testing.assert_array_equal(got, want)
