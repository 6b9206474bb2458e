"""Every DSL misuse raises its own GC3Error naming this file, the line and the chunk."""
import sys

import pytest

from gc3 import Check, GC3Program, chunk, parallelize
from gc3.dsl.collectives import AllGather, AllReduce, Broadcast
from gc3.errors import (CountMismatchError, GC3Error, IndexOutOfRangeError, StaleReferenceError, TopologyError,
                        TraceError, UninitializedChunkError)
from gc3.dsl.topology import Topology, fully_connected, hierarchical, ring

HERE = "test_dsl_errors.py"


def next_line() -> int:
    """The line after the caller's: where the failing call is written."""
    return sys._getframe(1).f_lineno + 1


def assert_names(err, line, *fragments):
    text = str(err.value)
    assert f"{HERE}:{line}:" in text, text
    for f in fragments:
        assert f in text, text


def test_uninitialized_output_chunk():
    with GC3Program("t", AllReduce(2, 2, False)):
        with pytest.raises(UninitializedChunkError) as err:
            line = next_line()
            chunk(1, "out", 1)
    assert_names(err, line, "(rank 1, 'o', 1)", "no data")


def test_uninitialized_scratch_inside_a_multi_chunk_reference():
    with GC3Program("t", AllReduce(2, 2, False)):
        chunk(0, "in", 0).copy(1, "sc", 0)
        with pytest.raises(UninitializedChunkError) as err:
            line = next_line()
            chunk(1, "scratch", 0, count=2)
    assert_names(err, line, "(rank 1, 's', 1)")


def test_uninitialized_non_root_broadcast_input():
    with GC3Program("t", Broadcast(3, 1, False, root=2)):
        with pytest.raises(UninitializedChunkError) as err:
            line = next_line()
            chunk(0, "input", 0)
    assert_names(err, line, "(rank 0, 'i', 0)")


def test_stale_reference_after_copy_overwrites_its_slot():
    with GC3Program("t", AllReduce(3, 1, True)):
        made = next_line()
        old = chunk(1, "in", 0)
        wrote = next_line()
        chunk(0, "in", 0).copy(1, "in", 0)
        with pytest.raises(StaleReferenceError) as err:
            line = next_line()
            old.copy(2, "sc", 0)
    assert_names(err, line, "(rank 1, 'i', 0)", f"{HERE}:{made}", f"overwritten at ")
    assert f"{HERE}:{wrote}" in str(err.value)


def test_stale_reference_after_reduce_through_another_reference():
    with GC3Program("t", AllReduce(2, 2, True)):
        other = chunk(1, "in", 0, count=2)
        chunk(1, "in", 1).reduce(chunk(0, "in", 1))
        with pytest.raises(StaleReferenceError) as err:
            line = next_line()
            chunk(0, "in", 0, 2).reduce(other)
    assert_names(err, line, "(rank 1, 'i', 1)")


def test_reference_returned_by_reduce_stays_valid_and_split_parts_go_stale():
    with GC3Program("t", AllReduce(3, 2, True)) as prog:
        acc = chunk(0, "in", 0, 2)
        parts = acc.split(2)
        acc.reduce(chunk(1, "in", 0, 2))
        acc.reduce(chunk(2, "in", 0, 2))        # msccl-tools style: no reassignment needed
        assert len(prog.ops) == 2
        with pytest.raises(StaleReferenceError) as err:
            line = next_line()
            parts[1].copy(1, "sc", 0)
    assert_names(err, line, "(rank 0, 'i', 1)")


def test_index_out_of_range_input_and_output():
    with GC3Program("t", AllGather(2, 2, False)):
        with pytest.raises(IndexOutOfRangeError) as err:
            line = next_line()
            chunk(0, "in", 2)
        assert_names(err, line, "(rank 0, 'i', 2)", "2 chunks")
        with pytest.raises(IndexOutOfRangeError) as err:
            line = next_line()
            chunk(1, "in", 0, count=2).copy(0, "out", 3)
        assert_names(err, line, "(rank 0, 'o', 3:5)", "4 chunks")
        with pytest.raises(IndexOutOfRangeError) as err:
            line = next_line()
            chunk(0, "in", -1)
        assert_names(err, line, "index -1", "rank 0")
        with pytest.raises(IndexOutOfRangeError) as err:
            line = next_line()
            chunk(0, "in", 0).copy(2, "out", 0)
        assert_names(err, line, "rank 2 is outside [0, 2)")


def test_scratch_grows_on_demand():
    with GC3Program("t", AllReduce(2, 1, False)) as prog:
        chunk(0, "in", 0).copy(1, "sc", 40)
        chunk(0, "in", 0).copy(1, "mine", 3)
        chunk(0, "in", 0).copy(1, "mine")       # appends after index 3
    assert prog.scratch_sizes == {0: {}, 1: {"s": 41, "mine": 5}}
    assert [op.dst.buffer for op in prog.ops] == ["s", "mine", "mine"]


def test_count_mismatch_copy_reduce_split():
    with GC3Program("t", AllReduce(2, 4, False)):
        with pytest.raises(CountMismatchError) as err:
            line = next_line()
            chunk(0, "in", 0, 2).copy(1, "out", 0, count=3)
        assert_names(err, line, "count=3", "(rank 0, 'i', 0:2)")
        with pytest.raises(CountMismatchError) as err:
            line = next_line()
            chunk(1, "in", 0).reduce(chunk(0, "in", 0, count=2))
        assert_names(err, line, "(rank 0, 'i', 0:2)", "(rank 1, 'i', 0)")
        with pytest.raises(CountMismatchError) as err:
            line = next_line()
            chunk(0, "in", 0, count=4).split(3)
        assert_names(err, line, "(rank 0, 'i', 0:4)", "3")


