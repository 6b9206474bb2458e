"""The drop-in's Python per-call path on the CPU, with the GPU stubbed out:

    PYTHONPATH=$PWD python3 scripts/bench_host_path_cpu.py [--calls 200000]
    PYTHONPATH=$PWD python3 -m runtime_cuda.benchmarks.host_path_cpu [--calls 200000]

A communicator over the 2-rank all-pairs test IR, whose gc3 backend is the
real Gc3Backend holding a real LaunchGroup (runtime_cuda/core/group.py) with one
prepared call whose launch is a real `Launch` (runtime_cuda/core/launcher.py) over
a stand-in driver, and whose stream-capture query answers "not capturing"
without CUDA.  Both stand-ins are C builtins taking the driver's arguments,
so what is timed is the Python above them, as CuPy's Cython wrappers see it.  Timed per call (the fastest of 21
loops: the one least disturbed by other work on the machine):

  repeat   a repeat of the same call through `submit` (the fast path: one
           dictionary hit, then the group's Reissue with the communicator's
           StreamOrder and tally bound in);
  held     the same repeat on a stream whose owner the drop-in knows (CuPy's current
           stream: streams.owner), so that it marks no end per call (StreamOrder.leave);
           "repeat" is on a stream passed by handle alone, marked on every call;
  counted  "repeat" with a launch whose blocks count themselves (the small-message
           kernels': StreamOrder.counted), so that the count is the mark and the call
           records no event;
  named    the same repeat through cupy.cuda.nccl's named method
           (comm.allReduce: what users call; it looks the repeat up itself);
  nccl     an out-of-place call, which the test IR does not serve, routed to NCCL, repeated
           through the named method on a stream passed by handle: NCCL orders it after the
           communicator's earlier NCCL calls itself, so it marks nothing (StreamOrder.bridge);
  nccl-ev  the same with an event recorded after every call (NCCL before 2.14, or
           GC3_ORDER_COUNT=0; the event stubbed, so what is timed is the Python around it);
  direct   the stand-in NCCL method called as a user calls cupy's NCCL: all a call costs
           in Python without the drop-in;
  full     the same call with the repeat cache emptied before each call
           (argument checks, Call, selection's cache, set-up's cache,
           Gc3Backend.run, LaunchGroup.run_ptrs);
  stub     the stand-in driver call alone, with its 10 arguments (the
           loop's own cost, and about what a bare launch adds in Python).

What this leaves out, and scripts/bench_host_time.py measures on a GPU: the
driver launch itself and cudaStreamIsCapturing (both paths make one of each).
"""
from __future__ import annotations

import argparse
import sys
import time

from runtime_cuda import PACKAGE_DIR

# The test IR lives in the checkout, beside the package: this bench runs from a source tree.
PAIRS = PACKAGE_DIR.parent / "tests" / "data" / "msccl" / "allreduce_allpairs_2r_1i.xml"


class _Nccl:
    """cupy's NCCL communicator, answering at once from a C builtin (its Cython wrapper's cost)."""
    allReduce = staticmethod(max)

    def device_id(self):
        return 0


class _Exchange:
    rank, size = 0, 2


class _Events:
    """StreamOrder's CUDA events, answering at once from C builtins (a Cython wrapper's cost,
    not the driver's): a call marks its stream's end with `record` (StreamOrder.leave)."""
    new = staticmethod(int)
    record = wait = wait_value = staticmethod(max)

    def capturing(self, stream):
        return False


class _Driver:
    """cupy_backends' driver module as Launch uses it, answering at once: `max`
    takes any number of ints and returns one, in C, like a Cython wrapper."""
    launchKernel = launchCooperativeKernel = staticmethod(max)

    class CUDADriverError(Exception):
        pass


class _Ex:
    broken = None


def stub_call(counting=None):
    """A PreparedCall with no copies around a real Launch over the stand-in driver
    (cooperative, as GC3_COOPERATIVE's default makes it); `counting`: (the stream order, its
    blocks), a launch that counts itself on that order as the small-message kernels' do."""
    from runtime_cuda.core.group import PreparedCall
    from runtime_cuda.core.launcher import Launch

    class Counting(Launch):
        __slots__ = ("counting", "captured_params_ptr")

    launch = Launch.__new__(Launch) if counting is None else Counting.__new__(Counting)
    if counting is not None:
        launch.counting, launch.captured_params_ptr = counting, 0x9000
    launch.ex, launch.fn, launch.grid, launch.block, launch.coop = _Ex(), 0x7000, 4, 512, True
    launch.params_ptr = 0x8000
    if hasattr(Launch, "bind"):
        launch.bind(_Driver)
    else:   # the Launch before its driver calls were bound (for a before/after comparison)
        launch._driver = _Driver
    call = PreparedCall.__new__(PreparedCall)
    call.launch, call.pre, call.post, call.shape, call.keep = launch, [], [], None, None
    return call


