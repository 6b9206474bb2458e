"""Lowering compiles a Chunk DAG, whoever built it: one built by hand, without
tracing, lowers to the same IR as the traced program it spells out, and a
wrong one is caught by verification, not by lowering."""
import pytest

from gc3 import lower, simulate
from gc3.dsl.chunk_dag import ChunkDAG
from gc3.dsl.collectives import AllGather, AllReduce
from gc3.dsl.ops import Slot
from gc3.errors import LoweringError, SemanticError
from gc3.ir.xml_io import to_xml
from gc3.verify import verify
from lower_programs import ring_allgather, ring_allreduce


def ring_allreduce_dag(n, instances=1, skip=None):
    """msccl-tools' ring (tests/lower_programs.py's ring_allreduce) as DAG nodes:
    chunk r is reduced from rank r around the ring, then copied on from the
    rank that finished it.  In place, so every slot is in "i".  `skip`: the
    (chunk, step) of a reduction to leave out."""
    dag = ChunkDAG("allreduce_ring", AllReduce(n, n, inplace=True), instances=instances)
    for r in range(n):
        at = r
        for step in range(1, n):
            nxt = (r + step) % n
            if (r, step) != skip:
                dag.add("reduce", Slot(at, "i", r), Slot(nxt, "i", r))
            at = nxt
        for step in range(n - 1):
            nxt = (r + step) % n
            dag.add("copy", Slot(at, "i", r), Slot(nxt, "i", r))
            at = nxt
    return dag


def ring_allgather_dag(n):
    """tests/lower_programs.py's out-of-place ring_allgather as DAG nodes."""
    dag = ChunkDAG("ring_allgather", AllGather(n, 1, inplace=False))
    for r in range(n):
        dag.add("copy", Slot(r, "i", 0), Slot(r, "o", r))
        for step in range(1, n):
            dag.add("copy", Slot((r + step - 1) % n, "o", r), Slot((r + step) % n, "o", r))
    return dag


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("instances, protocol", [(1, "Simple"), (2, "LL")])
def test_hand_built_ring_allreduce_lowers_verifies_simulates_and_equals_the_traced(n, instances, protocol):
    dag = ring_allreduce_dag(n, instances)
    assert [op.id for op in dag.ops] == list(range(len(dag.ops))) and len(dag.ops) == 2 * n * (n - 1)
    prog = lower(dag, protocol=protocol)
    verify(prog)
    res = simulate(prog, count=prog.nchunksperloop * 7)
    assert res.ok, res.errors[:3]
    assert to_xml(prog) == to_xml(lower(ring_allreduce(n, instances), protocol=protocol))


def test_hand_built_ring_allgather_equals_the_traced():
    prog = lower(ring_allgather_dag(3))
    verify(prog)
    assert simulate(prog, count=30).ok
    assert to_xml(prog) == to_xml(lower(ring_allgather(3)))


def test_hand_built_dag_has_the_traced_dags_dependency_edges():
    traced, hand = ring_allreduce(3).chunk_dag.graph, ring_allreduce_dag(3).graph
    assert set(hand.edges(data="kind")) == set(traced.edges(data="kind"))


def test_a_missing_reduction_is_rejected_by_verification():
    # Chunk 0 is never reduced into rank 1, so rank 0's input is missing from
    # it: the DAG lowers (lowering does not judge what a DAG computes), and
    # verification names the chunk and the missing term.
    prog = lower(ring_allreduce_dag(3, skip=(0, 1)))
    with pytest.raises(SemanticError, match=r"does not compute allreduce: .*chunk o\[0\].*missing in\(0,0\)"):
        verify(prog)


def test_ops_are_numbered_in_the_dags_order():
    from gc3.dsl.ops import Op

    dag = ChunkDAG("x", AllReduce(2, 2, inplace=True))
    with pytest.raises(LoweringError, match="op 3 added as node 0"):
        dag.append(Op(id=3, kind="copy", src=Slot(0, "i", 0), dst=Slot(1, "i", 0)))


def test_lower_refuses_what_is_not_a_chunk_dag():
    with pytest.raises(LoweringError, match="ChunkDAG or a traced GC3Program"):
        lower([1, 2])
