"""Hand-built IR programs (gc3 convention) for simulator tests and benchmarks.

They are written directly as ir.Program so the simulator can be tested
without the compiler.
"""
from __future__ import annotations

import copy

from gc3.ir import Gpu, Program, Step, Threadblock


def _step(tb: Threadblock, type_: str, src, dst, cnt: int = 1, dep=(-1, -1), hasdep=False) -> int:
    """Append a step; `src`/`dst` are (buffer, chunk) operands, local ones only."""
    s = len(tb.steps)
    tb.steps.append(Step(s=s, type=type_, srcbuf=src[0], srcoff=src[1], dstbuf=dst[0], dstoff=dst[1],
                         cnt=cnt, depid=dep[0], deps=dep[1], hasdep=hasdep))
    return s


def allpairs_allreduce(nranks: int = 8, instances: int = 2, per_peer: int = 4, proto: str = "Simple") -> Program:
    """All-pairs AllReduce.  Instance `k` (channel k) owns chunks
    [k*n*m, (k+1)*n*m) of each rank, split into n groups of m = `per_peer`
    chunks; rank p reduces group p.  Per rank and instance: one threadblock per
    peer (send m chunks, receive m into scratch, send m reduced, receive m
    results) and one reducing threadblock of `re` steps.  Each peer sends m
    messages before receiving, so the FIFOs need at least m slots."""
    n, m = nranks, per_peer
    per_inst = n * m
    prog = Program(name=f"allpairs_allreduce_{n}r_{instances}i", proto=proto, nchannels=instances,
                   nchunksperloop=per_inst * instances, ngpus=n, coll="allreduce", inplace=True,
                   gc3version="test")

    def idx(k, owner, j):
        return k * per_inst + owner * m + j

    for r in range(n):
        g = Gpu(id=r, i_chunks=per_inst * instances, o_chunks=0, s_chunks=instances * (n - 1) * m)
        peers = [p for p in range(n) if p != r]

        def sidx(k, pp, j):
            return k * (n - 1) * m + pp * m + j

        for k in range(instances):
            base = k * n
            red_id = base + n - 1
            peer_tbs = [Threadblock(id=base + pp, send=p, recv=p, chan=k) for pp, p in enumerate(peers)]
            red = Threadblock(id=red_id, send=-1, recv=-1, chan=k)
            for pp, (p, tb) in enumerate(zip(peers, peer_tbs)):
                for j in range(m):
                    _step(tb, "s", ("i", idx(k, p, j)), ("i", idx(k, p, j)))
                for j in range(m):
                    _step(tb, "r", ("s", sidx(k, pp, j)), ("s", sidx(k, pp, j)), hasdep=True)
            last_re = {}
            for j in range(m):
                for pp in range(n - 1):
                    last_re[j] = _step(red, "re", ("s", sidx(k, pp, j)), ("i", idx(k, r, j)),
                                       dep=(base + pp, m + j), hasdep=pp == n - 2)
            for p, tb in zip(peers, peer_tbs):
                for j in range(m):
                    _step(tb, "s", ("i", idx(k, r, j)), ("i", idx(k, r, j)), dep=(red_id, last_re[j]))
                for j in range(m):
                    _step(tb, "r", ("i", idx(k, p, j)), ("i", idx(k, p, j)))
            g.threadblocks += peer_tbs + [red]
        g.threadblocks.sort(key=lambda tb: tb.id)
        prog.gpus.append(g)
    return prog


