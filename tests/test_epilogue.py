"""Elementwise epilogues and NCCL's avg: the IR, the semantic
checker and the simulator on the CPU; the avg division pass on the GPU."""
import copy
from pathlib import Path

import numpy as np
import pytest

from gc3.errors import IRFormatError, SemanticError
from gc3.ir.epilogue import EpilogueError, avg_divide, parse
from gc3.ir.xml_io import from_xml, to_xml
from gc3.simulator.driver import simulate
from gc3.simulator.reference import reference
from gc3.verify import verify

ROOT = Path(__file__).resolve().parent.parent
ALGO = ROOT / "gc3" / "algorithms" / "fused" / "allreduce_epilogue.py"


def compiled(*argv, fusion=True):
    from gc3 import lower
    from gc3.dsl.program import run_script
    return lower(run_script(ALGO, [str(a) for a in argv]), instr_fusion=fusion)


def marked(prog):
    return [(g.id, tb.id, st) for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.epilogue]


@pytest.mark.parametrize("argv", [(), (2, 1, 8, 0), (4, 1, 64, 1), (2, 2, 16, 0)])
def test_compiles_checks_and_simulates(argv):
    prog = compiled(*argv)
    assert prog.epilogue is not None and marked(prog)
    xml = to_xml(prog)
    assert 'fused="1"' in xml and "<epilogue" in xml
    back = from_xml(xml)
    assert to_xml(back) == xml
    assert verify(back).proven > 0
    res = simulate(xml, count=1000)
    assert res.ok, res.errors
    # the reference is the unfused operator, computed separately
    cast = (argv + (4, 2, 64, 1))[3] if len(argv) < 4 else argv[3]
    assert res.outputs[0].dtype == (np.dtype("float32") if not cast else res.expected[0].dtype)


def test_every_output_chunk_gets_it_once_in_the_ring():
    prog = compiled(4, 2, 64, 1)
    # ring: the last reduction and each of the N-1 all-gather receives store a final chunk
    assert len(marked(prog)) == 4 * 4


def _traced(*argv):
    from gc3.dsl.program import run_script
    return run_script(ALGO, [str(a) for a in argv])


def test_the_compiler_places_an_epilogue_only_with_the_placer_it_is_given():
    """The compiler sits below the verifier and cannot find the final stores by itself: without
    a placer it refuses rather than drop the epilogue; with one it hands over the plain program
    it produced, and wraps the placer's refusal as its own."""
    from gc3.compiler import pipeline
    from gc3.dsl.program import run_script
    from gc3.errors import LoweringError

    traced = _traced(4, 2, 64, 1)
    with pytest.raises(LoweringError, match="gc3.lower"):
        pipeline.lower(traced)
    seen = []
    prog = pipeline.lower(traced, place_epilogue=lambda p, e: seen.append((p, marked(p), e)))
    assert [(p is prog, m, e) for p, m, e in seen] == [(True, [], traced.collective.epilogue)]
    assert prog.epilogue is None

    def refuse(p, e):
        raise SemanticError("no final store")

    with pytest.raises(LoweringError, match="cannot place the epilogue .*no final store"):
        pipeline.lower(traced, place_epilogue=refuse)
    plain = run_script(ROOT / "gc3" / "algorithms" / "allreduce_ring.py", ["4"])
    assert plain.collective.epilogue is None
    assert pipeline.lower(plain, place_epilogue=refuse).epilogue is None


def test_gc3_lower_proves_the_plain_program_before_placing_the_epilogue(monkeypatch):
    import gc3
    from gc3 import toolchain
    from gc3.compiler import pipeline

    assert gc3.lower is toolchain.lower
    proven = []
    monkeypatch.setattr(toolchain, "verify", lambda p: proven.append((p.name, marked(p), verify(p).proven)))
    prog = compiled(4, 2, 64, 1)
    assert proven == [(prog.name, [], 4 * 4)] and len(marked(prog)) == 4 * 4
    same = pipeline.lower(_traced(4, 2, 64, 1), place_epilogue=toolchain.place_epilogue)
    assert to_xml(same) == to_xml(prog)


def _mutate(prog, how):
    prog = copy.deepcopy(prog)
    steps = [st for _, _, st in marked(prog)]
    if how == "scale":
        steps[0].epilogue = parse(steps[0].epilogue.text.replace("scale(0.25)", "scale(0.5)"), prog.epilogue.cols)
    elif how == "missing":
        steps[-1].epilogue = None
    elif how == "twice":
        # bias (and the rest) applied twice: a partial reduction into the output gets it as well
        for g in prog.gpus:
            for tb in g.threadblocks:
                for st in tb.steps:
                    if st.type == "re" and st.epilogue is None:
                        st.epilogue = prog.epilogue
    return prog


@pytest.mark.parametrize("how,argv", [("scale", (4, 2, 64, 1)), ("missing", (4, 2, 64, 1)), ("twice", (4, 1, 64, 0))])
def test_checker_and_simulator_reject_a_mutated_epilogue(how, argv):
    good = compiled(*argv, fusion=how != "twice")
    prog = _mutate(good, how)
    assert to_xml(prog) != to_xml(good)
    with pytest.raises(SemanticError, match="epilogue|scale"):
        verify(prog)
    res = simulate(to_xml(prog), count=4096)
    assert not res.ok and res.wrong


