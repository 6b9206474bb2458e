"""Postconditions of every collective, in place and out of place.

Each collective gets a small direct program that must pass Check(), and a
variant with one deliberate mistake whose PostconditionError must name the
first wrong output chunk and what it holds.
"""
import pytest

from gc3 import Check, GC3Program, chunk
from gc3.dsl.collectives import (AllGather, AllReduce, AllToAll, AllToNext, Broadcast, Collective, Reduce,
                             ReduceScatter, input_chunk)
from gc3.errors import PostconditionError, TraceError

N, C = 3, 2


def others(r):
    return [s for s in range(N) if s != r]


def allreduce(inplace, wrong):
    for r in range(N):
        for s in others(r):
            chunk(s, "in", 0, C).copy(r, "sc", s * C)
    for r in range(N):
        if not inplace:
            chunk(r, "in", 0, C).copy(r, "out", 0)
        for s in others(r):
            if wrong and (r, s) == (0, N - 1):
                continue
            chunk(r, "out", 0, C).reduce(chunk(r, "sc", s * C, C))


def allgather(inplace, wrong):
    for r in range(N):
        for s in range(N):
            if wrong and (r, s) == (1, 0):
                continue
            block = 1 if wrong and (r, s) == (2, 0) else r
            chunk(r, "in", 0, C).copy(s, "out", block * C)


def reducescatter(inplace, wrong):
    for r in range(N):
        for s in others(r):
            chunk(s, "in", r * C, C).copy(r, "sc", s * C)
    for r in range(N):
        if not inplace:
            chunk(r, "in", r * C, C).copy(r, "out", 0)
        for s in others(r):
            src = 0 if wrong and r == 1 else s
            chunk(r, "out", 0, C).reduce(chunk(r, "sc", src * C, C))


def alltoall(inplace, wrong):
    for r in range(N):
        for j in others(r):
            block = 2 if wrong and (r, j) == (0, 1) else j
            chunk(r, "in", block * C, C).copy(j, "sc", r * C)
    for j in range(N):
        if not inplace:
            chunk(j, "in", j * C, C).copy(j, "out", j * C)
        for r in others(j):
            chunk(j, "sc", r * C, C).copy(j, "out", r * C)


def broadcast(inplace, wrong, root=1):
    for s in range(N):
        if wrong and s == 2:
            continue
        chunk(root, "in", 0, C).copy(s, "out", 0)


def reduce_(inplace, wrong, root=2):
    if not inplace:
        chunk(root, "in", 0, C).copy(root, "out", 0)
    for s in others(root):
        src = 0 if wrong else s
        chunk(root, "out", 0, C).reduce(chunk(src, "in", 0, C))


def alltonext(inplace, wrong):
    # In place, rank r+1 must send its input on before rank r overwrites it: go backwards.
    order = range(N - 1) if wrong and inplace else reversed(range(N - 1))
    for r in order:
        if wrong and not inplace and r == 0:
            continue
        chunk(r, "in", 0, C).copy(r + 1, "out", 0)


CASES = {
    # collective, program, (first wrong chunk, what it should hold, what it holds) per in-place flag
    "allreduce": (lambda ip: AllReduce(N, C, ip), allreduce,
                  {False: ("(rank 0, 'o', 0)", "in(0,0)+in(1,0)+in(2,0)", "holds in(0,0)+in(1,0) [missing in(2,0)]"),
                   True: ("(rank 0, 'o', 0) (in place: stored at 'i' 0)", "in(0,0)+in(1,0)+in(2,0)",
                          "missing in(2,0)")}),
    "allgather": (lambda ip: AllGather(N, C, ip), allgather,
                  {False: ("(rank 0, 'o', 2)", "in(1,0)", "holds in(2,0)"),
                   True: ("(rank 0, 'o', 2)", "in(1,0)", "holds in(2,0)")}),
    "reducescatter": (lambda ip: ReduceScatter(N, C, ip), reducescatter,
                      {False: ("(rank 1, 'o', 0)", "in(0,2)+in(1,2)+in(2,2)", "missing in(2,2); extra in(0,2)"),
                       True: ("(rank 1, 'o', 0) (in place: stored at 'i' 2)", "in(0,2)+in(1,2)+in(2,2)",
                              "missing in(2,2); extra in(0,2)")}),
    "alltoall": (lambda ip: AllToAll(N, C, ip), alltoall,
                 {False: ("(rank 1, 'o', 0)", "in(0,2)", "holds in(0,4)"),
                  True: ("(rank 1, 'o', 0) (in place: stored at 'i' 0)", "in(0,2)", "holds in(0,4)")}),
    "broadcast": (lambda ip: Broadcast(N, C, ip, root=1), broadcast,
                  {False: ("(rank 2, 'o', 0)", "in(1,0)", "holds uninitialized"),
                   True: ("(rank 2, 'o', 0) (in place: stored at 'i' 0)", "in(1,0)", "holds uninitialized")}),
    "reduce": (lambda ip: Reduce(N, C, ip, root=2), reduce_,
               {False: ("(rank 2, 'o', 0)", "in(0,0)+in(1,0)+in(2,0)", "extra in(0,0)"),
                True: ("(rank 2, 'o', 0) (in place: stored at 'i' 0)", "in(0,0)+in(1,0)+in(2,0)", "missing in(1,0)")}),
    "alltonext": (lambda ip: AllToNext(N, C, ip), alltonext,
                  {False: ("(rank 1, 'o', 0)", "in(0,0)", "holds uninitialized"),
                   True: ("(rank 2, 'o', 0) (in place: stored at 'i' 0)", "in(1,0)", "holds in(0,0)")}),
}


