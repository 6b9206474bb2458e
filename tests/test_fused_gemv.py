"""Fused GEMV + AllReduce (CPU layers): DSL -> IR -> check -> simulate, and
the runtime's refusal.  Every test here fails if the compute leaf, the opcode row,
the XML extension or the simulator's gemv is taken away or changed."""
import numpy as np
import pytest

from gc3 import GC3Program, Check, chunk, gemv
from gc3.algorithms.fused.gemv_allreduce import gemv_allreduce
from gc3.collectives import AllReduce, GemvAllReduce
from gc3.compiler.pipeline import lower
from gc3.errors import (IRFormatError, IRStructureError, LoweringError, NotOnDeviceError, PostconditionError, SemanticError,
                        TraceError, UninitializedChunkError)
from gc3.ir.opcodes import COMPUTE, DEVICE_OPCODES, NOT_ON_DEVICE
from gc3.ir.xml_io import from_xml, to_xml
from gc3.simulator import simulate
from gc3.verify import verify

from fused_deps import happens_before


def _algo():
    return gemv_allreduce


@pytest.fixture(scope="module")
def twoshot():
    return lower(_algo()())


@pytest.mark.parametrize("variant", [1, 2])
@pytest.mark.parametrize("n,batch,chunks", [(2, 1, 2), (4, 3, 8), (3, 2, 6)])
def test_compiles_verifies_and_simulates(variant, n, batch, chunks):
    prog = lower(_algo()(n, batch, 64, 12 * chunks, chunks, variant))
    assert prog.fused and prog.compute.gemv_dims() == (batch, 64, 12 * chunks)
    assert verify(prog).proven == n * chunks
    res = simulate(from_xml(to_xml(prog)))
    assert res.ok, res.errors
    assert res.dtype == "bfloat16" and res.layout.in_elems == batch * 12 * chunks


def test_default_arguments_compile(twoshot):
    assert twoshot.ngpus == 4 and verify(twoshot).proven == 4 * 8


def test_xml_round_trip_and_root_marked_fused(twoshot):
    text = to_xml(twoshot)
    assert 'fused="1"' in text.splitlines()[0] and '<compute op="gemv" dtype="bfloat16">' in text
    back = from_xml(text)
    assert back == twoshot and to_xml(back) == text
    gemvs = [st for g in back.gpus for tb in g.threadblocks for st in tb.steps if st.type == "gemv"]
    assert len(gemvs) == 4 * 8 and {st.compute.inputs for st in gemvs} == {("x", "w")}


def test_fused_parts_come_together(twoshot):
    text = to_xml(twoshot)
    for broken in (text.replace(' fused="1"', ""), text.replace('fused="1"', 'fused="0"')):
        with pytest.raises(IRFormatError, match="fused"):
            from_xml(broken)
    with pytest.raises(IRFormatError, match="col0"):
        from_xml(text.replace('inputs="x,w" col0="0"', 'inputs="x,w"', 1))


def _mutated(prog, col_shift=0, block_shift=0):
    text = to_xml(prog)
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.type == "gemv")
    w = st.compute.col1 - st.compute.col0
    a = st.compute.col0 + col_shift + block_shift * w
    if a + w > prog.compute.gemv_dims()[2]:
        a = st.compute.col0 - col_shift - block_shift * w
    old = f'col0="{st.compute.col0}" col1="{st.compute.col1}"'
    assert old in text
    return from_xml(text.replace(old, f'col0="{a}" col1="{a + w}"', 1))


@pytest.mark.parametrize("col_shift,block_shift,match", [(1, 0, "not whole column blocks"),
                                                          (0, 1, "should hold gemv")])
def test_shifted_compute_step_is_wrong_in_check_and_simulate(twoshot, col_shift, block_shift, match):
    bad = _mutated(twoshot, col_shift, block_shift)
    with pytest.raises(SemanticError, match=match):
        verify(bad)
    res = simulate(bad)
    assert not res.ok and res.wrong > 0 and "unfused reference" in res.errors[0]


@pytest.mark.parametrize("compute_tbs", [0, 4])
def test_first_send_waits_for_its_own_chunk_only(twoshot, compute_tbs):
    """The fused property: some send's happens-before set (program order in its
    threadblock, depid waits, received messages) holds exactly one gemv, of the
    chunk it sends; and no rank's sends all wait for every gemv of the rank.  Also
    with the gemv steps on compute TBs of their own (the send then waits on one by depid)."""
    prog = twoshot if not compute_tbs else lower(_algo()(4, 1, 512, 2048, 8, 2, compute_tbs))
    steps, before = happens_before(prog)
    firsts = []
    for key, st in steps.items():
        if st.type == "s":
            gemvs = [p for p in before(key) if steps[p].type == "gemv"]
            firsts.append((len(gemvs), key, gemvs))
    n_gemv, key, gemvs = min(firsts)
    assert n_gemv == 1
    (only,) = gemvs
    assert only[0] == key[0] and steps[only].dstoff == steps[key].srcoff