def ring_allgather(nranks: int = 4, chunks: int = 2, inplace: bool = False) -> Program:
    """Ring AllGather, one threadblock per rank, `chunks` chunks per rank.
    Rank r copies its input into output block r (out of place), then forwards
    blocks around the ring with `rcs`, the last one with `r`."""
    n, c = nranks, chunks
    prog = Program(name=f"ring_allgather_{n}r", proto="Simple", nchannels=1, nchunksperloop=n * c, ngpus=n,
                   coll="allgather", inplace=inplace, gc3version="test")
    for r in range(n):
        g = Gpu(id=r, i_chunks=c, o_chunks=n * c, s_chunks=0)
        tb = Threadblock(id=0, send=(r + 1) % n, recv=(r - 1) % n, chan=0)
        if not inplace:
            _step(tb, "cpy", ("i", 0), ("o", r * c), cnt=c)
        _step(tb, "s", ("o", r * c), ("o", r * c), cnt=c)
        for hop in range(1, n):
            blk = (r - hop) % n
            _step(tb, "rcs" if hop < n - 1 else "r", ("o", blk * c), ("o", blk * c), cnt=c)
        g.threadblocks.append(tb)
        prog.gpus.append(g)
    return prog


def ring_reducescatter(nranks: int = 4, chunks: int = 2, inplace: bool = False, write_as: str = "o") -> Program:
    """Ring ReduceScatter: block (r-1-h) mod n travels one hop per step and is
    reduced on the way (`rrs`); its last receiver, its owner, stores it with
    `rrc`.  In place, the result goes to output chunk 0 (`write_as="o"`, the
    alias) or to input chunk r*c (`write_as="i"`, the real memory)."""
    n, c = nranks, chunks
    prog = Program(name=f"ring_reducescatter_{n}r", proto="Simple", nchannels=1, nchunksperloop=n * c, ngpus=n,
                   coll="reducescatter", inplace=inplace, gc3version="test")
    for r in range(n):
        g = Gpu(id=r, i_chunks=n * c, o_chunks=c, s_chunks=0)
        tb = Threadblock(id=0, send=(r + 1) % n, recv=(r - 1) % n, chan=0)
        _step(tb, "s", ("i", (r - 1) % n * c), ("i", (r - 1) % n * c), cnt=c)
        for hop in range(1, n):
            blk = (r - 1 - hop) % n
            if hop < n - 1:
                _step(tb, "rrs", ("i", blk * c), ("i", blk * c), cnt=c)
            else:
                out = ("o", 0) if write_as == "o" else ("i", r * c)
                _step(tb, "rrc", ("i", blk * c), out, cnt=c)
        g.threadblocks.append(tb)
        prog.gpus.append(g)
    return prog


def alltoall_via_scratch(nranks: int = 2, chunks: int = 2) -> Program:
    """AllToAll whose first step copies the whole input into scratch with one
    `cpy` of cnt = n*c (spanning every block), then sends each peer its
    blocks from scratch with cnt = c and copies its own block to the output."""
    n, c = nranks, chunks
    prog = Program(name=f"alltoall_scratch_{n}r", proto="Simple", nchannels=1, nchunksperloop=n * c, ngpus=n,
                   coll="alltoall", inplace=False, gc3version="test")
    for r in range(n):
        g = Gpu(id=r, i_chunks=n * c, o_chunks=n * c, s_chunks=n * c)
        local = Threadblock(id=0, send=-1, recv=-1, chan=0)
        _step(local, "cpy", ("i", 0), ("s", 0), cnt=n * c, hasdep=True)
        _step(local, "cpy", ("s", r * c), ("o", r * c), cnt=c)
        g.threadblocks.append(local)
        for i, p in enumerate(q for q in range(n) if q != r):
            tb = Threadblock(id=1 + i, send=p, recv=p, chan=0)
            _step(tb, "s", ("s", p * c), ("s", p * c), cnt=c, dep=(0, 0))
            _step(tb, "r", ("o", p * c), ("o", p * c), cnt=c)
            g.threadblocks.append(tb)
        prog.gpus.append(g)
    return prog


def edited(prog: Program, rank: int, tb: int, step: int, **fields) -> Program:
    """A deep copy of `prog` with one step's fields replaced (to plant bugs)."""
    out = copy.deepcopy(prog)
    t = next(t for t in out.gpu(rank).threadblocks if t.id == tb)
    for k, v in fields.items():
        setattr(t.steps[step], k, v)
    return out
