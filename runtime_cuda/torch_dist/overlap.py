"""The GEMM operators' overlap on a gc3 group: a stream pipeline of GEMM chunks
and their collectives.

The GEMM runs as a few cuBLAS calls on the caller's stream; as soon as a chunk's
product exists, that chunk's collective runs on a high-priority side stream
through the group's own communicator (the catalog's algorithm or NCCL, whatever
the group serves at that size).  For all-gather + GEMM the order is reversed: a
chunk of the input is gathered on the side stream and its GEMM waits only for
that chunk.  The caller's stream waits for the side stream at the end.

Why this shape: the exchange is then exactly as fast as the group's collective
(it *is* that collective), cuBLAS keeps every SM it wants, and the comm kernels
get the SMs that free up first because their stream has the higher priority.
Everything is enqueued: no host synchronisation, no allocation outside torch's
caching allocator, no DLPack, and the side stream forks from and joins the
caller's stream through events, so a call is capturable in a CUDA graph.

Host cost per call: one cuBLAS call, one event record and one collective per
chunk, and one stream switch (every GEMM chunk is issued first, then every
collective; the GPU runs them interleaved all the same).  The buffers the
collectives read and write are kept per (caller's stream, shape) on the group,
so a repeated call hands the communicator the same addresses and takes its
prepared-call path (and a CUDA-graph capture allocates nothing in it); the
result is a fresh tensor from torch's caching allocator, filled by one copy.

Chunks split the columns of B (reduce-scatter, all-to-all: every chunk's
collective then covers every rank's rows, so each call is a whole collective at
full width) or the rows of A (all-reduce, all-gather).  Column chunks need one
concatenation of the (small) result at the end.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

# Chunk boundaries are multiples of this many rows or columns: cuBLAS's tiles
# (64-256 wide) then stay whole, and bf16 rows stay 128-byte aligned.
ALIGN = 64
# Shapes whose intermediates a group keeps (least recently used dropped first).
SCRATCH_SHAPES = 16


class Trace:
    """GC3_FUSED_TRACE=1: timing events around each GEMM chunk (caller's stream) and
    each collective (side stream) of the last call, read after it completes."""

    def __init__(self):
        self.gemm: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.comm: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.origin = torch.cuda.Event(enable_timing=True)

    @staticmethod
    def pair(stream) -> Tuple[torch.cuda.Event, torch.cuda.Event]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        return start, end

    def intervals(self, pairs) -> List[Tuple[float, float]]:
        """(start, end) in microseconds after the call's first event; synchronizes."""
        for _, end in pairs:
            end.synchronize()
        return [(self.origin.elapsed_time(a) * 1e3, self.origin.elapsed_time(b) * 1e3) for a, b in pairs]

    def overlap(self) -> float:
        """The share of the collectives' time spent while a GEMM chunk ran."""
        return covered(self.intervals(self.comm), self.intervals(self.gemm))


def covered(spans: Sequence[Tuple[float, float]], by: Sequence[Tuple[float, float]]) -> float:
    """The share of the total length of `spans` that lies inside the union of `by` (a fused
    call's transfer time inside its GEMM work, for either pipeline's trace)."""
    union: List[List[float]] = []
    for a, b in sorted(by):
        if union and a <= union[-1][1]:
            union[-1][1] = max(union[-1][1], b)
        else:
            union.append([a, b])
    total = sum(b - a for a, b in spans)
    inside = sum(max(0, min(b, d) - max(a, c)) for a, b in spans for c, d in union)
    return inside / total if total > 0 else 0.0


# The last traced call's timing (GC3_FUSED_TRACE=1), for the benchmark and the tests: this
# pipeline's Trace, or tile_store.Trace for the tile-store all-gather.
last_trace = None


class _Lanes:
    """The side stream of one device and the events the pipeline records."""

    def __init__(self, device: int):
        _, high = torch.cuda.Stream.priority_range()
        self.side = torch.cuda.Stream(device=device, priority=high)
        self.events: List[torch.cuda.Event] = []

    def event(self, i: int) -> torch.cuda.Event:
        # An event may be recorded again once the waits that read it are enqueued:
        # a wait captures the record it sees when it is issued.
        while len(self.events) <= i:
            self.events.append(torch.cuda.Event())
        return self.events[i]


_LANES: Dict[int, _Lanes] = {}


def _tracing() -> bool:
    from runtime_cuda.fused.gemm_signal import trace_enabled
    return trace_enabled()


def lanes(device: int) -> _Lanes:
    got = _LANES.get(device)
    if got is None:
        got = _LANES[device] = _Lanes(device)
    return got


def bounds(total: int, chunks: int, align: int = ALIGN) -> List[int]:
    """Split [0, total) into at most `chunks` near-equal pieces whose inner
    boundaries are multiples of `align` (fewer pieces when total is small)."""
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    units = -(-total // align)
    chunks = max(1, min(chunks, units))
    cuts = [min(total, (units * i // chunks) * align) for i in range(chunks + 1)]
    cuts[-1] = total
    return [c for i, c in enumerate(cuts) if i == 0 or c > cuts[i - 1]]


def _pieces(cuts: Sequence[int]) -> List[Tuple[int, int]]:
    return list(zip(cuts[:-1], cuts[1:]))


def scratch(pg, key: Tuple, make: Callable[[], tuple]) -> tuple:
    """The intermediates of `key` kept on the group `pg` (made on first use).
    Reusing them across calls is safe: every call ends with the caller's stream
    waiting for the side stream, so the next call's GEMMs follow this call's
    collectives."""
    cache = pg.__dict__.setdefault("_overlap_scratch", OrderedDict())
    got = cache.get(key)
    if got is None:
        got = cache[key] = make()
        if len(cache) > SCRATCH_SHAPES:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return got


class _Pipeline:
    """One call's streams: `main` is the caller's, `side` the collectives'."""

    def __init__(self, pg, tensors, what: str):
        self.pg = pg
        self.comm = pg._cuda(list(tensors), what)
        device = pg._device.index
        self.main = torch.cuda.current_stream(device)
        self.lanes = lanes(device)
        self.side = self.lanes.side
        global last_trace
        self.trace = None
        if _tracing():
            self.trace = last_trace = Trace()
            self.trace.origin.record(self.main)

    def gemm(self, fn: Callable[[], object]):
        """One GEMM chunk on the caller's stream (timed under GC3_FUSED_TRACE)."""
        if self.trace is None:
            return fn()
        start, end = Trace.pair(self.main)
        got = fn()
        end.record(self.main)
        self.trace.gemm.append((start, end))
        return got

    def key(self, *parts) -> Tuple:
        return (self.main.cuda_stream,) + parts

    def mark(self, i: int, stream) -> torch.cuda.Event:
        ev = self.lanes.event(i)
        ev.record(stream)
        return ev

    def collectives(self, calls, after: Optional[List[torch.cuda.Event]] = None,
                    then: Optional[Callable[[int], None]] = None) -> None:
        """Issue `calls` [(coll, send, recv, count, op)] on the side stream, the
        i-th after event after[i] (or all after the caller's stream as it is now),
        each followed by then(i) on the side stream."""
        if after is None:
            self.side.wait_stream(self.main)
        pg, comm = self.pg, self.comm
        torch.cuda.set_stream(self.side)
        try:
            for i, (coll, send, recv, count, op) in enumerate(calls):
                if after is not None:
                    self.side.wait_event(after[i])
                timed = Trace.pair(self.side) if self.trace is not None else None
                pg._submit(comm, coll, send, recv, count, op)
                if timed is not None:
                    timed[1].record(self.side)
                    self.trace.comm.append(timed)
                if then is not None:
                    then(i)
        finally:
            torch.cuda.set_stream(self.main)

    def join(self) -> None:
        self.main.wait_stream(self.side)


def matmul_reduce_scatter(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """rows r of sum_s A_s @ B_s (sum over ranks), [M/G, N]; A [M, K_r], B [K_r, N] contiguous."""
    return _by_columns(pg, A, B, chunks, what, "reducescatter", A.shape[0] // pg.size(), "sum")


def _by_columns(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str, coll: str, rows_out: int,
                op: Optional[str]) -> torch.Tensor:
    """A @ B in column chunks, each chunk's `coll` into rows_out rows of the result."""
    M, N = A.shape[0], B.shape[1]
    p = _Pipeline(pg, [A, B], what)
    pieces = _pieces(bounds(N, chunks))
    parts, outs = scratch(pg, p.key(coll, M, N, rows_out, A.dtype, chunks), lambda: (
        [A.new_empty((M, hi - lo)) for lo, hi in pieces], [A.new_empty((rows_out, hi - lo)) for lo, hi in pieces]))
    marks = []
    for i, ((lo, hi), c) in enumerate(zip(pieces, parts)):
        p.gemm(lambda: torch.mm(A, B[:, lo:hi], out=c))
        marks.append(p.mark(i, p.main))
    per = pg.size() if coll == "alltoall" else 1
    p.collectives([(coll, c, o, o.numel() // per, op) for c, o in zip(parts, outs)], marks)
    p.join()
    return torch.cat(outs, dim=1)


def matmul_all_reduce(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """sum_s A_s @ B_s on every rank, [M, N]: each row chunk is all-reduced in place
    in the group's buffer, then copied out on the side stream."""
    M, N = A.shape[0], B.shape[1]
    p = _Pipeline(pg, [A, B], what)
    pieces = _pieces(bounds(M, chunks))
    (C,) = scratch(pg, p.key("allreduce", M, N, A.dtype), lambda: (A.new_empty((M, N)),))
    out = A.new_empty((M, N))
    marks = []
    for i, (lo, hi) in enumerate(pieces):
        p.gemm(lambda: torch.mm(A[lo:hi], B, out=C[lo:hi]))
        marks.append(p.mark(i, p.main))
    p.collectives([("allreduce", C[lo:hi], C[lo:hi], (hi - lo) * N, "sum") for lo, hi in pieces], marks,
                  then=lambda i: out[pieces[i][0]:pieces[i][1]].copy_(C[pieces[i][0]:pieces[i][1]]))
    p.join()
    return out


def matmul_all_to_all(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """all_to_all_single(A @ B): row block q of the result came from rank q."""
    return _by_columns(pg, A, B, chunks, what, "alltoall", A.shape[0], None)


def all_gather_matmul(pg, A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], chunks: int, return_A: bool,
                      what: str) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """A = all_gather(A_shard) (rank-major rows), [A @ B for B in Bs]; A_shard [m, K].
    Row chunk j of every rank's shard is gathered on the side stream into the group's
    buffer, and its GEMM waits only for that chunk."""
    G = pg.size()
    m, K = A_shard.shape
    outs = [A_shard.new_empty((G * m, B.shape[1])) for B in Bs]
    A = A_shard.new_empty((G * m, K)) if return_A else None
    p = _Pipeline(pg, [A_shard] + list(Bs), what)
    pieces = _pieces(bounds(m, chunks))
    src, gathered = scratch(pg, p.key("allgather", m, K, A_shard.dtype, chunks), lambda: (
        A_shard.new_empty((m, K)), [A_shard.new_empty((G, hi - lo, K)) for lo, hi in pieces]))
    src.copy_(A_shard)      # the collective's input at a kept address too
    marks = [p.lanes.event(i) for i in range(len(pieces))]
    p.collectives([("allgather", src[lo:hi], g, (hi - lo) * K, None) for (lo, hi), g in zip(pieces, gathered)],
                  then=lambda i: marks[i].record(p.side))
    for (lo, hi), g, ev in zip(pieces, gathered, marks):
        p.main.wait_event(ev)
        if A is not None:
            A.view(G, m, K)[:, lo:hi].copy_(g)
        rows = g.view(G * (hi - lo), K)
        for B, o in zip(Bs, outs):
            o.view(G, m, B.shape[1])[:, lo:hi].copy_(p.gemm(lambda: torch.mm(rows, B)).view(G, hi - lo, B.shape[1]))
    p.join()
    return A, outs
