"""Which GEMM chunk feeds which transfer, read from the compiled program.

The executor (gemm.py) issues each rank's GEMM chunks in `chunk_schedule`
order (stated here, beside the check); the IR of the matching gc3.algorithms.fused program says the same thing
as a partial order: a rank's GEMM steps sit on threadblocks, each chain of
steps on one threadblock ordered, and each GEMM chunk is carried by the send
that follows it on its threadblock (GEMM+RS/AR/A2A) or computed from the
block a receive delivered (AG+GEMM).  `check_executor(op, n)` holds the two
against each other: the same (row block, peer) pairs on every rank, and the
executor's order a linearization of every threadblock's chain; the executor
calls `require` before its first fused call of an (operator, ranks) pair.  The IR does
not order chunks across threadblocks (peers), so the rank-swizzled order
across peers stays the executor's choice within what the IR allows.
all_gather_gemm(return_a=True) requires the program's return_a variant, whose
IR also states the gathered A as an output (its blocks arrive there, and the
GEMMs read them from there rather than from scratch).
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Tuple

from gc3 import algorithms
from gc3.errors import GC3Error

# operator -> its DSL program in gc3.algorithms.fused
PROGRAMS = {"gemm_reduce_scatter": "gemm_reducescatter", "gemm_all_reduce": "gemm_allreduce",
            "gemm_all_to_all": "gemm_alltoall", "all_gather_gemm": "allgather_gemm"}

Chunk = Tuple[int, Optional[int]]   # (row block, peer it goes to / comes from; None: stays on the rank)


def peers_first(r: int, n: int) -> List[int]:
    """Destination order of rank r's chunks: r+1, r+2, ..., then its own."""
    return [(r + i) % n for i in range(1, n + 1)]


def arrival_order(r: int, n: int) -> List[int]:
    """Source order of rank r's AG chunks: its own, then r-1, r-2, ... (the
    order in which peers, each pushing to its successors first, deliver)."""
    return [(r - i) % n for i in range(n)]


def chunk_schedule(op: str, r: int, n: int) -> List[Chunk]:
    """Rank r's fused GEMM chunks in issue order: (row block, the rank its result goes to, or for
    all_gather_gemm the rank its A block comes from; None where it stays on r).  The executor
    (gemm.py) issues them so; `check_executor` holds it against the compiled program."""
    order = arrival_order(r, n) if op == "all_gather_gemm" else peers_first(r, n)
    return [(b, None if b == r else b) for b in order]


@functools.lru_cache(maxsize=None)
def compiled(op: str, n: int, return_a: bool = False):
    """The lowered IR of `op`'s program for n ranks, one chunk per rank block, at a tiny shape
    (the schedule does not depend on the matrix sizes); return_a: all_gather_gemm's variant
    that also returns the gathered A."""
    from gc3.compiler.pipeline import lower

    if op not in PROGRAMS:
        raise GC3Error(f"{op}: no fused GEMM program (expected one of {', '.join(PROGRAMS)})")
    if return_a and op != "all_gather_gemm":
        raise GC3Error(f"{op}: return_a is all_gather_gemm's (the gathered A); {op} gathers no A")
    name = PROGRAMS[op]
    build = algorithms.builder(f"fused.{name}")
    return lower(build(n, 2 * n, 1, 1, 1, *([1] if return_a else [])))


def ir_chunks(prog) -> Dict[int, List[List[Chunk]]]:
    """Per rank, per threadblock, its GEMM chunks in step order as (row block, peer)."""
    rows = prog.compute.gemm_dims()[0] // prog.ngpus   # rows of one rank block
    out: Dict[int, List[List[Chunk]]] = {}
    for g in prog.gpus:
        recv_from = {(st.dstbuf, st.dstoff): tb.recv for tb in g.threadblocks for st in tb.steps if st.info.recv}
        chains = []
        for tb in g.threadblocks:
            chain = []
            for i, st in enumerate(tb.steps):
                if st.type not in ("gemm", "agemm"):
                    continue
                block = st.compute.col0 // rows
                if st.type == "agemm":
                    peer = None if st.srcbuf == "i" else recv_from.get((st.srcbuf, st.srcoff), -1)
                else:
                    peer = _carried_to(g, tb, i)
                chain.append((block, peer))
            if chain:
                chains.append(chain)
        out[g.id] = chains
    return out


def _carried_to(g, tb, i: int) -> Optional[int]:
    """The rank the send after GEMM step i takes its result to, or None when the
    chunk is never sent as it is: a step of this threadblock, or one of another
    that the send waits for, writes it first (reduces into it, say)."""
    st = tb.steps[i]
    where = (st.dstbuf, st.dstoff)
    for later in tb.steps[i + 1:]:
        if later.type == "s" and (later.srcbuf, later.srcoff) == where:
            if later.depid >= 0:
                dep = next(x for x in g.threadblocks[later.depid].steps if x.s == later.deps)
                if (dep.dstbuf, dep.dstoff) == where and dep.info.writes:
                    return None
            return tb.send
        if (later.dstbuf, later.dstoff) == where:
            return None
    return None


def check_executor(op: str, n: int, prog=None, return_a: bool = False) -> None:
    """GC3Error unless the executor's chunk schedule for n ranks is the one `prog`
    (default: the compiled program of `op`, its return_a variant with return_a) states."""
    prog = compiled(op, n, return_a) if prog is None else prog
    if prog.ngpus != n:
        raise GC3Error(f"{op}: the program has {prog.ngpus} ranks, the executor {n}")
    if return_a and not prog.compute.return_a:
        raise GC3Error(f"{op}, {n} ranks: the executor returns the gathered A, but the program {prog.name!r} "
                       f"states no gathered-A output (<compute return_a=\"1\">)")
    chains = ir_chunks(prog)
    for r in range(n):
        mine = chunk_schedule(op, r, n)
        theirs = sorted(c for chain in chains[r] for c in set(chain))
        if sorted(mine) != theirs:
            raise GC3Error(f"{op}, {n} ranks, rank {r}: the executor's GEMM chunks (row block, peer) {sorted(mine)} "
                           f"are not the IR's {theirs}")
        pos = {c: i for i, c in enumerate(mine)}
        for chain in chains[r]:
            seen = [pos[c] for c in chain]
            if any(b < a for a, b in zip(seen, seen[1:])):
                raise GC3Error(f"{op}, {n} ranks, rank {r}: a threadblock of the IR orders its GEMM chunks {chain}, "
                               f"the executor issues them in the order {mine}")


@functools.lru_cache(maxsize=None)
def require(op: str, n: int, return_a: bool = False) -> None:
    """check_executor once per (operator, ranks, return_a) a process runs fused: the executor
    refuses to run a schedule its compiled program does not state."""
    check_executor(op, n, return_a=return_a)
