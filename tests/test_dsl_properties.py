"""Property tests: random programs either trace and check, or fail with a precise GC3Error."""
import random

import networkx as nx
from hypothesis import HealthCheck, given, settings, strategies as st

from gc3 import Check, GC3Program, chunk
from gc3.dsl.collectives import AllGather, AllReduce, AllToAll, AllToNext, Broadcast, Reduce, ReduceScatter
from gc3.errors import GC3Error, UninitializedChunkError
from gc3.dsl.topology import Topology, fully_connected, ring

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ring_allgather_ops(n):
    """(src rank, dst rank, block) of a ring AllGather; src == dst is the local input -> output copy."""
    ops = [(b, b, b) for b in range(n)]
    ops += [((b + s - 1) % n, (b + s) % n, b) for b in range(n) for s in range(1, n)]
    return ops


@SETTINGS
@given(st.integers(2, 5).flatmap(lambda n: st.permutations(ring_allgather_ops(n))))
def test_permuted_ring_allgather_passes_or_names_the_first_missing_chunk(ops):
    n = max(dst for _, dst, _ in ops) + 1
    present = set()                           # (rank, block) of the output that holds data
    expected_failure = None
    for k, (src, dst, b) in enumerate(ops):
        if src != dst and (src, b) not in present:
            expected_failure = (k, src, b)
            break
        present.add((dst, b))
    with GC3Program("perm", AllGather(n, 1, False)) as prog:
        try:
            for src, dst, b in ops:
                if src == dst:
                    chunk(src, "in", 0).copy(dst, "out", b)
                else:
                    chunk(src, "out", b).copy(dst, "out", b)
            Check()
            failure = None
        except UninitializedChunkError as err:
            failure = (len(prog.ops), err)
    if expected_failure is None:
        assert failure is None
        assert len(prog.ops) == len(ops)
    else:
        k, src, b = expected_failure
        assert failure is not None and failure[0] == k
        text = str(failure[1])
        assert f"(rank {src}, 'o', {b})" in text and "test_dsl_properties.py:" in text


@SETTINGS
@given(st.integers(2, 5), st.integers(1, 3), st.randoms(use_true_random=False))
def test_any_order_of_direct_alltoall_copies_passes(n, cf, rnd):
    pairs = [(r, j) for r in range(n) for j in range(n)]
    rnd.shuffle(pairs)
    with GC3Program("a2a", AllToAll(n, cf, False)) as prog:
        for r, j in pairs:
            chunk(r, "in", j * cf, cf).copy(j, "out", r * cf)
        assert Check()
    # one true edge per copied chunk from its source node, no false dependencies
    assert sorted(k for _, _, k in prog.chunk_dag.graph.edges(data="kind")) == ["true"] * (n * n * cf)


COLLECTIVES = [
    lambda ip: AllReduce(3, 2, ip), lambda ip: AllGather(3, 1, ip), lambda ip: ReduceScatter(3, 1, ip),
    lambda ip: AllToAll(3, 1, ip), lambda ip: Broadcast(3, 2, ip, root=1), lambda ip: Reduce(3, 2, ip, root=0),
    lambda ip: AllToNext(3, 2, ip),
]
TOPOLOGIES = [fully_connected(3), ring(3, bidirectional=False), Topology(3, links=[(0, 1), (1, 2), (2, 0), (0, 2)])]
BUFFERS = ["in", "out", "sc", "x", "i", "o"]
anything = st.tuples(st.integers(-1, 3), st.sampled_from(BUFFERS), st.integers(-1, 6))


def draw_slot(data, prog):
    """Mostly a chunk that holds data (so programs get long), sometimes any (rank, buffer, index)."""
    held = sorted(prog.snapshot())
    if held and data.draw(st.integers(0, 4)):
        return data.draw(st.sampled_from(held))
    return data.draw(anything)


def run_actions(data, prog, steps):
    """Apply random DSL calls; those raising a GC3Error are skipped, any other exception escapes."""
    for _ in range(steps):
        kind = data.draw(st.sampled_from(["copy", "copy", "reduce", "reduce", "split", "group"]))
        r, buf, idx = draw_slot(data, prog)
        cnt = data.draw(st.integers(1, 3))
        r2, buf2, idx2 = data.draw(st.one_of(st.just(None), st.tuples(st.integers(-1, 3),
                                                                       st.sampled_from(BUFFERS + [None]),
                                                                       st.one_of(st.none(), st.integers(-1, 6)))))\
            or draw_slot(data, prog)
        try:
            src = chunk(r, buf, idx, cnt)
            if kind == "copy":
                src.copy(r2, buf2, idx2)
            elif kind == "reduce":
                chunk(r2, buf2 or buf, idx2 if idx2 is not None else idx, cnt).reduce(src)
            elif kind == "split":
                src.split(cnt)[-1].copy(r2, buf2, idx2)
            else:
                src.group(chunk(r, buf, idx + cnt, 1)).copy(r2, "sc", idx2)
        except GC3Error:
            pass


@SETTINGS
@given(st.sampled_from(range(len(COLLECTIVES))), st.booleans(), st.sampled_from(range(len(TOPOLOGIES))),
       st.integers(0, 30), st.data(), st.randoms(use_true_random=False))
def test_random_programs_raise_only_gc3_errors_and_their_dag_orders_every_conflict(ci, inplace, ti, steps, data,
                                                                                   rnd):
    coll = COLLECTIVES[ci](inplace)
    topo = TOPOLOGIES[ti]
    with GC3Program("rand", coll, topology=topo) as prog:
        run_actions(data, prog, steps)
        try:
            Check()
        except GC3Error:
            pass
    final = prog.snapshot()

    dag = prog.chunk_dag.graph
    assert nx.is_directed_acyclic_graph(dag)
    for a, b in dag.edges:
        assert isinstance(b, int) and (not isinstance(a, int) or a < b)
    for op in prog.ops:
        assert topo.link(op.src.rank, op.dst.rank) and op.src.count == op.dst.count

    # Any order the DAG allows computes the same values: its edges capture every dependency.
    order = random_topological_order(dag, rnd)
    with GC3Program("replay", coll, topology=topo) as again:
        for i in order:
            op = prog.ops[i]
            src = chunk(op.src.rank, op.src.buffer, op.src.index, op.src.count)
            if op.kind == "copy":
                src.copy(op.dst.rank, op.dst.buffer, op.dst.index)
            else:
                chunk(op.dst.rank, op.dst.buffer, op.dst.index, op.dst.count).reduce(src)
    assert again.snapshot() == final


def random_topological_order(dag, rnd: random.Random):
    indeg = {n: dag.in_degree(n) for n in dag}
    ready = [n for n, d in indeg.items() if d == 0]
    order = []
    while ready:
        n = ready.pop(rnd.randrange(len(ready)))
        if isinstance(n, int):
            order.append(n)
        for m in dag.successors(n):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return order