def test_missing_link_in_custom_topologies():
    with GC3Program("t", AllReduce(4, 1, True), topology=ring(4)):
        chunk(0, "in", 0).copy(1, "sc", 0)               # neighbours are linked
        with pytest.raises(TopologyError) as err:
            line = next_line()
            chunk(0, "in", 0).copy(2, "sc", 0)
        assert_names(err, line, "no link from rank 0 to rank 2")
    one_way = Topology(3, links=[(0, 1), (1, 2)], name="chain")
    with GC3Program("t", AllReduce(3, 1, True), topology=one_way):
        with pytest.raises(TopologyError) as err:
            line = next_line()
            chunk(0, "in", 0).reduce(chunk(1, "in", 0))
        assert_names(err, line, "chain", "from rank 1 to rank 0")


def test_tuple_ranks_need_a_hierarchical_topology_and_valid_parts():
    with GC3Program("t", AllReduce(4, 1, True), topology=fully_connected(4)):
        with pytest.raises(TraceError) as err:
            chunk((0, 1), "in", 0)
        assert "not hierarchical" in str(err.value)
    with GC3Program("t", AllReduce(4, 1, True), topology=hierarchical(2, 2)):
        with pytest.raises(IndexOutOfRangeError) as err:
            chunk((0, 2), "in", 0)
        assert "local GPU 2" in str(err.value)
        with pytest.raises(IndexOutOfRangeError) as err:
            chunk((2, 0), "in", 0)
        assert "node 2" in str(err.value)


def test_overlapping_copy_and_bad_arguments():
    with GC3Program("t", AllReduce(2, 4, False)):
        with pytest.raises(TraceError) as err:
            line = next_line()
            chunk(0, "in", 0, 2).copy(0, "in", 1)
        assert_names(err, line, "overlap")
        with pytest.raises(TraceError) as err:
            chunk(0, "in", 0).copy(1, "out", 0, ch=-3)
        assert "ch must be" in str(err.value)
        with pytest.raises(TraceError):
            chunk(0, 7, 0)
        with pytest.raises(TraceError):
            chunk(0, "in", 0, count=0)
        with pytest.raises(TraceError):
            chunk(0, "in", 0).group(chunk(1, "in", 1))
        with pytest.raises(TraceError):
            chunk(0, "in", 0).group(chunk(0, "in", 2))


def test_program_context_misuse():
    with pytest.raises(TraceError) as err:
        line = next_line()
        chunk(0, "in", 0)
    assert_names(err, line, "outside")
    with pytest.raises(TraceError):
        Check()
    with GC3Program("outer", AllReduce(2, 1, True)) as prog:
        ref = chunk(0, "in", 0)
        with pytest.raises(TraceError) as err:
            with GC3Program("inner", AllReduce(2, 1, True)):
                pass
        assert "'outer'" in str(err.value)
        with parallelize(2):
            with pytest.raises(TraceError):
                with parallelize(2):
                    pass
        with pytest.raises(TraceError):
            with parallelize(0):
                pass
    with pytest.raises(TraceError) as err:
        ref.copy(1, "in", 0)
    assert "'outer'" in str(err.value) and "not being traced" in str(err.value)
    assert prog.ops == []


@pytest.mark.parametrize("kwargs, needle", [
    (dict(protocol="Fast"), "protocol 'Fast'"),
    (dict(instances=0), "instances"),
    (dict(topology=fully_connected(3)), "has 3 ranks"),
])
def test_program_arguments(kwargs, needle):
    with pytest.raises(TraceError) as err:
        GC3Program("t", AllReduce(2, 1, True), **kwargs)
    assert needle in str(err.value)


def test_all_errors_are_gc3_errors_and_nothing_is_recorded_on_failure():
    with GC3Program("t", AllReduce(2, 1, False), topology=Topology(2, links=[])) as prog:
        for bad in (lambda: chunk(0, "out", 0), lambda: chunk(0, "in", 5),
                    lambda: chunk(0, "in", 0).copy(1, "out", 0)):
            with pytest.raises(GC3Error):
                bad()
    assert prog.ops == [] and prog.scratch_sizes == {0: {}, 1: {}}


MISUSES = {
    "collective size": lambda: AllReduce(0, 1, True),
    "collective inplace": lambda: AllReduce(2, 1, "yes"),
    "root": lambda: Broadcast(2, 1, False, root=5),
    "topology ranks": lambda: Topology(0),
    "topology link": lambda: Topology(2, links=[(0, 2)]),
    "hierarchical": lambda: hierarchical(2, 0),
    "ring": lambda: ring(-1),
}


@pytest.mark.parametrize("name", sorted(MISUSES))
def test_misuse_outside_a_program_names_the_call_site(name):
    with pytest.raises(GC3Error) as err:
        MISUSES[name]()
    assert f"{HERE}:" in str(err.value)


def test_numpy_integers_are_accepted_and_bools_are_not():
    np = pytest.importorskip("numpy")
    with GC3Program("t", AllReduce(np.int64(2), np.int32(2), False)) as prog:
        chunk(np.int64(0), "in", np.int64(0), count=np.int64(2)).copy(np.int16(1), "sc", np.int64(0), ch=np.int64(1))
        with pytest.raises(TraceError) as err:
            chunk(True, "in", 0)
        assert "rank True" in str(err.value)
    assert prog.ops[0].ch == 1 and type(prog.ops[0].dst.rank) is int


def test_uninitialized_alias_names_both_spellings():
    with GC3Program("t", Broadcast(3, 2, True, root=0)):
        with pytest.raises(UninitializedChunkError) as err:
            line = next_line()
            chunk(2, "out", 0, count=2)
    assert_names(err, line, "(rank 2, 'i', 0) (the in-place alias of (2, 'o', 0))")
