"""Differential fuzz of gc3's NCCL drop-in (and of its runtime on virtual ranks).

    mpirun -np N gc3 fuzz --calls 20000 --seed 1           # one process per rank
    gc3 fuzz --mode virtual --ranks 4 --calls 100000       # virtual ranks, one process

(`python -m runtime_cuda fuzz ...` where gc3 is not installed.)

Every rank generates every rank's input from the seed, so it knows each
call's exact result: inputs are small integers (in float types too), chosen
per op so that no sum, product or average rounds, and results must match bit
for bit.  Where each rank has a GPU of its own, a real NCCL communicator
replays every call on its own buffers and is held to the same reference,
once gc3's calls of the batch have finished: the two communicators' kernels
must never overlap on a GPU, where each could wait for SMs that the other's
spinning blocks hold while their peers wait for it (NCCL leaves the order of
two communicators to the program; overlapping them hung a 4-GPU run);
where ranks share a GPU (NCCL refuses that) the drop-in is built with
`NcclCommunicator.from_mpi` and its non-gc3 calls go to a host-staged stand-in.

What a call draws (all from the seed; one spec per call index, the same on
every rank): the collective (allreduce, reduce, broadcast, allgather,
reducescatter, alltoall, a send/recv exchange), dtype, op, count (weighted to
0, 1, primes, powers of two +-1, up to --max-bytes), in or out of place,
fresh / reused / offset buffers (offsets of any element count, so pointers
are only element-aligned), the stream kind (the stream selected with
`s.use()`, another non-blocking stream, the legacy null stream, the
per-thread default stream), and the fuzz's own CuPy work around it: inputs
are generated and results checked by elementwise kernels on CuPy's current
stream, between calls, without synchronizing; runs of up to --batch calls go
out before the host waits once.  The fuzz also checks after every call that
the call left CuPy's current stream as it found it.

A mismatch prints the call, the rank, the first differing index and both
values, then searches for the shortest run of calls ending in the failing one
that still fails.  The exit status is 1 on any mismatch or GPU timeout, and 3 when
a batch never finishes (the watchdog, --hang-s).
`--record FILE` appends the one-line summary (measured/fuzz.txt); `--fold FILE...`
prints the lines of runs of one configuration over consecutive seeds as one.
`GC3_FAULT=...` (runtime_cuda/core/faults.py) puts known bugs back, to show the
fuzz catches them.
"""
from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import click

from gc3.dtypes import dtype_info
from runtime_cuda.nccl.call import Call
from runtime_cuda.nccl.constants import (
    DTYPE_NAMES, ITEMSIZE, NCCL_AVG, NCCL_MAX, NCCL_MIN, NCCL_PROD, NCCL_SUM, OP_NAMES)