def test_dsl_checks_fused_postcondition():
    n, c = 2, 2
    with pytest.raises(PostconditionError, match=r"gemv\(1,1\)"):
        with GC3Program("half", GemvAllReduce(n, c, k_shard=8, n_out=8)):
            for r in range(n):
                for j in range(c):
                    gemv(r, "out", j)
            chunk(0, "out", 0).reduce(chunk(1, "out", 0)).copy(1, "out", 0)
            Check()
    with pytest.raises(UninitializedChunkError):       # nothing is given: chunks exist once computed
        with GC3Program("nodata", GemvAllReduce(n, c, k_shard=8, n_out=8)):
            chunk(0, "out", 0)
    with pytest.raises(TraceError, match="fused collective"):
        with GC3Program("plain", AllReduce(n, c, inplace=True)):
            gemv(0, "out", 0)
    with pytest.raises(TraceError, match="multiple of chunk_factor"):
        GemvAllReduce(n, 3, n_out=8)


def test_fused_programs_refuse_replication():
    with pytest.raises(LoweringError, match="instances=1"):
        lower(_algo()(2, 1, 16, 32, 2, 2), instances=2)


def test_opcode_table_marks_gemv_as_a_device_compute_opcode():
    assert "gemv" in COMPUTE and "gemv" not in NOT_ON_DEVICE and "gemv" in DEVICE_OPCODES
    assert "nop" not in NOT_ON_DEVICE      # folded by the runtime, not refused


def test_runtime_tables_carry_the_compute_operands(twoshot):
    """Each gemv device step points at GC3_CMP_EXTRA_PAIRS extras rows: its column range, then
    (batch, K, N); a range outside the operator, or the wrong inputs, is refused naming the step."""
    tables = pytest.importorskip("runtime_cuda.core.tables")
    from runtime_cuda.core import abi
    t = tables.build(twoshot)
    batch, k, n = twoshot.compute.gemv_dims()
    pairs = abi.C["GC3_CMP_EXTRA_PAIRS"]
    rows = t.steps[t.steps[:, abi.field("ST", "OP")] == abi.OPCODE["gemv"]]
    assert len(rows) == 4 * 8 and not rows[:, abi.field("ST", "NEXTRA")].any()
    cols = set()
    for row in rows:
        ex = t.extras[row[abi.field("ST", "EXTRA_START")]:][:pairs].reshape(-1)
        assert list(ex[2:]) == [batch, k, n, 0, 0, 0] and ex[1] - ex[0] == n // 8
        cols.add((int(ex[0]), int(ex[1])))
    assert cols == {(j * n // 8, (j + 1) * n // 8) for j in range(8)}
    assert t.chunk_units == {n // 8} and t.uses_input      # in place: the compute writes the i/o buffer
    with pytest.raises(IRStructureError, match=r"gemv\): columns \[1793, 2049\) outside"):
        tables.build(_out_of_range(twoshot))


def _out_of_range(prog):
    text = to_xml(prog)
    n = prog.compute.gemv_dims()[2]
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps
              if st.type == "gemv" and st.compute.col1 == n)
    old = f'col0="{st.compute.col0}" col1="{st.compute.col1}"'
    return from_xml(text.replace(old, f'col0="{st.compute.col0 + 1}" col1="{st.compute.col1 + 1}"', 1))


def test_catalog_skips_a_fused_ir_with_a_reason(tmp_path, twoshot):
    catalog = pytest.importorskip("runtime_cuda.nccl.catalog")
    xml = tmp_path / "gemv_ar.xml"
    xml.write_text(to_xml(twoshot))
    index = tmp_path / "index.json"
    index.write_text('{"version": 1, "algorithms": [{"file": "gemv_ar.xml", "collective": "allreduce", '
                     '"ranks": 4}]}')
    cands, skipped = catalog.check_config(index, env={})
    assert not cands and len(skipped) == 1 and "fused IR (gemv + allreduce)" in skipped[0], skipped


def test_simulate_cli_runs_a_fused_ir_with_no_options(tmp_path, twoshot):
    from click.testing import CliRunner
    from gc3.cli import main

    xml = tmp_path / "f.xml"
    xml.write_text(to_xml(twoshot))
    res = CliRunner().invoke(main, ["simulate", str(xml)])
    assert res.exit_code == 0, res.output
    assert "bfloat16" in res.output and "OK" in res.output
    res = CliRunner().invoke(main, ["simulate", str(xml), "--size", "1MiB"])
    assert res.exit_code != 0 and "output holds" in res.output
    bad = tmp_path / "bad.xml"
    bad.write_text(to_xml(_mutated(twoshot, 1)))
    res = CliRunner().invoke(main, ["simulate", str(bad)])
    assert res.exit_code == 1 and "WRONG" in res.output
    res = CliRunner().invoke(main, ["check", str(bad)])
    assert res.exit_code == 1


def test_simulated_output_is_the_unfused_operator():
    prog = lower(_algo()(2, 2, 16, 8, 2, 1))
    res = simulate(prog, seed=3)
    from gc3.simulator.compute import make_compute_inputs
    ins = make_compute_inputs(prog.compute, 2, 3)
    y = sum(d["x"].astype(np.float64) @ d["w"].astype(np.float64) for d in ins)      # [2, 8]
    got = res.outputs[0].astype(np.float64).reshape(2, 2, 4).transpose(1, 0, 2).reshape(2, 8)
    assert np.allclose(got, y, rtol=2e-2, atol=1e-1)
