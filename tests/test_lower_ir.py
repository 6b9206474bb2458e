"""What lowering emits: <algo>/<gpu> attributes, operand convention, XML."""
import gc3
from hypothesis import given, settings, strategies as st

from gc3 import GC3Program, chunk
from gc3.dsl.collectives import AllGather, AllReduce, AllToAll
from gc3.ir import Convention, Program, local_input, local_output
from gc3.compiler.pipeline import MAX_BYTES, lower
from gc3.ir.xml_io import _to_xml_lxml, from_xml, to_xml

from lower_programs import (allpairs_allreduce, hierarchical_allreduce, ring_allgather, ring_allreduce,
                            two_step_alltoall)


def test_algo_attributes_follow_program_and_overrides():
    prog = lower(ring_allreduce(4))
    assert (prog.name, prog.coll, prog.ngpus, prog.proto) == ("allreduce_ring", "allreduce", 4, "Simple")
    assert (prog.inplace, prog.outofplace, prog.redop) == (True, False, None)
    assert (prog.minBytes, prog.maxBytes) == (0, MAX_BYTES)
    assert prog.gc3version == gc3.__version__ and prog.convention == Convention.GC3
    assert prog.nchannels == 1
    over = lower(ring_allreduce(4, protocol="LL"), protocol="LL128", instances=3)
    assert over.proto == "LL128" and over.nchannels == 3


def test_sizes_are_declared_sizes_times_instances_not_indices_touched():
    # The program only ever touches chunk 0 of a 4-chunk allreduce buffer.
    with GC3Program("partial", AllReduce(2, 4, inplace=False)) as p:
        chunk(0, "in", 0).copy(1, "scratch", 2)
    for k in (1, 3):
        prog = lower(p, instances=k)
        for g in prog.gpus:
            assert (g.i_chunks, g.o_chunks) == (4 * k, 4 * k)
        assert prog.nchunksperloop == 4 * k
        assert prog.gpu(1).s_chunks == 3 * k and prog.gpu(0).s_chunks == 0


def test_allgather_and_alltoall_sizes_per_block():
    ag = lower(ring_allgather(3, chunk_factor=2), instances=2)
    assert [(g.i_chunks, g.o_chunks) for g in ag.gpus] == [(4, 12)] * 3 and ag.nchunksperloop == 12
    agi = lower(ring_allgather(3, inplace=True))
    assert [(g.i_chunks, g.o_chunks) for g in agi.gpus] == [(0, 3)] * 3 and agi.inplace
    a2a = lower(two_step_alltoall(2, 2), instances=2)
    assert {(g.i_chunks, g.o_chunks) for g in a2a.gpus} == {(8, 8)}


def test_named_scratch_buffers_are_laid_out_one_after_another_in_s():
    with GC3Program("named", AllReduce(2, 1, inplace=False)) as p:
        chunk(0, "in", 0).copy(1, "scratch", 0)      # "s": 1 chunk
        chunk(0, "in", 0).copy(1, "a", 0)             # "a": 2 chunks, after "s"
        chunk(0, "in", 0).copy(1, "a", 1)
        chunk(0, "in", 0).copy(1, "b", 0)             # "b": after "a"
    prog = lower(p, instr_fusion=False)
    g = prog.gpu(1)
    assert g.s_chunks == 4
    written = sorted(local_output(st_, prog.convention) for tb in g.threadblocks for st_ in tb.steps)
    assert written == [("s", 0), ("s", 1), ("s", 2), ("s", 3)]
    two = lower(p, instances=2)
    assert two.gpu(1).s_chunks == 8
    assert sorted(local_output(st_, two.convention) for tb in two.gpu(1).threadblocks for st_ in tb.steps) == [
        ("s", i) for i in range(8)]


