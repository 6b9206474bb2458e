"""Small DSL programs the lowering tests compile (written here so the tests do
not depend on gc3/algorithms/, which other work may change)."""
from gc3 import Check, GC3Program, chunk, parallelize
from gc3.benchmarks import compile_speed as _bench
from gc3.dsl.collectives import AllGather, AllReduce, AllToAll, Broadcast, ReduceScatter
from gc3.dsl.topology import fully_connected

# The compile-speed benchmark's programs are tested here too.


def ring_allreduce(n, instances=1, **kw):
    """msccl-tools' ring (tests/data/msccl/allreduce_ring_4r_1i.xml is its output)."""
    return _bench.gc3_ring(n, instances, **kw)


def allpairs_allreduce(n, instances=1, **kw):
    """msccl-tools' all-pairs AllReduce, manual threadblocks and scratch."""
    return _bench.gc3_allpairs(n, instances, **kw)


def two_step_alltoall(nodes, gpus, instances=1, **kw):
    """Hierarchical AllToAll: chunks for another node are gathered in a named
    scratch buffer on the peer GPU of that node and sent across in one step of
    `gpus` chunks (cnt > 1 that spans blocks of the output)."""
    n = nodes * gpus
    with GC3Program("two_step_alltoall", AllToAll(n, 1, inplace=False), instances=instances, **kw) as prog:
        for sn in range(nodes):
            for sg in range(gpus):
                src = sn * gpus + sg
                for dn in range(nodes):
                    for dg in range(gpus):
                        dst = dn * gpus + dg
                        c = chunk(src, "in", dst)
                        if sn == dn:
                            c.copy(dst, "out", src)
                        else:
                            # stage on (sn, dg) in buffer "x<dn>", slot sg
                            c.copy(sn * gpus + dg, f"x{dn}", sg)
        for sn in range(nodes):
            for dn in range(nodes):
                if sn == dn:
                    continue
                for g in range(gpus):
                    chunk(sn * gpus + g, f"x{dn}", 0, count=gpus).copy(dn * gpus + g, "out", sn * gpus)
        Check()
    return prog


def ring_allgather(n, chunk_factor=1, instances=1, inplace=False, **kw):
    with GC3Program("ring_allgather", AllGather(n, chunk_factor, inplace=inplace), instances=instances,
                    **kw) as prog:
        for r in range(n):
            c = chunk(r, "in", 0, count=chunk_factor)
            if not inplace:
                c = c.copy(r, "out", r * chunk_factor)
            for step in range(1, n):
                c = c.copy((r + step) % n, "out", r * chunk_factor)
        Check()
    return prog


def ring_reducescatter(n, instances=1, **kw):
    with GC3Program("ring_reducescatter", ReduceScatter(n, 1, inplace=True), instances=instances, **kw) as prog:
        for r in range(n):
            c = chunk((r + 1) % n, "in", r)
            for step in range(2, n + 1):
                c = chunk((r + step) % n, "in", r).reduce(c)
        Check()
    return prog


def chain_broadcast(n, root=0, chunks=2, instances=1, **kw):
    """A pipelined chain broadcast through scratch on the middle ranks."""
    with GC3Program("chain_broadcast", Broadcast(n, chunks, inplace=False, root=root), instances=instances,
                    **kw) as prog:
        order = [(root + k) % n for k in range(n)]
        for j in range(chunks):
            c = chunk(root, "in", j)
            c.copy(root, "out", j)
            for nxt in order[1:]:
                c = c.copy(nxt, "out", j)
        Check()
    return prog


def hierarchical_allreduce(nodes, gpus, instances=1, **kw):
    """GC3 paper Figure 3: intra-node reduce-scatter and all-gather under parallelize(nodes)."""
    N, G = nodes, gpus
    with GC3Program("hierarchical_allreduce", AllReduce(N * G, N * G, inplace=True), instances=instances,
                    **kw) as prog:
        def rank(node, g):
            return node * G + g
        with parallelize(N):
            for n in range(N):
                for g in range(G):
                    c = chunk(rank(n, (g + 1) % G), "in", g * N, count=N)
                    for step in range(1, G):
                        c = chunk(rank(n, (g + 1 + step) % G), "in", g * N, count=N).reduce(c)
        for g in range(G):
            for m in range(N):
                c = chunk(rank((m + 1) % N, g), "in", g * N + m)
                for step in range(1, N):
                    c = chunk(rank((m + 1 + step) % N, g), "in", g * N + m).reduce(c)
                for step in range(N - 1):
                    c = c.copy(rank((m + 1 + step) % N, g), "in", g * N + m)
        with parallelize(N):
            for n in range(N):
                for g in range(G):
                    c = chunk(rank(n, g), "in", g * N, count=N)
                    for step in range(G - 1):
                        c = c.copy(rank(n, (g + 1 + step) % G), "in", g * N)
        Check()
    return prog


def exchange(count, one_tb=False, **kw):
    """Two ranks swap `count` single-chunk messages: all sends are ready at once.
    With one_tb, each rank's sends and receives share threadblock 0."""
    tb = {"sendtb": 0, "recvtb": 0} if one_tb else {}
    with GC3Program("exchange", AllToAll(2, count, inplace=False), topology=fully_connected(2), **kw) as prog:
        for r in range(2):
            for j in range(count):
                chunk(r, "in", (1 - r) * count + j).copy(1 - r, "out", r * count + j, **tb)
                chunk(r, "in", r * count + j).copy(r, "out", r * count + j)
        Check()
    return prog