@pytest.mark.parametrize("inplace", [False, True], ids=["outofplace", "inplace"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_correct_program_passes_check(name, inplace):
    make, program, _ = CASES[name]
    coll = make(inplace)
    assert coll.name == name and coll.inplace is inplace
    with GC3Program(name, coll) as prog:
        program(inplace, wrong=False)
        assert Check() is True
    # every op touches canonical buffers only: an in-place program never names its aliased buffer
    aliased = {"o"} if name != "allgather" else {"i"}
    used = {s.buffer for op in prog.ops for s in (op.src, op.dst)}
    if inplace:
        assert not used & aliased, used


@pytest.mark.parametrize("inplace", [False, True], ids=["outofplace", "inplace"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_wrong_program_fails_check_at_first_wrong_chunk(name, inplace):
    make, program, expected = CASES[name]
    where, should, holds = expected[inplace]
    with GC3Program(name, make(inplace)) as prog:
        program(inplace, wrong=True)
        with pytest.raises(PostconditionError) as err:
            Check()
    text = str(err.value)
    assert f"output chunk {where} should hold {should} " in text, text
    assert holds in text, text
    with pytest.raises(PostconditionError):
        prog.check()          # also callable after the block, as `gc3 trace` does


@pytest.mark.parametrize("coll, sizes", [
    (AllReduce(4, 2, False), (2, 2, 2, 2)), (AllReduce(4, 2, True), (2, 2, 2, 0)),
    (AllGather(4, 2, False), (2, 8, 2, 8)), (AllGather(4, 2, True), (2, 8, 0, 8)),
    (ReduceScatter(4, 2, False), (8, 2, 8, 2)), (ReduceScatter(4, 2, True), (8, 2, 8, 0)),
    (AllToAll(4, 2, False), (8, 8, 8, 8)), (AllToAll(4, 2, True), (8, 8, 8, 0)),
    (Broadcast(4, 2, True, root=3), (2, 2, 2, 0)), (Reduce(4, 2, False, root=1), (2, 2, 2, 2)),
    (AllToNext(4, 2, False), (2, 2, 2, 2)),
])
def test_sizes_follow_the_layout_blocks(coll, sizes):
    assert (coll.input_size(1), coll.output_size(1), coll.input_chunks(1), coll.output_chunks(1)) == sizes


def test_inplace_aliases():
    assert AllGather(4, 2, True).alias(3, "i", 1) == ("o", 7)
    assert ReduceScatter(4, 2, True).alias(3, "o", 1) == ("i", 7)
    assert AllToAll(4, 2, True).alias(3, "o", 5) == ("i", 5)
    assert AllReduce(4, 2, False).alias(3, "o", 1) == ("o", 1)


def test_inplace_allgather_input_lives_in_the_output_buffer():
    with GC3Program("t", AllGather(3, 1, True)) as prog:
        ref = chunk(2, "in", 0)
        assert (ref.buffer, ref.index) == ("o", 2)
        assert ref.copy(2, "out", 2) == ref          # a copy onto its own alias is a no-op
        assert prog.ops == []


def test_custom_collective():
    class RootToAll(Collective):
        """Rank 0's chunks end up in every other rank's output."""

        def precondition(self, rank, index):
            return rank == 0

        def postcondition(self, rank, index):
            return None if rank == 0 else input_chunk(0, index)

    coll = RootToAll(3, 1, False, name="roottoall")
    assert coll.name == "roottoall"
    with GC3Program("custom", coll):
        c = chunk(0, "in", 0).copy(1, "out", 0, sendtb=1, recvtb=1, ch=0)
        c.copy(2, "out", 0)
        Check()
    with GC3Program("custom", coll):
        chunk(0, "in", 0).copy(1, "out", 0)
        with pytest.raises(PostconditionError) as err:
            Check()
    assert "(rank 2, 'o', 0)" in str(err.value)


def test_collective_without_postcondition_and_bad_parameters():
    with GC3Program("t", Collective(2, 1, False)):
        with pytest.raises(TraceError) as err:
            Check()
    assert "no postcondition" in str(err.value)
    for bad in (lambda: AllReduce(0, 1, True), lambda: AllReduce(2, 0, True), lambda: AllReduce(2, 1, "yes"),
                lambda: Broadcast(2, 1, False, root=2), lambda: Reduce(2, 1, False, root=-1)):
        with pytest.raises(TraceError):
            bad()
