"""The Chunk DAG of a small program, edge by edge, worked out by hand."""
import networkx as nx

from gc3 import Check, GC3Program, chunk
from gc3.dsl.chunk_dag import depth, draw, op_nodes
from gc3.dsl.collectives import AllReduce


def two_rank_allreduce():
    with GC3Program("dag", AllReduce(2, 1, False)) as prog:
        chunk(0, "in", 0).copy(1, "sc", 0)                    # 0: r0.i0 -> r1.s0
        chunk(1, "in", 0).copy(1, "out", 0)                   # 1: r1.i0 -> r1.o0
        chunk(1, "out", 0).reduce(chunk(1, "sc", 0))          # 2: r1.o0 += r1.s0
        chunk(1, "out", 0).copy(0, "out", 0)                  # 3: r1.o0 -> r0.o0
        chunk(1, "in", 0).copy(1, "sc", 0)                    # 4: r1.i0 -> r1.s0 (reuses s0 after 2 read it)
        chunk(0, "in", 0).copy(0, "out", 0)                   # 5: r0.i0 -> r0.o0 (overwrites 3's result unread)
        chunk(0, "out", 0).reduce(chunk(1, "in", 0))          # 6: r0.o0 += r1.i0
        Check()
    return prog


def test_edges_and_kinds():
    dag = two_rank_allreduce().chunk_dag.graph
    i0, i1 = ("init", 0, "i", 0), ("init", 1, "i", 0)
    assert set(dag.edges(data="kind")) == {
        (i0, 0, "true"), (i1, 1, "true"),
        (1, 2, "true"), (0, 2, "true"),        # reduce reads its destination and its source
        (2, 3, "true"),
        (i1, 4, "true"), (2, 4, "war"),        # 4 overwrites the scratch chunk 2 read
        (i0, 5, "true"), (3, 5, "waw"),        # 5 overwrites what 3 wrote, nobody read it
        (5, 6, "true"), (i1, 6, "true"),
    }
    assert {n: k for n, k in dag.nodes(data="kind")} == {i0: "source", i1: "source", **{k: "op" for k in range(7)}}
    assert dag.nodes[4]["op"].dst.buffer == "s"
    assert op_nodes(dag) == list(range(7))
    assert depth(dag) == 5                     # 0/1 -> 2 -> 3 -> 5 -> 6


def test_dag_is_rebuilt_after_more_ops():
    with GC3Program("grow", AllReduce(2, 1, True)) as prog:
        chunk(0, "in", 0).reduce(chunk(1, "in", 0))
        assert prog.chunk_dag.graph.number_of_nodes() == 3
        chunk(0, "in", 0).copy(1, "in", 0)
        dag = prog.chunk_dag.graph
    assert set(dag.edges(data="kind")) == {
        (("init", 0, "i", 0), 0, "true"), (("init", 1, "i", 0), 0, "true"),
        (0, 1, "true")}                            # true (reads r0.i0) outranks war (overwrites r1.i0)
    assert nx.is_directed_acyclic_graph(dag)


def test_stronger_kind_wins_when_two_ops_are_linked_twice():
    with GC3Program("twice", AllReduce(2, 2, False)) as prog:
        chunk(0, "in", 0, 2).copy(0, "sc", 0)                   # 0 writes s0, s1
        chunk(0, "sc", 1).copy(0, "sc", 0)                      # 1 reads s1 (true) and overwrites s0 (waw)
        chunk(0, "sc", 0).copy(1, "sc", 0)                      # 2 reads s0
        chunk(0, "in", 0).copy(0, "sc", 0)                      # 3 overwrites s0 after 2 read it
    dag = prog.chunk_dag.graph
    assert dag.edges[0, 1]["kind"] == "true"
    assert dag.edges[2, 3]["kind"] == "war"
    assert not dag.has_edge(1, 3)     # 3's overwrite of s0 is already ordered after 1 through 2


def test_draw(tmp_path):
    path = tmp_path / "dag.svg"
    draw(two_rank_allreduce().chunk_dag, path)
    text = path.read_text()
    assert text.startswith("<?xml") and "<svg" in text