def test_operands_are_local_in_gc3_convention():
    prog = lower(ring_allreduce(3), instr_fusion=False)
    for g in prog.gpus:
        for tb in g.threadblocks:
            for st_ in tb.steps:
                if st_.type == "s":
                    assert (st_.dstbuf, st_.dstoff) == (st_.srcbuf, st_.srcoff)   # s repeats src in dst
                if st_.type == "r":
                    assert (st_.srcbuf, st_.srcoff) == (st_.dstbuf, st_.dstoff)   # r repeats dst in src
                if st_.type == "rrc":
                    # chunk r of the ring is reduced into the same index on every rank
                    assert local_input(st_, prog.convention) == local_output(st_, prog.convention)
    # A remote reduce from rank 0's i[1] into rank 1's scratch: rrc's local operand is the scratch
    # (with absorption the copy into scratch goes, and the rrc reads i[0] and writes the scratch).
    with GC3Program("remote", AllToAll(2, 1, inplace=False)) as p:
        c = chunk(1, "in", 0).copy(1, "scratch", 0)
        c.reduce(chunk(0, "in", 1))
    for absorption, local in ((False, ("s", 0)), (True, ("i", 0))):
        prog = lower(p, absorption=absorption)
        (rrc,) = [s_ for tb in prog.gpu(1).threadblocks for s_ in tb.steps if s_.type == "rrc"]
        assert local_input(rrc, Convention.GC3) == local and local_output(rrc, Convention.GC3) == ("s", 0)
    (snd,) = [s_ for tb in prog.gpu(0).threadblocks for s_ in tb.steps if s_.type == "s"]
    assert local_input(snd, Convention.GC3) == ("i", 1)


def test_every_emitted_program_round_trips_through_xml():
    for p in (ring_allreduce(4), allpairs_allreduce(3), two_step_alltoall(2, 2), hierarchical_allreduce(2, 2)):
        for k in (1, 2):
            prog = lower(p, instances=k)
            text = to_xml(prog)
            assert text == _to_xml_lxml(prog)
            back = from_xml(text)
            assert back == prog and to_xml(back) == text


@settings(max_examples=40, deadline=None)
@given(name=st.text(min_size=1, max_size=12), coll=st.text(min_size=1, max_size=8),
       extra=st.dictionaries(st.sampled_from(["a", "b_c", "x-y"]), st.text(max_size=6), max_size=2))
def test_fast_xml_writer_matches_lxml_on_any_strings(name, coll, extra):
    prog = lower(ring_allreduce(3))
    prog.name, prog.coll, prog.extra = name, coll, extra
    try:
        expected = _to_xml_lxml(prog)
    except ValueError:          # lxml rejects control characters; so must we
        import pytest
        with pytest.raises(ValueError):
            to_xml(prog)
        return
    assert to_xml(prog) == expected


def test_fast_xml_writer_falls_back_for_unknown_keywords_and_empty_elements():
    prog = lower(ring_allreduce(3))
    prog.gpus[0].threadblocks[0].steps[0].type = 'x"<'
    prog.gpus[1].threadblocks = []
    prog.gpus[2].threadblocks[0].steps = []
    assert to_xml(prog) == _to_xml_lxml(prog)
    empty = Program(name="e", proto="LL", nchannels=1, nchunksperloop=1, ngpus=0, coll="allreduce", inplace=True)
    assert to_xml(empty) == _to_xml_lxml(empty)


def test_emitted_steps_read_the_same_under_msccl_convention():
    # Receive-reduce steps reduce into their own local operand, so an MSCCL
    # runtime (which reads rrc's operand from dst) executes our XML unchanged.
    for p in (ring_allreduce(4), allpairs_allreduce(3), hierarchical_allreduce(2, 2)):
        prog = lower(p, instances=2)
        for g in prog.gpus:
            for tb in g.threadblocks:
                for st_ in tb.steps:
                    if st_.type == "nop":
                        continue
                    assert local_input(st_, Convention.GC3) == local_input(st_, Convention.MSCCL)
                    assert local_output(st_, Convention.GC3) == local_output(st_, Convention.MSCCL)