COLLS = ("allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "sendrecv")
COLL_WEIGHTS = (30, 8, 8, 15, 15, 15, 9)
# use: CuPy's current stream (selected with s.use()); other/null/ptds: another stream, which the
# program joins with its current one around the call; indep: another stream that the program's own
# work for that call also runs on, never joined with the current one (so only the communicator
# orders it against the other calls).
STREAM_KINDS = ("use", "other", "null", "ptds", "indep")
STREAM_WEIGHTS = (55, 12, 8, 5, 20)
BUF_KINDS = ("fresh", "reused", "offset")
REDUCING = ("allreduce", "reduce", "reducescatter")
SMALL_PRIMES = [p for p in range(2, 2000) if all(p % d for d in range(2, int(p ** 0.5) + 1))]


# --- what a call is ----------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    index: int
    coll: str
    count: int          # NCCL's count (per peer for alltoall, recvcount for reducescatter)
    dtype: int
    op: Optional[int]
    root: int           # broadcast/reduce root; sendrecv: the peer distance
    inplace: bool
    buf: str
    offset: int         # elements; "offset" buffers only
    stream: str
    salt: int

    def describe(self) -> str:
        op = f" op={OP_NAMES[self.op]}" if self.op is not None else ""
        root = f" root={self.root}" if self.coll in ("reduce", "broadcast") else (
            f" shift={self.root}" if self.coll == "sendrecv" else "")
        return (f"#{self.index} {self.coll} count={self.count} {DTYPE_NAMES[self.dtype]}{op}{root} "
                f"{'in-place' if self.inplace else 'out-of-place'} buf={self.buf}+{self.offset} stream={self.stream}")


def draw_count(rng: random.Random, itemsize: int, max_bytes: int, per: int) -> int:
    """An element count weighted to the edges: 0, 1, primes, powers of two +-1,
    and a log-uniform spread that favours small sizes (large ones are slow to check)."""
    cap = max(max_bytes // (itemsize * per), 1)
    k = rng.random()
    if k < 0.04:
        return 0
    if k < 0.10:
        return 1
    if k < 0.25:
        return min(rng.choice(SMALL_PRIMES), cap)
    if k < 0.60:
        e = min(int(rng.triangular(0, cap.bit_length(), 0)), cap.bit_length() - 1)
        return max(0, min((1 << e) + rng.choice((-1, 0, 0, 1)), cap))
    e = rng.triangular(0, cap.bit_length(), 0)
    return max(1, min(int(2 ** e), cap))


def draw_spec(seed: int, index: int, nranks: int, max_bytes: int, colls=COLLS, dtypes=None, ops=None) -> Spec:
    """The call #index of a seed's sequence; `dtypes`/`ops` (NCCL codes) narrow the draw."""
    rng = random.Random(seed * 1_000_003 + index)
    weights = [w for c, w in zip(COLLS, COLL_WEIGHTS) if c in colls]
    coll = rng.choices([c for c in COLLS if c in colls], weights)[0]
    dtype = rng.choice(sorted(dtypes or DTYPE_NAMES))
    op = None
    if coll in REDUCING:
        choice = [NCCL_SUM, NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG]
        if DTYPE_NAMES[dtype].startswith(("float", "bfloat")) and nranks & (nranks - 1):
            choice.remove(NCCL_AVG)   # NCCL pre-multiplies floats by 1/n: exact only for powers of two
        choice = [o for o in choice if ops is None or o in ops] or [NCCL_SUM]
        op = rng.choice(choice)
    per = nranks if coll in ("allgather", "reducescatter", "alltoall") else 1
    count = draw_count(rng, ITEMSIZE[dtype], max_bytes, per)
    root = rng.randrange(nranks) if coll in ("reduce", "broadcast") else (
        rng.randrange(1, nranks) if coll == "sendrecv" and nranks > 1 else 0)
    inplace = coll != "sendrecv" and rng.random() < 0.5
    buf = rng.choices(BUF_KINDS, (50, 30, 20))[0]
    offset = rng.choice((1, 2, 3, 5, 8, 17, 64)) if buf == "offset" else 0
    stream = rng.choices(STREAM_KINDS, STREAM_WEIGHTS)[0]
    return Spec(index, coll, count, dtype, op, root, inplace, buf, offset, stream, rng.randrange(1 << 30))


def value_range(op: Optional[int], dtype: int, nranks: int, rank: int) -> Tuple[int, int]:
    """(lo, span) of a rank's input values: no reduction over nranks overflows
    int8 or leaves the integers a float type holds exactly."""
    signed = dtype_info(DTYPE_NAMES[dtype]).signed
    if op == NCCL_PROD:
        if rank >= 3:
            return 1, 1
        return (-1, 4) if signed else (0, 3)
    if op in (NCCL_MAX, NCCL_MIN):
        return (-50, 101) if signed else (0, 101)
    bound = max(1, 100 // (8 * nranks))
    return (-bound, 2 * bound + 1) if signed else (0, 2 * bound + 1)


# --- the GPU side ------------------------------------------------------------------------------

class Gpu:
    """Inputs, expected outputs and checks, all as CuPy work on the current stream."""

    def __init__(self, nranks: int):
        import cupy

        self.cp = cupy
        self.n = nranks
        self.gen = cupy.ElementwiseKernel(
            "int32 r, uint32 salt, int32 lo, int32 span, int64 base", "int32 y",
            "unsigned long long h = ((unsigned long long)(i + base) + 1ull) * 0x9E3779B97F4A7C15ull;"
            "h ^= ((unsigned long long)r * 1000003ull + salt) * 0xC2B2AE3D27D4EB4Full;"
            "h ^= h >> 29; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 32;"
            "y = lo + (int)(h % (unsigned long long)span);", "gc3_fuzz_gen")

    def storage(self, dtype: int):
        """The CuPy dtype a buffer of `dtype` is held in (bfloat16 as its uint16 bits)."""
        name = DTYPE_NAMES[dtype]
        return self.cp.uint16 if name == "bfloat16" else self.cp.dtype(name)

    def ints(self, spec: Spec, rank: int, base: int, count: int):
        lo, span = value_range(spec.op, spec.dtype, self.n, rank)
        out = self.cp.empty(count, dtype=self.cp.int32)
        if count:
            self.gen(rank, spec.salt, lo, span, base, out)
        return out

    def cast(self, ints, dtype: int):
        cp = self.cp
        name = DTYPE_NAMES[dtype]
        if name == "bfloat16":   # small integers are exact in bfloat16: the top half of their float32
            return (ints.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
        return ints.astype(name)

    def reduced(self, spec: Spec, base: int, count: int):
        cp = self.cp
        acc, negatives = None, None
        for r in range(self.n):
            x = self.ints(spec, r, base, count).astype(cp.int64)
            if spec.op == NCCL_PROD:
                neg = (x < 0).astype(cp.int8)
                negatives = neg if negatives is None else negatives ^ neg
            if acc is None:
                acc = x
            elif spec.op in (NCCL_SUM, NCCL_AVG):
                acc = acc + x
            elif spec.op == NCCL_PROD:
                acc = acc * x
            elif spec.op == NCCL_MAX:
                acc = cp.maximum(acc, x)
            else:
                acc = cp.minimum(acc, x)
        if spec.op == NCCL_AVG:
            if DTYPE_NAMES[spec.dtype].startswith(("int", "uint")):
                acc = cp.sign(acc) * (cp.abs(acc) // self.n)     # NCCL divides integers toward zero
            else:
                return self.cast_float(acc.astype(cp.float64) / self.n, spec.dtype)
        if spec.op == NCCL_PROD and not DTYPE_NAMES[spec.dtype].startswith(("int", "uint")):
            # IEEE: a zero product carries the sign of its factors (-1 * 0 = -0.0).
            f = acc.astype(cp.float64)
            f = cp.where((acc == 0) & (negatives == 1), -0.0, f)
            return self.cast_float(f, spec.dtype)
        return self.cast(acc.astype(cp.int32), spec.dtype)

    def cast_float(self, values, dtype: int):
        cp = self.cp
        if DTYPE_NAMES[dtype] == "bfloat16":
            return (values.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
        return values.astype(DTYPE_NAMES[dtype])

    def view(self, ptr: int, count: int, dtype: int):
        cp = self.cp
        st = self.storage(dtype)
        nbytes = count * cp.dtype(st).itemsize
        mem = cp.cuda.UnownedMemory(ptr, max(nbytes, 1), None)
        return cp.ndarray((count,), dtype=st, memptr=cp.cuda.MemoryPointer(mem, 0))

    def mismatch(self, got, want):
        """Device scalars (bad count, first bad index, got there, want there); no host sync."""
        cp = self.cp
        if got.size == 0:
            z = cp.zeros((), dtype=cp.int64)
            return z, z, z, z
        uint = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[got.dtype.itemsize]
        diff = got.view(uint) != want.view(uint)
        first = cp.argmax(diff)
        return (cp.count_nonzero(diff).astype(cp.int64), first.astype(cp.int64),
                got.view(uint)[first].astype(cp.int64), want.view(uint)[first].astype(cp.int64))


class Buffers:
    """Device memory for the calls: fresh from CuPy's pool, reused from earlier
    calls (another dtype, size or collective at the same address), or offset."""

    def __init__(self, cp):
        self.cp = cp
        self.kept: List = []

    def get(self, spec: Spec, nbytes: int):
        cp = self.cp
        extra = spec.offset * ITEMSIZE[spec.dtype]
        need = nbytes + extra
        if spec.buf == "reused":
            for k, a in enumerate(self.kept):
                if a.nbytes >= need:
                    self.kept.append(self.kept.pop(k))
                    return a, a.data.ptr + extra
        a = cp.empty(max(need, 1), dtype=cp.uint8)
        self.kept.append(a)
        if len(self.kept) > 8:
            self.kept.pop(0)
        return a, a.data.ptr + extra


# --- one call on one rank -------------------------------------------------------------------------

class Layout:
    """Where a call's input and output live for one rank, and what to compare."""

    def __init__(self, spec: Spec, n: int, rank: int):
        c = spec.count
        self.spec, self.n, self.rank = spec, n, rank
        coll = spec.coll
        self.in_elems = c * n if coll in ("reducescatter", "alltoall") else c
        self.out_elems = c * n if coll in ("allgather", "alltoall") else c
        if spec.inplace and coll == "allgather":
            self.send_off, self.buf_elems = rank * c, c * n
        elif spec.inplace and coll == "reducescatter":
            self.send_off, self.buf_elems = 0, c * n
        else:
            self.send_off, self.buf_elems = 0, max(self.in_elems, self.out_elems)
        self.recv_off = rank * c if spec.inplace and coll == "reducescatter" else 0


def expected(gpu: Gpu, spec: Spec, n: int, rank: int):
    """The exact output of this rank (None where NCCL leaves it undefined)."""
    c = spec.count
    if spec.coll == "allreduce":
        return gpu.reduced(spec, 0, c)
    if spec.coll == "reduce":
        return gpu.reduced(spec, 0, c) if rank == spec.root else None
    if spec.coll == "broadcast":
        return gpu.cast(gpu.ints(spec, spec.root, 0, c), spec.dtype)
    if spec.coll == "allgather":
        return gpu.cp.concatenate([gpu.cast(gpu.ints(spec, r, 0, c), spec.dtype) for r in range(n)])
    if spec.coll == "reducescatter":
        return gpu.reduced(spec, rank * c, c)
    if spec.coll == "alltoall":
        return gpu.cp.concatenate([gpu.cast(gpu.ints(spec, r, rank * c, c), spec.dtype) for r in range(n)])
    if spec.coll == "sendrecv":
        return gpu.cast(gpu.ints(spec, (rank - spec.root) % n, 0, c), spec.dtype)
    raise ValueError(spec.coll)


def fill_input(gpu: Gpu, spec: Spec, n: int, rank: int, ptr: int) -> None:
    if spec.coll == "broadcast" and rank != spec.root:
        return
    lay = Layout(spec, n, rank)
    dst = gpu.view(ptr, lay.in_elems, spec.dtype)
    if lay.in_elems:
        dst[...] = gpu.cast(gpu.ints(spec, rank, 0, lay.in_elems), spec.dtype)


class Streams:
    """The stream kinds a call can come on, and the user-side ordering a correct
    program adds when its collective stream differs from CuPy's current one."""

    def __init__(self, cp):
        self.cp = cp
        rt = cp.cuda.runtime
        self.rt = rt
        self.current = cp.cuda.Stream(non_blocking=True)
        self.other = cp.cuda.Stream(non_blocking=True)
        self.indep = cp.cuda.Stream(non_blocking=True)
        self.handles = {"use": self.current.ptr, "other": self.other.ptr, "null": 0, "ptds": 2,
                        "indep": self.indep.ptr}
        self.event = rt.eventCreateWithFlags(rt.eventDisableTiming)
        self.current.use()

    @contextmanager
    def on(self, spec: "Spec"):
        """For an indep call: the program's own work for it on the call's stream
        (selected and then deselected with use(), as a careful CuPy program does)."""
        if spec.stream != "indep":
            yield
            return
        prev = self.cp.cuda.get_current_stream()
        self.indep.use()
        try:
            yield
        finally:
            prev.use()

    def join(self, waiter: int, on: int) -> None:
        if waiter != on:
            self.rt.eventRecord(self.event, on)
            self.rt.streamWaitEvent(waiter, self.event, 0)

    def sync_all(self) -> None:
        for h in set(self.handles.values()):
            self.rt.streamSynchronize(h)


# --- endpoints: what serves the calls ---------------------------------------------------------------

def issue(comm, spec: Spec, send: int, recv: int, stream: int, n: int, rank: int, group) -> str:
    """One call on a cupy.cuda.nccl-style communicator (gc3's drop-in or NCCL's own)."""
    c = spec
    if c.coll == "sendrecv":
        group[0]()
        try:
            comm.send(send, c.count, c.dtype, (rank + c.root) % n, stream)
            comm.recv(recv, c.count, c.dtype, (rank - c.root) % n, stream)
        finally:
            group[1]()
        return "NCCL"
    if hasattr(comm, "submit"):
        return comm.submit(c.coll, send, recv, c.count, c.dtype, c.op, stream, c.root)
    from runtime_cuda.nccl.fallback import NcclFallback
    NcclFallback(comm, group).run(Call(c.coll, send, recv, c.count, c.dtype, c.op, stream, n, rank, c.root))
    return "NCCL"


@dataclass
class Outcome:
    spec: Spec
    route: str
    checks: list          # (label, rank, device scalars)


def batch_report(specs: Sequence[Spec], outcomes: Sequence[Outcome], error: str) -> List[str]:
    """The calls of a batch that failed as a whole (a GPU timeout surfaces when the host waits,
    after every call of the batch went out), each with the route that served it, and a mark on
    the calls whose route the error names: the candidates for the call that timed out."""
    routes = {o.spec.index: o.route for o in outcomes}
    lines = []
    for spec in specs:
        route = routes.get(spec.index)
        mark = "   <- the error names this route" if route and f"'{route}'" in error else ""
        lines.append(f"  {spec.describe()} -> {route or 'not issued'}{mark}")
    return lines


class ProcessRank:
    """mode=processes: this process is one rank; gc3's drop-in serves the calls,
    and NCCL's own communicator replays them where it can exist."""

    def __init__(self, args, mpi):
        import cupy as cp

        from runtime_cuda import nccl as gnccl
        from runtime_cuda.nccl.fallback import originals

        self.cp, self.mpi = cp, mpi
        self.rank, self.n = mpi.Get_rank(), mpi.Get_size()
        ndev = cp.cuda.runtime.getDeviceCount()
        self.ngpus_used = min(ndev, self.n)
        cp.cuda.Device(self.rank % ndev).use()
        self.gpu = Gpu(self.n)
        self.bufs = Buffers(cp)
        self.ref_bufs = Buffers(cp)
        # An indep call's buffers come from its own stream's pool (reusing one
        # the current stream still reads would be the program's own race).
        self.indep_bufs = {"gc3-dropin": Buffers(cp), "nccl": Buffers(cp)}
        self.streams = Streams(cp)
        self.nccl = None
        self.nccl_why = "ranks share a GPU (NCCL refuses two ranks on one device)"
        if ndev >= self.n and not args.no_nccl:
            uid = mpi.bcast(gnccl.get_unique_id() if self.rank == 0 else None, root=0)
            self.comm = gnccl.NcclCommunicator(self.n, uid, self.rank)
            uid2 = mpi.bcast(gnccl.get_unique_id() if self.rank == 0 else None, root=0)
            self.nccl = originals()["NcclCommunicator"](self.n, uid2, self.rank)
            self.nccl_group = (originals()["groupStart"], originals()["groupEnd"])
            self.group = (gnccl.groupStart, gnccl.groupEnd)
        else:
            if args.no_nccl:
                self.nccl_why = "--no-nccl"
            self.comm = gnccl.NcclCommunicator.from_mpi(mpi)
            self.group = (gnccl.groupStart, gnccl.groupEnd)

    def run(self, spec: Spec) -> Outcome:
        out = Outcome(spec, "", [])
        out.route = self._one(spec, self.comm, self.bufs, self.group, "gc3-dropin", out)
        return out

    def replay(self, outcomes: Sequence[Outcome]) -> None:
        """NCCL's own communicator on the same calls, after gc3's have finished (the module's
        docstring says why), its checks added to each call's outcome."""
        if self.nccl is None:
            return
        for out in outcomes:
            self._one(out.spec, self.nccl, self.ref_bufs, self.nccl_group, "nccl", out)
        self.streams.sync_all()

    def _one(self, spec, comm, bufs, group, label, out) -> str:
        cp, gpu, st = self.cp, self.gpu, self.streams
        lay = Layout(spec, self.n, self.rank)
        item = ITEMSIZE[spec.dtype]
        indep = spec.stream == "indep"
        if indep:
            bufs = self.indep_bufs[label]
        with st.on(spec):
            if spec.coll == "sendrecv":
                _, send = bufs.get(spec, lay.in_elems * item)
                _, recv = bufs.get(replace(spec, buf="fresh"), lay.out_elems * item)
            else:
                _, base = bufs.get(spec, lay.buf_elems * item)
                if spec.inplace:
                    send, recv = base + lay.send_off * item, base + lay.recv_off * item
                else:
                    _, recv = bufs.get(replace(spec, buf="fresh"), lay.out_elems * item)
                    send = base
            fill_input(gpu, spec, self.n, self.rank, send)
        cur = cp.cuda.get_current_stream().ptr
        cs = st.handles[spec.stream]
        if not indep:
            st.join(cs, cur)
        route = issue(comm, spec, send, recv, cs, self.n, self.rank, group)
        if not indep:
            st.join(cur, cs)
        if cp.cuda.get_current_stream().ptr != cur:
            raise StreamChanged(f"{label}: {spec.describe()} changed CuPy's current stream from {cur:#x} to "
                                f"{cp.cuda.get_current_stream().ptr:#x}")
        with st.on(spec):
            want = expected(gpu, spec, self.n, self.rank)
            if want is not None:
                got = gpu.view(recv, want.size, spec.dtype)
                out.checks.append((label, self.rank, gpu.mismatch(got, want)))
        return route


class StreamChanged(RuntimeError):
    pass


class VirtualRanksRunner:
    """mode=virtual: one process runs every rank of a catalog algorithm as
    virtual ranks on one GPU (runtime_cuda.ranks.virtual); calls no algorithm
    serves are skipped (there is no NCCL to fall back to)."""

    def __init__(self, args):
        import cupy as cp

        from runtime_cuda.nccl.catalog import load_catalog

        self.cp = cp
        self.n = args.ranks
        self.rank = 0
        self.ngpus_used = 1
        self.gpu = Gpu(self.n)
        self.bufs = [Buffers(cp) for _ in range(self.n)]
        self.indep_bufs = [Buffers(cp) for _ in range(self.n)]
        self.streams = Streams(cp)
        self.catalog = load_catalog(os.environ)
        self.groups: Dict[str, object] = {}

    def replay(self, outcomes: Sequence[Outcome]) -> None:
        """No second communicator here (ranks share the GPU)."""

    def run(self, spec: Spec) -> Outcome:
        from runtime_cuda.core import abi
        from runtime_cuda.nccl.selection import select
        from runtime_cuda.ranks.small_allreduce import SmallAllreduce
        from runtime_cuda.ranks.virtual import VirtualRanks

        cp, gpu, st = self.cp, self.gpu, self.streams
        cur = cp.cuda.get_current_stream().ptr   # before any set-up: that must not change it either
        out = Outcome(spec, "skipped", [])
        if (spec.coll == "sendrecv" or DTYPE_NAMES[spec.dtype] not in abi.DTYPE
                or (spec.op is not None and OP_NAMES[spec.op] not in abi.REDOP)):
            return out
        lays = [Layout(spec, self.n, r) for r in range(self.n)]
        item = ITEMSIZE[spec.dtype]
        indep = spec.stream == "indep"
        pools = self.indep_bufs if indep else self.bufs
        sends, recvs = [], []
        with st.on(spec):
            for r, lay in enumerate(lays):
                _, base = pools[r].get(spec, lay.buf_elems * item)
                if spec.inplace:
                    sends.append(base + lay.send_off * item)
                    recvs.append(base + lay.recv_off * item)
                else:
                    _, recv = pools[r].get(replace(spec, buf="fresh"), lay.out_elems * item)
                    sends.append(base)
                    recvs.append(recv)
        cs = st.handles[spec.stream]
        calls = [Call(spec.coll, sends[r], recvs[r], spec.count, spec.dtype, spec.op, cs, self.n, r, spec.root)
                 for r in range(self.n)]
        decision = select(self.catalog, calls[0])
        if not decision.uses_gc3 or any(not select(self.catalog, c).uses_gc3 for c in calls[1:]):
            return out
        cand = decision.candidate
        # The small-message kernels share one scratch per communicator, as in the drop-in.
        key = "kernel" if cand.kernel else cand.name
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = (SmallAllreduce.virtual(self.n, max_bytes=self.catalog.kernel_bytes(self.n))
                                        if cand.kernel
                                        else VirtualRanks(cand.program))
        with st.on(spec):
            for r in range(self.n):
                fill_input(gpu, spec, self.n, r, sends[r])
        if not indep:
            st.join(cs, cur)
        op = OP_NAMES[spec.op] if spec.op is not None else "sum"
        # As the drop-in's backend runs it: a kernel entry names its collective too.
        group.run_ptrs(sends, recvs, calls[0].in_elems, DTYPE_NAMES[spec.dtype], op, cs, **cand.run_kwargs)
        if not indep:
            st.join(cur, cs)
        if cp.cuda.get_current_stream().ptr != cur:
            raise StreamChanged(f"{spec.describe()} changed CuPy's current stream from {cur:#x} to "
                                f"{cp.cuda.get_current_stream().ptr:#x}")
        out.route = cand.name
        with st.on(spec):
            for r in range(self.n):
                want = expected(gpu, spec, self.n, r)
                if want is not None:
                    out.checks.append(("gc3-virtual", r,
                                       gpu.mismatch(gpu.view(recvs[r], want.size, spec.dtype), want)))
        return out

    def check_async_error(self):
        for g in self.groups.values():
            g.executor.check(synchronize=False)


# --- the loop -------------------------------------------------------------------------------------------

def hang(rank: int, seed: int, index: int) -> None:
    """A batch that never finishes: say so, show where the host is, and stop
    (the GPU may be stuck, so nothing after this could be trusted)."""
    from runtime_cuda.core.stuck import end_process

    end_process(f"rank {rank}: HANG: the batch of seed {seed} starting at call #{index} did not finish; "
                "host stacks follow")


def catalog_name(env=None, default=None) -> str:
    """What served the calls, for the summary line: GC3_CONFIG's file name, else the
    default the communicator chose (`default`: its machine.Default; "none" for NCCL
    alone) or the sample index, each with the first 8 hex digits of its SHA-1 (the
    device copy of a checkout has no git history to name a commit by)."""
    import hashlib

    env = os.environ if env is None else env
    from runtime_cuda.nccl.catalog import DEFAULT_INDEX
    path = DEFAULT_INDEX
    if env.get("GC3_CONFIG"):
        path = Path(env["GC3_CONFIG"])
    elif default is not None:
        if default.path is None:
            return "none"
        path = default.path
    try:
        digest = hashlib.sha1(path.read_bytes()).hexdigest()[:8]
    except OSError:
        digest = "unreadable"
    extra = "+xml_files" if env.get("GC3_XML_FILES") or env.get("MSCCL_XML_FILES") else ""
    # A measured catalog is a catalog.json in a folder named after its GPUs.
    name = "index" if path == DEFAULT_INDEX else (path.name if env.get("GC3_CONFIG") else
                                                  f"{path.parent.name}/{path.name}")
    return f"{name}:{digest}{extra}"


def hw_description(cp, ngpus: int) -> str:
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    short = name.replace("NVIDIA ", "").split()[0]
    v = cp.cuda.runtime.runtimeGetVersion()
    cuda = f"{v // 1000}.{(v % 1000) // 10}"
    try:
        from cupy.cuda import nccl
        nv = nccl.get_version()
        ncclv = f"{nv // 10000}.{(nv % 10000) // 100}.{nv % 100}"
    except Exception:  # noqa: BLE001 -- a description, not a requirement
        ncclv = "none"
    return f"{ngpus}x{short} cuda={cuda} nccl={ncclv}"


def _gpu_missing() -> Optional[str]:
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
        return "CuPy sees no GPU here"
    except Exception as exc:  # noqa: BLE001 -- any reason is reported, in one line
        return f"no usable CuPy/CUDA here ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


# --- summary lines (measured/fuzz.txt) ---------------------------------------------------
# The line's fields that must agree for two runs to fold into one, and how each count folds.
_SAME = ("mode", "gpus", "ranks", "hw")
_SUMMED = ("calls", "gc3_served", "mismatches", "hangs")
_LARGEST = ("max_bytes", "streams")


def parse_line(line: str) -> Dict[str, str]:
    """A summary line as its fields, in order (hw may hold spaces: it runs to " date=")."""
    words = line.split()
    if not words or words[0] != "fuzz" or " hw=" not in line or " date=" not in line:
        raise ValueError(f"not a fuzz summary line: {line.strip()!r}")
    head, hw = " ".join(words[1:]).split(" hw=", 1)
    hw, date = hw.rsplit(" date=", 1)
    fields = dict(w.split("=", 1) for w in head.split())
    fields["hw"], fields["date"] = hw, date
    return fields


def fold(lines: Sequence[str]) -> str:
    """Summary lines of one configuration (mode, gpus, ranks, hw) over consecutive seeds,
    as the one line that stands for them all."""
    rows = [parse_line(x) for x in lines if x.strip()]
    if not rows:
        raise ValueError("no summary lines")
    for r in rows[1:]:
        for k in _SAME:
            if r[k] != rows[0][k]:
                raise ValueError(f"lines differ in {k}: {rows[0][k]!r} vs {r[k]!r}")
    seeds = sorted((int(a), int(b)) for a, b in (r["seed"].split("..") for r in rows))
    for (_, b), (a, _) in zip(seeds, seeds[1:]):
        if a != b + 1:
            raise ValueError(f"seeds are not consecutive: {seeds}")
    out = dict(rows[0])
    for k in _SUMMED:
        out[k] = str(sum(int(r[k]) for r in rows))
    for k in _LARGEST:
        out[k] = str(max(int(r[k]) for r in rows))
    out["seed"] = f"{seeds[0][0]}..{seeds[-1][1]}"
    out["date"] = max(r["date"] for r in rows)
    return "fuzz " + " ".join(f"{k}={v}" for k, v in out.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gc3 fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--fold", nargs="+", metavar="FILE",
                   help="run nothing: print the summary lines of these files (one configuration, consecutive "
                        "seeds) folded into the one line measured/fuzz.txt keeps")
    p.add_argument("--mode", choices=("processes", "virtual"), default="processes")
    p.add_argument("--ranks", type=int, default=4, help="virtual ranks (mode=virtual)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="consecutive seeds, --calls each")
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--batch", type=int, default=32, help="most calls issued before the host waits")
    p.add_argument("--colls", default=",".join(COLLS))
    p.add_argument("--dtypes", default="", help="comma-separated dtype names (default: all NCCL has)")
    p.add_argument("--ops", default="", help="comma-separated op names (default: all NCCL has)")
    p.add_argument("--no-nccl", action="store_true", help="never open NCCL (use the MPI stand-in)")
    p.add_argument("--hang-s", type=float, default=60.0, help="a batch taking longer is a hang (exit 3)")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds; stop drawing new batches after this (0: none) and report what ran")
    p.add_argument("--record", help="append the summary line to this file (rank 0)")
    p.add_argument("--no-minimize", action="store_true")
    args = p.parse_args(argv)
    if args.fold:
        try:
            print(fold([line for path in args.fold for line in Path(path).read_text().splitlines()]))
        except (OSError, ValueError) as exc:
            p.exit(2, f"gc3 fuzz --fold: {exc}\n")
        return 0
    colls = tuple(c for c in args.colls.split(",") if c)
    codes = {v: k for k, v in DTYPE_NAMES.items()}
    opcodes = {v: k for k, v in OP_NAMES.items()}
    try:
        dtypes = [codes[d] for d in args.dtypes.split(",") if d] or None
        ops = [opcodes[o] for o in args.ops.split(",") if o] or None
    except KeyError as exc:
        p.error(f"unknown dtype or op {exc}")
    bad = sorted(set(colls) - set(COLLS))
    if bad or args.calls < 0 or args.max_bytes < 1 or args.batch < 1 or args.ranks < 1:
        p.error(f"bad arguments ({'unknown collective ' + ', '.join(bad) if bad else 'counts must be positive'})")
    missing = _gpu_missing()
    if missing:
        p.exit(2, f"gc3 fuzz: needs CUDA GPUs: {missing}\n")

    import cupy as cp

    if args.mode == "processes":
        from mpi4py import MPI
        mpi = MPI.COMM_WORLD
        runner = ProcessRank(args, mpi)
    else:
        mpi = None
        runner = VirtualRanksRunner(args)
    n, rank = runner.n, runner.rank
    if rank == 0 and getattr(runner, "nccl", None) is None and args.mode == "processes":
        print(f"NCCL reference: not available ({runner.nccl_why}); exact reference only", flush=True)

    def agree_max(x: int) -> int:
        return mpi.allreduce(x, op=__import__("mpi4py").MPI.MAX) if mpi is not None else x

    served, routes, kinds, streams_seen = 0, Counter(), Counter(), set()
    mismatches, hangs, calls_done, max_bytes_seen = 0, 0, 0, 0
    failures: List[str] = []
    first_fail: Optional[Tuple[int, int]] = None   # (seed, index)
    t0 = time.time()
    out_of_time = False
    for seed in range(args.seed, args.seed + args.seeds):
        rng = random.Random(seed)
        i = 0
        while i < args.calls and not failures:
            batch = min(rng.randint(1, args.batch), args.calls - i)
            watchdog = threading.Timer(args.hang_s, hang, (rank, seed, i))
            watchdog.daemon = True
            watchdog.start()
            outcomes = []
            try:
                for k in range(i, i + batch):
                    spec = draw_spec(seed, k, n, args.max_bytes, colls, dtypes, ops)
                    outcomes.append(runner.run(spec))
                runner.streams.sync_all()
                if hasattr(runner, "comm"):
                    runner.comm.check_async_error()
                elif hasattr(runner, "check_async_error"):
                    runner.check_async_error()
                runner.replay(outcomes)
            except StreamChanged as exc:
                failures.append(str(exc))
                mismatches += 1
            except Exception as exc:  # noqa: BLE001 -- a GPU timeout is a hang; anything else is a failure too
                kind = "hang" if "timed out" in str(exc) or "gave up" in str(exc) else "error"
                hangs += kind == "hang"
                mismatches += kind != "hang"
                failures.append(f"{kind} in batch at call #{i}: {type(exc).__name__}: {exc}")
                if "timed out" in str(exc):
                    specs = [draw_spec(seed, k, n, args.max_bytes, colls, dtypes, ops) for k in range(i, i + batch)]
                    print(f"rank {rank}: the batch, calls #{i}..#{i + batch - 1}:\n"
                          + "\n".join(batch_report(specs, outcomes, str(exc))), file=sys.stderr, flush=True)
                if mpi is not None:
                    # The other ranks may be inside a collective this rank will never join:
                    # say what happened and stop them all, rather than hang until the watchdog.
                    print(f"rank {rank}: {failures[-1]}; aborting every rank", file=sys.stderr, flush=True)
                    mpi.Abort(1)
            watchdog.cancel()
            results = []
            if outcomes:
                flat = [s for o in outcomes for (_, _, s) in o.checks]
                host = cp.stack([x for s in flat for x in s]).get().reshape(-1, 4) if flat else []
                j = 0
                for o in outcomes:
                    for label, r, _ in o.checks:
                        results.append((o, label, r, host[j]))
                        j += 1
            for o, label, r, (nbad, first, got, want) in results:
                if nbad:
                    mismatches += 1
                    failures.append(f"MISMATCH rank {r} [{label}] {o.spec.describe()} served by {o.route}: "
                                    f"{int(nbad)} element(s) differ, first at index {int(first)}: "
                                    f"got bits {int(got):#x}, expected {int(want):#x}")
                    if first_fail is None:
                        first_fail = (seed, o.spec.index)
            for o in outcomes:
                calls_done += 1
                kinds[o.spec.coll] += 1
                streams_seen.add(o.spec.stream)
                routes[o.route] += 1
                if o.route not in ("NCCL", "skipped", "", "group"):
                    served += 1
                lay = Layout(o.spec, n, rank)
                max_bytes_seen = max(max_bytes_seen, lay.buf_elems * ITEMSIZE[o.spec.dtype])
            if agree_max(len(failures)):
                break
            i += batch
            if args.time_budget and agree_max(int(time.time() - t0 > args.time_budget)):
                out_of_time = True
                break
        if out_of_time:
            break
        if agree_max(len(failures)):
            break

    total_fail = agree_max(mismatches)
    total_hang = agree_max(hangs)
    for line in failures[:20]:
        print(f"rank {rank}: {line}", flush=True)
    # The shortest run of calls ending in the first failing one that still
    # fails when replayed (in this process: the runtime's state is kept).
    culprit = agree_max(first_fail[1] if first_fail else -1)
    if culprit >= 0 and not args.no_minimize and total_hang == 0:
        seed = agree_max(first_fail[0] if first_fail else -1)
        length = 1
        while length <= culprit + 1:
            bad_here = 0
            outs = [runner.run(draw_spec(seed, k, n, args.max_bytes, colls, dtypes, ops))
                    for k in range(culprit - length + 1, culprit + 1)]
            runner.streams.sync_all()
            runner.replay(outs)
            for o in outs:
                for _, _, s in o.checks:
                    bad_here += int(s[0].get())
            if agree_max(bad_here):
                if rank == 0:
                    print(f"minimal failing run: calls #{culprit - length + 1}..#{culprit} of seed {seed} "
                          f"({length} call(s)):", flush=True)
                    for k in range(culprit - length + 1, culprit + 1):
                        print("  " + draw_spec(seed, k, n, args.max_bytes, colls, dtypes, ops).describe(), flush=True)
                break
            length *= 2
        else:
            if rank == 0:
                print("the failure does not reproduce from a suffix of the sequence (it depends on the "
                      "whole history)", flush=True)
    served_all = mpi.allreduce(served) // n if mpi is not None else served
    calls_all = calls_done
    if rank == 0:
        el = time.time() - t0
        ngpus = runner.ngpus_used
        line = (f"fuzz mode={args.mode} gpus={ngpus} ranks={n} calls={calls_all} gc3_served={served_all} "
                f"mismatches={total_fail} hangs={total_hang} max_bytes={max_bytes_seen} "
                f"streams={len(streams_seen)} seed={args.seed}..{args.seed + args.seeds - 1} "
                f"catalog={catalog_name(default=getattr(getattr(runner, 'comm', None), 'machine', None))} hw={hw_description(cp, ngpus)} date={datetime.date.today().isoformat()}")
        print(f"coverage: {dict(kinds)}; routes: {dict(routes)}; stream kinds: {sorted(streams_seen)}; "
              f"{el:.1f} s", flush=True)
        print(line, flush=True)
        if args.record:
            with open(args.record, "a") as f:
                f.write(line + "\n")
    return 1 if (total_fail or total_hang) else 0


@click.command("fuzz", context_settings={"ignore_unknown_options": True, "help_option_names": []},
               add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args) -> None:
    """Differential fuzz of the drop-in against the exact result and NCCL (--help for its options)."""
    sys.exit(main(list(args)))


if __name__ == "__main__":
    sys.exit(main())
