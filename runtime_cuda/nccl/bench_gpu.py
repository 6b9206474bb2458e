"""`gc3 bench`'s sweep on the GPUs (one process per GPU, under mpirun): the communicators
of each implementation are made here, and every case is measured by perf_gpu.run_case.

Kept apart from perf_gpu, which first-use tuning (autotune, tune_gpu) measures with: this
module makes gc3 communicators, and a communicator's creation is what starts a first-use
tune, so the two cannot sit in one module without an import circle.
"""
from __future__ import annotations

from typing import Callable, Dict, List

from runtime_cuda.core import stuck

from .constants import DTYPE_CODES, ITEMSIZE
from .perf import PLACES, Row, element_count, measure
from .perf_gpu import BenchConfig, Host, Issue, SymmetricPeer, local_device, nccl_issue, run_case, warm_up


def run_bench(cfg: BenchConfig, host: Host, report: Callable[[Row], None]) -> List[Row]:
    import cupy

    from . import communicator
    from .fallback import originals

    cupy.cuda.Device(local_device(host.rank)).use()
    uid = host.bcast(originals()["get_unique_id"]() if host.rank == 0 else None)
    impls: Dict[str, Issue] = {}
    owned: list = []     # the communicators made here, destroyed in reverse order at the end
    if "gc3" in cfg.impls:
        gc3_comm = communicator.NcclCommunicator(host.size, uid, host.rank)
        owned.append(gc3_comm)
        impls["gc3"] = lambda *a: gc3_comm.submit(*a)
    if "nccl" in cfg.impls:
        impls["nccl"] = nccl_issue(host, owned)
    biggest = (max(cfg.sizes) + 256 + 15) // 16 * 16   # whole elements of every dtype
    sendbuf = cupy.empty(biggest, dtype=cupy.uint8)
    recvbuf = cupy.empty(biggest, dtype=cupy.uint8)
    buffers = {name: (sendbuf, recvbuf) for name in impls}
    sym = None
    if "nccl-sym" in cfg.impls:
        sym = SymmetricPeer(host, biggest)
        owned.append(sym.comm)
        impls["nccl-sym"] = sym.issue
        buffers["nccl-sym"] = (sym.sendbuf, sym.recvbuf)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    warmed = set()
    es = ITEMSIZE[DTYPE_CODES[cfg.dtype]]
    for coll in cfg.collectives:
        for nbytes in cfg.sizes:
            total = element_count(coll, nbytes, es, host.size)
            if total == 0:
                continue
            row = Row(coll, total * es, total, cfg.dtype, cfg.op, cfg.root, host.size)
            for name, issue in impls.items():
                row.results[name] = {}
                if name not in warmed and cfg.warm_s > 0:
                    warmed.add(name)
                    warm_up(issue, host, cfg, coll, total * es, *buffers[name], stream)
                for place_name in PLACES:
                    what = (f"rank {host.rank}: gc3 bench: {name} {coll} {total * es} bytes "
                            f"{'in place' if place_name == 'ip' else 'out of place'} did not finish in "
                            f"{cfg.hang_s:g} s (--hang-s); the GPU work is stuck, so the run ends here")
                    graphs: Dict[str, float] = {}
                    with stuck.deadline(cfg.hang_s, what):
                        t, wrong, first, route = run_case(issue, host, cfg, coll, total * es, place_name == "ip",
                                                          *buffers[name], stream, graphs)
                    m = measure(coll, total * es, host.size, t, wrong, route)
                    m.first_wrong = first
                    m.graph100_us = graphs.get("graph100")
                    m.graph1_us = graphs.get("graph1")
                    row.results[name][place_name] = m
            rows.append(row)
            report(row)
    # Not in a `finally`: after an error on some ranks, deregistering and destroying (which
    # NCCL may do collectively) could wait forever for the others.  Every rank tears down the
    # same communicators in the same order here: left to the garbage collector at exit, the
    # ranks destroyed them in different orders and could wait on each other for ever.
    stream.synchronize()
    host.barrier()
    if sym is not None:
        sym.close()
    while owned:
        owned.pop().destroy()
    return rows