def build(n_elems: int, buf: int, stream: int, counted_buf: int = 0):
    import os

    from runtime_cuda.core import streams
    from runtime_cuda.core.group import LaunchGroup
    from runtime_cuda.nccl import communicator as cm
    from runtime_cuda.nccl.gc3_backend import Gc3Backend, _key
    from runtime_cuda.core.streams import StreamOrder

    os.environ["GC3_XML_FILES"] = str(PAIRS)
    os.environ.pop("GC3_DEBUG", None)
    # What CuPy's runtime.streamIsCapturing answers for a stream not capturing (0), from C, without CUDA.
    streams._capture_status = (0).__mul__

    order = StreamOrder(_Events())   # the communicator's, which its launch groups share (Gc3Backend.prepare)
    order._counter = 0x1000          # the word counting launches bump, as counter() leaves it on a GPU

    class Executor:
        broken = None
    Executor.order = order

    g = LaunchGroup.__new__(LaunchGroup)
    g.executor, g._prepared, g._captured, g._epoch = Executor(), {}, {}, 0
    g._prepared[g._key([buf], [buf], n_elems, "float32", "sum")] = stub_call()
    if counted_buf:
        g._prepared[g._key([counted_buf], [counted_buf], n_elems, "float32", "sum")] = stub_call((order, 4))

    be = Gc3Backend.__new__(Gc3Backend)
    from runtime_cuda.core import abi, binding, launcher, tables
    be._abi, be._binding, be._launcher, be._tables_mod = abi, binding, launcher, tables
    be.rank, be.size, be.device = 0, 2, 0
    be._groups, be._failed, be._tables = {}, {}, {}
    comm = cm.NcclCommunicator.__new__(cm.NcclCommunicator)
    comm._setup(_Nccl(), 2, 0, lambda *a: be, exchange=_Exchange(), order=order)
    cand = comm._dispatch.selector.catalog.candidates[0]
    be._groups[_key(cand)] = g
    be.check = lambda c, call: None    # the runtime's own shape check needs the tables: not per call anyway
    comm._dispatch.selector.runtime = be.check
    return comm


def per_call_us(fn, calls: int) -> float:
    loops = []
    for _ in range(21):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - t0) / calls * 1e6)
    return min(loops)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args(argv)
    from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_SUM

    buf, stream, n, cbuf = 0x2000_0000, 0x77, 256, 0x3000_0000
    comm = build(n, buf, stream, cbuf)
    a = ("allreduce", buf, buf, n, NCCL_FLOAT32, NCCL_SUM, stream)
    if comm.submit(*a) == "NCCL" or not comm._repeats:
        raise SystemExit("the stubbed communicator did not serve the call on gc3: nothing to time")
    drv = _Driver.launchCooperativeKernel
    # A second stream, known to be owned by a live object (as CuPy's current stream is).
    from runtime_cuda.core import streams

    held, keeper = stream + 1, _Ex()
    known = streams.owner
    streams.owner = lambda s: keeper if s == held else known(s)
    b = ("allreduce", buf, buf, n, NCCL_FLOAT32, NCCL_SUM, held)
    comm.submit(*b)
    comm.submit(*b)
    c = ("allreduce", cbuf, cbuf, n, NCCL_FLOAT32, NCCL_SUM, stream)
    comm.submit(*c)
    comm.submit(*c)

    # Out of place: the test IR serves only in place, so NCCL serves this, with and without relying on
    # NCCL's own launch order (a second communicator, whose order has no bridge).
    obuf = buf + 0x100_0000
    comm._dispatch.order.bridge = int   # a C builtin taking the stream: a bridge at a switch only
    event_comm = build(n, buf, stream)
    event_comm._dispatch.order.bridge = None
    for c_ in (comm, event_comm):
        for _ in range(2):
            if c_.submit("allreduce", buf, obuf, n, NCCL_FLOAT32, NCCL_SUM, stream) != "NCCL":
                raise SystemExit("the out-of-place call was not routed to NCCL: nothing to time")
    nccl_direct = _Nccl().allReduce

    def full():
        comm._repeats.clear()
        comm.submit(*a)

    def clear_only():
        comm._repeats.clear()

    rows = [("held", per_call_us(lambda: comm.submit(*b), args.calls)),
            ("repeat", per_call_us(lambda: comm.submit(*a), args.calls)),
            ("counted", per_call_us(lambda: comm.submit(*c), args.calls)),
            ("named", per_call_us(lambda: comm.allReduce(buf, buf, n, NCCL_FLOAT32, NCCL_SUM, stream), args.calls)),
            ("nccl", per_call_us(lambda: comm.allReduce(buf, obuf, n, NCCL_FLOAT32, NCCL_SUM, stream), args.calls)),
            ("nccl-ev", per_call_us(lambda: event_comm.allReduce(buf, obuf, n, NCCL_FLOAT32, NCCL_SUM, stream),
                                    args.calls)),
            ("direct", per_call_us(lambda: nccl_direct(buf, obuf, n, NCCL_FLOAT32, NCCL_SUM, stream), args.calls)),
            ("full", per_call_us(full, args.calls // 4) - per_call_us(clear_only, args.calls // 4)),
            ("stub", per_call_us(lambda: drv(0x7000, 4, 1, 1, 512, 1, 1, 0, stream, 0x8000), args.calls))]
    print(f"# Python host path per call, launch and capture query stubbed ({sys.version.split()[0]})")
    for name, us in rows:
        print(f"{name:8} {us:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
