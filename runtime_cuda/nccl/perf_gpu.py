"""The measuring half of `gc3 bench`: one process per GPU (under mpirun),
nccl-tests' method.

For each collective and size, each implementation (gc3's communicator, and
NCCL through cupy.cuda.nccl) is first *checked*: inputs are generated on the
GPU from (rank, index), outputs are pre-filled with NaN/0xFF so a missed write
shows, one call runs, and every output element is compared with the expected
value computed on the GPU from every rank's generator (#wrong, summed over
ranks).  Then `warmup` calls, and `iters` calls timed with CUDA events; the
time is averaged over ranks, as nccl-tests does.

The generated values are small integers (powers of two for prod), so every
reduction order is exact and floats are compared with gc3.dtypes' tolerances
only for avg's division.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from gc3.dtypes import TOLERANCES, dtype_info

from .call import REDUCING, Call
from .constants import DTYPE_CODES, ITEMSIZE, OP_CODES
from .perf import PLACES, Row, element_count, measure, nccl_count


@dataclass
class BenchConfig:
    collectives: Sequence[str]
    sizes: Sequence[int]
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    warmup: int = 5
    iters: int = 20
    check: bool = True
    impls: Sequence[str] = ("gc3", "nccl")


class Host:
    """Rank, size and host-side reductions: mpi4py when launched by mpirun, else one rank."""

    def __init__(self):
        try:
            from mpi4py import MPI
            self.comm = MPI.COMM_WORLD
        except ImportError:
            self.comm = None
        self.rank = self.comm.Get_rank() if self.comm else 0
        self.size = self.comm.Get_size() if self.comm else 1

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0) if self.comm else obj

    def mean(self, x: float) -> float:
        return self.comm.allreduce(x) / self.size if self.comm else x

    def total(self, x: int) -> int:
        return self.comm.allreduce(x) if self.comm else x

    def barrier(self) -> None:
        if self.comm:
            self.comm.Barrier()


def local_device(rank: int) -> int:
    import cupy
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var]) % cupy.cuda.runtime.getDeviceCount()
    return rank % cupy.cuda.runtime.getDeviceCount()


# --- data: generated on the GPU, stored in any NCCL dtype ----------------------------

def _generate(rank: int, n: int, op: str, dtype: str, nranks: int):
    """Rank `rank`'s input: n small integers (int64) that reduce exactly in `dtype`."""
    import cupy
    i = cupy.arange(n, dtype=cupy.int64)
    h = (i * 2654435761 + (rank + 1) * 40503 * 1021) % 1000003
    info = dtype_info(dtype)
    signed = info.name != "uint8"
    if op == "prod":
        v = 1 + (h % 2)
        return v * (1 - 2 * ((h >> 3) % 2)) if signed else v
    m = max(2, min(info.exact // nranks if op in ("sum", "avg") else info.exact, 2048))
    return h % (m + 1) - (m // 2 if signed else 0)


def _store(buf, offset_elems: int, values, dtype: str) -> None:
    import cupy
    n = values.size
    if dtype == "bfloat16":
        bits = values.astype(cupy.float32).view(cupy.uint32) >> 16
        buf.view(cupy.uint16)[offset_elems: offset_elems + n] = bits.astype(cupy.uint16)
    else:
        buf.view(dtype_info(dtype).np)[offset_elems: offset_elems + n] = values.astype(dtype_info(dtype).np)


def _load(buf, offset_elems: int, n: int, dtype: str):
    """Elements as float64 (floats) or int64 (integers)."""
    import cupy
    if dtype == "bfloat16":
        bits = buf.view(cupy.uint16)[offset_elems: offset_elems + n].astype(cupy.uint32) << 16
        return bits.view(cupy.float32).astype(cupy.float64)
    x = buf.view(dtype_info(dtype).np)[offset_elems: offset_elems + n]
    return x.astype(cupy.float64 if dtype_info(dtype).is_float else cupy.int64)


def _reduce_all(arrays, op: str, nranks: int):
    import cupy
    acc = arrays[0].astype(cupy.float64)
    for a in arrays[1:]:
        b = a.astype(cupy.float64)
        acc = {"sum": acc + b, "avg": acc + b, "prod": acc * b, "max": cupy.maximum(acc, b),
               "min": cupy.minimum(acc, b)}[op]
    return acc / nranks if op == "avg" else acc


def _as_stored(values, dtype: str):
    """What `values` become once written in `dtype` and read back (rounding, wrap-around)."""
    import cupy
    tmp = cupy.empty(values.size * ITEMSIZE[DTYPE_CODES[dtype]], dtype=cupy.uint8)
    if dtype_info(dtype).is_float or values.dtype.kind in "iu":
        _store(tmp, 0, values, dtype)
    else:  # avg of integers: NCCL divides and truncates
        _store(tmp, 0, cupy.trunc(values).astype(cupy.int64), dtype)
    return _load(tmp, 0, values.size, dtype)


def expected_output(coll: str, rank: int, nranks: int, count: int, op: str, dtype: str, root: int):
    """This rank's expected output (NCCL count convention), or None where unspecified."""
    import cupy
    gen = lambda r, n: _generate(r, n, op, dtype, nranks)  # noqa: E731
    if coll == "allreduce":
        out = _reduce_all([gen(r, count) for r in range(nranks)], op, nranks)
    elif coll == "allgather":
        out = cupy.concatenate([gen(r, count) for r in range(nranks)])
    elif coll == "reducescatter":
        out = _reduce_all([gen(r, count * nranks)[rank * count:(rank + 1) * count] for r in range(nranks)],
                          op, nranks)
    elif coll == "alltoall":
        out = cupy.concatenate([gen(r, count * nranks)[rank * count:(rank + 1) * count] for r in range(nranks)])
    elif coll == "broadcast":
        out = gen(root, count)
    elif coll == "reduce":
        if rank != root:
            return None
        out = _reduce_all([gen(r, count) for r in range(nranks)], op, nranks)
    else:
        raise ValueError(coll)
    return _as_stored(out, dtype)


def count_wrong(got, want, dtype: str) -> int:
    import cupy
    if not dtype_info(dtype).is_float:
        return int(cupy.count_nonzero(got != want))
    rtol, atol = TOLERANCES[dtype_info(dtype).name]
    return int(cupy.count_nonzero(~cupy.isclose(got, want, rtol=rtol, atol=atol)))


# --- one implementation on one buffer pair ---------------------------------------------

@dataclass
class Placement:
    send: int          # pointers for the call
    recv: int
    in_off: int        # where the input lives, in elements, inside `in_buf`
    in_buf: object
    out_off: int
    out_buf: object


def place(coll: str, inplace: bool, sendbuf, recvbuf, count: int, rank: int, itemsize: int) -> Placement:
    """Buffers for a call; in-place ones overlap as NCCL defines (see Call.inplace)."""
    s, r = sendbuf.data.ptr, recvbuf.data.ptr
    if not inplace:
        return Placement(s, r, 0, sendbuf, 0, recvbuf)
    if coll == "allgather":
        return Placement(r + rank * count * itemsize, r, rank * count, recvbuf, 0, recvbuf)
    if coll == "reducescatter":
        return Placement(s, s + rank * count * itemsize, 0, sendbuf, rank * count, sendbuf)
    return Placement(r, r, 0, recvbuf, 0, recvbuf)


Issue = Callable[[str, int, int, int, int, Optional[int], int, int], str]


def run_case(issue: Issue, host: Host, cfg: BenchConfig, coll: str, nbytes: int, inplace: bool,
             sendbuf, recvbuf, stream):
    """(time in us averaged over ranks, #wrong summed over ranks or None, route name)."""
    import cupy
    n, rank = host.size, host.rank
    code = DTYPE_CODES[cfg.dtype]
    es = ITEMSIZE[code]
    total = element_count(coll, nbytes, es, n)
    count = nccl_count(coll, total, n)
    op = OP_CODES[cfg.op] if coll in REDUCING else None
    p = place(coll, inplace, sendbuf, recvbuf, count, rank, es)
    in_elems = count * n if coll in ("reducescatter", "alltoall") else count
    out_elems = count * n if coll in ("allgather", "alltoall") else count

    def call():
        return issue(coll, p.send, p.recv, count, code, op, stream.ptr, cfg.root)

    wrong, route = None, ""
    with stream:
        if cfg.check:
            recvbuf.fill(0xFF)
            _store(p.in_buf, p.in_off, _generate(rank, in_elems, cfg.op, cfg.dtype, n), cfg.dtype)
            stream.synchronize()
            host.barrier()
            route = call()
            stream.synchronize()
            want = expected_output(coll, rank, n, count, cfg.op, cfg.dtype, cfg.root)
            mine = 0 if want is None else count_wrong(_load(p.out_buf, p.out_off, out_elems, cfg.dtype), want, cfg.dtype)
            wrong = host.total(mine)
        for _ in range(cfg.warmup):
            route = call()
        stream.synchronize()
        host.barrier()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(cfg.iters):
            route = call()
        end.record(stream)
        end.synchronize()
    elapsed_us = cupy.cuda.get_elapsed_time(start, end) * 1000.0 / max(cfg.iters, 1)
    return host.mean(elapsed_us), wrong, route


def run_bench(cfg: BenchConfig, host: Host, report: Callable[[Row], None]) -> List[Row]:
    import cupy

    from . import communicator
    from .fallback import NcclFallback, originals

    cupy.cuda.Device(local_device(host.rank)).use()
    uid = host.bcast(originals()["get_unique_id"]() if host.rank == 0 else None)
    impls: Dict[str, Issue] = {}
    if "gc3" in cfg.impls:
        gc3_comm = communicator.NcclCommunicator(host.size, uid, host.rank)
        impls["gc3"] = lambda *a: gc3_comm.submit(*a)
    if "nccl" in cfg.impls:
        uid2 = host.bcast(originals()["get_unique_id"]() if host.rank == 0 else None)
        ref = NcclFallback(originals()["NcclCommunicator"](host.size, uid2, host.rank))

        def nccl_issue(coll, send, recv, count, dtype, op, stream, root):
            ref.run(Call(coll, send, recv, count, dtype, op, stream, host.size, host.rank, root))
            return "NCCL"
        impls["nccl"] = nccl_issue
    biggest = (max(cfg.sizes) + 256 + 15) // 16 * 16   # whole elements of every dtype
    sendbuf = cupy.empty(biggest, dtype=cupy.uint8)
    recvbuf = cupy.empty(biggest, dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    es = ITEMSIZE[DTYPE_CODES[cfg.dtype]]
    for coll in cfg.collectives:
        for nbytes in cfg.sizes:
            total = element_count(coll, nbytes, es, host.size)
            if total == 0:
                continue
            row = Row(coll, total * es, total, cfg.dtype, cfg.op, cfg.root, host.size)
            for name, issue in impls.items():
                row.results[name] = {}
                for place_name in PLACES:
                    t, wrong, route = run_case(issue, host, cfg, coll, total * es, place_name == "ip",
                                               sendbuf, recvbuf, stream)
                    row.results[name][place_name] = measure(coll, total * es, host.size, t, wrong, route)
            rows.append(row)
            report(row)
    return rows