def test_parse_errors_name_the_item():
    with pytest.raises(EpilogueError, match="sqrt"):
        parse("scale(2),sqrt")
    with pytest.raises(EpilogueError, match="cast must be the last"):
        parse("cast(bf16),scale(2)")
    with pytest.raises(EpilogueError, match="cols"):
        parse("bias(b)")
    with pytest.raises(EpilogueError, match="argument"):
        parse("scale")
    assert parse("scale(0.5),bias(b),cast(bf16)", cols=4).text == "scale(0.5),bias(b),cast(bfloat16)"


def test_reader_wants_fused_with_an_epilogue():
    xml = to_xml(compiled(2, 1, 8, 0))
    with pytest.raises(IRFormatError, match="fused"):
        from_xml(xml.replace(' fused="1"', ""))
    with pytest.raises(IRFormatError, match="no <epilogue>"):
        from_xml(xml[:xml.index("  <epilogue")] + "</algo>\n")


@pytest.mark.parametrize("argv,fusion", [((2, 1, 8, 0), True), ((4, 1, 8, 0), False), ((4, 2, 16, 0), True)])
def test_runtime_flags_exactly_the_steps_that_carry_it(argv, fusion):
    """The interpreter applies the epilogue on the device rows of the IR's carrying steps and no
    others: a fused `re` run takes it from its last (final) step; nothing reduces into a row after."""
    from runtime_cuda.core import abi, tables
    prog = compiled(*argv, fusion=fusion)
    t = tables.build(prog)
    flag = abi.C["GC3_F_EPILOGUE"]
    for b, (r, tbid) in enumerate(t.blocks):
        tb = next(x for x in prog.gpu(r).threadblocks if x.id == tbid)
        start = int(t.tbs[b][abi.field("TB", "STEP_START")])
        for j, ds in enumerate(t.device_steps[b]):
            row = t.steps[start + j]
            want = tb.steps[ds.origs[-1]].epilogue is not None
            assert bool(row[abi.field("ST", "FLAGS")] & flag) == want, (r, tbid, ds.origs)
            assert not any(tb.steps[k].epilogue for k in ds.origs[:-1])
    assert sum(bool(row[abi.field("ST", "FLAGS")] & flag) for row in t.steps) == len(marked(prog))


def test_a_fused_re_run_takes_the_epilogue_of_its_last_step_and_ends_there():
    from gc3.ir.epilogue import make
    from runtime_cuda.core.tables import DeviceStep, _fuse_reduces
    epi = make([("scale", 2)])

    def re(k, e=None):
        return DeviceStep("re", 1, ("s", k), ("o", 0), [], {}, [k], epilogue=e)
    rows = _fuse_reduces([re(0), re(1), re(2, epi)], 0, set())
    assert [(r.origs, r.epilogue) for r in rows] == [([0, 1, 2], epi)]
    rows = _fuse_reduces([re(0, epi), re(1)], 0, set())
    assert [(r.origs, r.epilogue) for r in rows] == [([0], epi), ([1], None)]


def test_runtime_epilogue_words():
    from runtime_cuda.core import abi, tables
    prog = compiled(4, 2, 16, 0)          # scale(0.25),bias(bias),residual(residual)
    w = tables.epilogue_words(prog, 0x1000, 0x2008)
    C = abi.C
    assert w[C["GC3_EPW_BIAS"]] == 0x1000 and w[C["GC3_EPW_RESIDUAL"]] == 0x2008
    assert np.uint64(w[C["GC3_EPW_SCALE"]]).view(np.float64) == 0.25
    shape = w[C["GC3_EPW_SHAPE"]]
    assert shape & 0xFFFFFFFF == 16 and (shape >> 32) & 0xFFFF == 4
    assert shape >> 48 == C["GC3_EPI_SCALE"] | C["GC3_EPI_BIAS"] << 4 | C["GC3_EPI_RESIDUAL"] << 8


def test_runtime_refuses_what_the_interpreter_cannot_apply():
    from gc3.errors import IRStructureError, NotOnDeviceError
    from gc3.ir.epilogue import make
    from runtime_cuda.core import tables
    with pytest.raises(NotOnDeviceError, match=r"does not apply cast\(bfloat16\)"):
        tables.build(compiled(2, 1, 8, 1))
    prog = compiled(2, 2, 8, 0)
    odd = copy.deepcopy(prog)
    _, _, st = marked(odd)[0]
    st.epilogue = make([("scale", 0.5)])
    with pytest.raises(NotOnDeviceError, match=r"carries the epilogue scale\(0.5\), not the program's"):
        tables.build(odd)
    twice = copy.deepcopy(prog)
    twice.epilogue = make([("scale", 0.5), ("scale", 2)])
    for _, _, st in marked(twice):
        st.epilogue = twice.epilogue
    with pytest.raises(NotOnDeviceError, match="scale appears 2 times"):
        tables.build(twice)
    scratch = copy.deepcopy(compiled(2, 1, 8, 0, fusion=False))
    st = next(st for g in scratch.gpus for tb in g.threadblocks for st in tb.steps if st.dstbuf == "s")
    st.epilogue = scratch.epilogue
    with pytest.raises(IRStructureError, match=r"stores into s\[\d+\], which is not memory of the output"):
        tables.build(scratch)


