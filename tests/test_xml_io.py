from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from gc3.errors import IRFormatError
from gc3.ir import (STEP_TYPES, ComputeArgs, ComputeSpec, Convention, Gpu, Program, Step, Threadblock, local_input,
                    local_output)
from gc3.ir.opcodes import COMPUTE
from gc3.ir.xml_io import from_xml, read_xml, to_xml

MSCCL = sorted((Path(__file__).parent / "data" / "msccl").glob("*.xml"))


@pytest.mark.parametrize("path", MSCCL, ids=lambda p: p.name)
def test_msccl_samples_round_trip_byte_exact(path):
    prog = read_xml(path)
    assert prog.convention == Convention.MSCCL
    assert to_xml(prog) == path.read_text()


def test_ring_sample_structure():
    prog = read_xml(Path(__file__).parent / "data" / "msccl" / "allreduce_ring_4r_1i.xml")
    assert (prog.ngpus, prog.coll, prog.inplace, prog.proto) == (4, "allreduce", True, "Simple")
    ops = [s.type for s in prog.gpu(0).threadblocks[0].steps]
    assert ops == ["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]


def test_msccl_rrc_reads_its_destination_gc3_reads_its_source():
    st_ = Step(s=0, type="rrc", srcbuf="i", srcoff=3, dstbuf="s", dstoff=1)
    assert local_input(st_, Convention.MSCCL) == ("s", 1)
    assert local_input(st_, Convention.GC3) == ("i", 3)
    assert local_output(st_, Convention.GC3) == ("s", 1)
    assert local_input(Step(s=0, type="r", srcbuf="i", srcoff=0, dstbuf="o", dstoff=2), Convention.MSCCL) is None


@pytest.mark.parametrize("text, needle", [
    ("<algo", "not well-formed"),
    ('<algo name="x" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="1" coll="allreduce"/>', "'inplace'"),
    ('<algo name="x" proto="Fast" nchannels="1" nchunksperloop="1" ngpus="1" coll="allreduce" inplace="1"/>', "proto='Fast'"),
    ('<algo name="x" proto="LL" nchannels="one" nchunksperloop="1" ngpus="1" coll="allreduce" inplace="1"/>', "nchannels='one'"),
    ('<algo name="x" proto="LL" nchannels="1" nchunksperloop="1" ngpus="1" coll="allreduce" inplace="1">\n'
     '<gpu id="0" i_chunks="1" o_chunks="0" s_chunks="0">\n<tb id="0" send="-1" recv="-1" chan="0">\n'
     '<step s="0" type="jump" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1"/></tb></gpu></algo>', ":4: <step> attribute type='jump'"),
    ('<algo name="x" proto="LL" nchannels="1" nchunksperloop="1" ngpus="1" coll="allreduce" inplace="1">\n<tbx/></algo>',
     ":2: `<tbx>`: unknown element inside `<algo>`"),
])
def test_malformed_xml_names_element_attribute_and_line(text, needle):
    with pytest.raises(IRFormatError) as err:
        from_xml(text, source="bad.xml")
    assert needle in str(err.value)
    assert "bad.xml" in str(err.value)


_steps = st.builds(
    Step, s=st.just(0), type=st.sampled_from(STEP_TYPES), srcbuf=st.sampled_from("ios"),
    srcoff=st.integers(0, 99), dstbuf=st.sampled_from("ios"), dstoff=st.integers(0, 99),
    cnt=st.integers(1, 8), depid=st.integers(-1, 7), deps=st.integers(-1, 30), hasdep=st.booleans())


@st.composite
def _programs(draw):
    gpus = []
    for gid in range(draw(st.integers(1, 3))):
        tbs = []
        for tid in range(draw(st.integers(0, 3))):
            steps = draw(st.lists(_steps, max_size=5))
            for i, s in enumerate(steps):
                s.s = i
                if s.type in COMPUTE:   # a compute step carries its operands (and makes the IR fused)
                    a = draw(st.integers(0, 50))
                    s.compute = ComputeArgs(("x", "w"), a, a + draw(st.integers(1, 50)))
            tbs.append(Threadblock(id=tid, send=draw(st.integers(-1, 3)), recv=draw(st.integers(-1, 3)),
                                   chan=draw(st.integers(0, 3)), steps=steps))
        gpus.append(Gpu(id=gid, i_chunks=draw(st.integers(0, 9)), o_chunks=draw(st.integers(0, 9)),
                        s_chunks=draw(st.integers(0, 9)), threadblocks=tbs))
    return Program(name=draw(st.text("abc_", min_size=1, max_size=8)), proto=draw(st.sampled_from(["Simple", "LL", "LL128"])),
                   nchannels=draw(st.integers(1, 4)), nchunksperloop=draw(st.integers(1, 16)), ngpus=len(gpus),
                   coll=draw(st.sampled_from(["allreduce", "alltoall", "custom"])), inplace=draw(st.booleans()),
                   outofplace=draw(st.one_of(st.none(), st.booleans())),
                   minBytes=draw(st.one_of(st.none(), st.integers(0, 1 << 40))),
                   gc3version=draw(st.one_of(st.none(), st.just("0.1.0"))), gpus=gpus,
                   compute=ComputeSpec("gemv", "bfloat16", (("x", (2, 8)), ("w", (8, 100))))
                   if any(s.compute for g in gpus for tb in g.threadblocks for s in tb.steps) or draw(st.booleans())
                   else None)


@given(_programs())
def test_round_trip_property(prog):
    assert from_xml(to_xml(prog)) == prog