# --- avg ---------------------------------------------------------------------------
def test_avg_divide_is_ncclavg_integer_rule():
    # NCCL FuncSumPostDiv: |x| / n with the sign restored: truncation toward zero, on the wrapped sum
    x = np.array([-7, 7, -1, 1, -(2 ** 31), 2 ** 31 - 1], dtype=np.int32)
    assert avg_divide(x, 2).tolist() == [-3, 3, 0, 0, -(2 ** 30), 2 ** 30 - 1]
    assert avg_divide(np.array([-9, 9], dtype=np.int64), 4).tolist() == [-2, 2]
    assert avg_divide(np.array([255, 7], dtype=np.uint8), 2).tolist() == [127, 3]
    assert avg_divide(np.array([-128, -7, 7, 127], dtype=np.int8), 2).tolist() == [-64, -3, 3, 63]
    assert avg_divide(np.array([-128, -7], dtype=np.int8), 8).tolist() == [-16, 0]
    assert avg_divide(np.array([2 ** 32 - 1, 5], dtype=np.uint32), 2).tolist() == [2 ** 31 - 1, 2]
    assert avg_divide(np.array([2 ** 64 - 1, 5], dtype=np.uint64), 3).tolist() == [(2 ** 64 - 1) // 3, 1]
    assert avg_divide(np.array([-6.0, 3.0], dtype=np.float32), 4).tolist() == [-1.5, 0.75]


def test_reference_avg_wraps_then_divides():
    a = np.array([2 ** 31 - 1, -5], dtype=np.int32)
    b = np.array([2, -2], dtype=np.int32)
    out = reference("allreduce", [a, b], "avg", 2)[0]
    wrapped = (a.astype(np.int64) + b).astype(np.int32)      # -2**31+1, -7
    assert out.tolist() == [int(np.trunc(wrapped[0] / 2)), -3]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "uint8", "int8", "uint32"])
def test_simulate_avg_on_a_sum_program(dtype):
    xml = (ROOT / "ir_samples" / "allreduce_ring_4r_inplace_Simple_i2.xml").read_text()
    res = simulate(xml, count=4096, dtype=dtype, op="avg")
    assert res.ok, res.errors
    # and a division that is not NCCL's (numpy floor on ints, no division on floats) is caught
    sums = simulate(xml, count=4096, dtype=dtype, op="sum")
    assert any((np.asarray(o) != np.asarray(e)).any() for o, e in zip(sums.outputs, res.expected))


# --- GPU ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "int64", "uint8", "int8", "uint32", "uint64"])
def test_gpu_avg_is_sum_then_ncclavg(nranks, dtype):
    """What the drop-in's gc3 backend runs for op avg: the sum program (virtual ranks),
    then runtime_cuda.core.avg.divide on the output; vs numpy: bit-exact."""
    import cupy
    from gc3.dtypes import dtype_info
    from gc3.ir.xml_io import read_xml
    from gc3.simulator.reference import make_inputs
    from runtime_cuda.core import avg
    from runtime_cuda.ranks.virtual import VirtualRanks

    path = ROOT / "ir_samples" / ("allreduce_ring_2r_inplace_Simple_i64.xml" if nranks == 2 else
                                  "allreduce_ring_4r_inplace_Simple_i2.xml")
    vr = VirtualRanks(read_xml(path))
    n_el = 3 * 4096 + 5
    xs = make_inputs("allreduce", nranks, n_el, dtype, seed=3, op="avg")
    if not dtype_info(dtype).is_float and dtype_info(dtype).signed:
        xs[0][:4] = [-7, 7, -1, 5]          # odd sums of both signs: truncation shows
        for x in xs[1:]:
            x[:4] = 0
    np_dt = dtype_info(dtype).np
    ins = [cupy.asarray(x.view(np.uint16) if dtype == "bfloat16" else x) for x in xs]
    outs = [cupy.zeros_like(a) for a in ins]
    vr(ins, outs, op="sum", dtype=dtype)
    cupy.cuda.runtime.deviceSynchronize()
    for o in outs:
        avg.divide(o.data.ptr, o.size, dtype, nranks, cupy.cuda.get_current_stream().ptr)
    cupy.cuda.runtime.deviceSynchronize()
    want = reference("allreduce", xs, "avg", nranks)
    for r, o in enumerate(outs):
        got = cupy.asnumpy(o)
        got = got.view(np_dt) if dtype == "bfloat16" else got
        assert np.array_equal(got.view(np.uint8), want[r].view(np.uint8)), (r, got[:8], want[r][:8])
