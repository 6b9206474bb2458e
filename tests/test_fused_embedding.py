"""Fused embedding-bag + AllToAll (CPU layers): DSL -> IR -> check ->
simulate, the runtime's refusal.  The same compute-step mechanism as gemv
(tests/test_fused_gemv.py), a second operator in its tables."""
import numpy as np
import pytest

from gc3 import Check, GC3Program, embedding_bag
from gc3.algorithms.fused.embedding_bag_alltoall import embedding_bag_alltoall
from gc3.collectives import EmbeddingBagAllToAll, GemvAllReduce
from gc3.compiler.pipeline import lower
from gc3.errors import IRStructureError, PostconditionError, SemanticError, TraceError
from gc3.ir.opcodes import COMPUTE, NOT_ON_DEVICE
from gc3.ir.xml_io import from_xml, to_xml
from gc3.simulator import simulate
from gc3.verify import verify


def _algo():
    return embedding_bag_alltoall


@pytest.fixture(scope="module")
def default():
    return lower(_algo()())


@pytest.mark.parametrize("bf16", [0, 1])
@pytest.mark.parametrize("n,tables,batch,chunks", [(2, 1, 2, 1), (3, 3, 4, 2), (4, 2, 6, 3)])
def test_compiles_verifies_and_simulates(n, tables, batch, chunks, bf16):
    prog = lower(_algo()(n, tables, 16, 8, batch, 3, chunks, bf16))
    assert prog.fused and prog.coll == "alltoall"
    assert prog.compute.ebag_dims() == (tables, 16, 8, n * batch * 3, n * batch)
    assert verify(prog).proven == n * n * chunks
    res = simulate(from_xml(to_xml(prog)))
    assert res.ok, res.errors
    assert res.dtype == ("bfloat16" if bf16 else "float32") and res.layout.in_elems == n * batch * tables * 8
    assert not res.warnings


def test_default_arguments_compile_and_round_trip(default):
    assert default.ngpus == 4 and verify(default).proven == 4 * 4 * 2
    text = to_xml(default)
    assert 'fused="1"' in text.splitlines()[0] and '<compute op="ebag" dtype="float32">' in text
    assert '<input name="offsets" shape="2,17" dtype="int32"/>' in text
    back = from_xml(text)
    assert back == default and to_xml(back) == text
    steps = [st for g in back.gpus for tb in g.threadblocks for st in tb.steps if st.type == "ebag"]
    assert len(steps) == 4 * 4 * 2 and {st.compute.inputs for st in steps} == {("tables", "indices", "offsets")}


def test_opcode_row_is_on_the_device():
    assert "ebag" in COMPUTE and "ebag" not in NOT_ON_DEVICE


def _shifted(prog, by):
    """The IR with one ebag step's sample range moved by `by` samples (kept inside the batch)."""
    text = to_xml(prog)
    total = prog.compute.ebag_dims()[4]
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps
              if st.type == "ebag" and st.compute.col1 + by <= total)
    old = f'col0="{st.compute.col0}" col1="{st.compute.col1}"'
    return from_xml(text.replace(old, f'col0="{st.compute.col0 + by}" col1="{st.compute.col1 + by}"', 1))


@pytest.mark.parametrize("by,match", [(1, "not whole sample blocks"), (2, r"should hold ebag")])
def test_shifted_batch_range_is_wrong_in_check_and_simulate(default, by, match):
    bad = _shifted(default, by)      # by 1 sample, and by one whole block (2 samples at the defaults)
    with pytest.raises(SemanticError, match=match):
        verify(bad)
    res = simulate(bad)
    assert not res.ok and res.wrong > 0 and "unfused reference" in res.errors[0]


def test_output_is_pool_then_alltoall_in_torchrec_layout():
    """Independent of gc3/simulator/compute.py: pool with a loop, then AllToAll by
    sample slice; the buffer is [N, b, T*dim] and TorchRec's view [b, N*T*dim]."""
    n, t, dim, b = 2, 2, 4, 4
    prog = lower(_algo()(n, t, 8, dim, b, 2, 2, 0))
    res = simulate(prog, seed=5)
    assert res.ok, res.errors
    from gc3.simulator.compute import make_compute_inputs
    ins = make_compute_inputs(prog.compute, n, 5)
    pooled = []
    for d in ins:
        out = np.zeros((n * b, t * dim))
        for s in range(n * b):
            for k in range(t):
                lo, hi = d["offsets"][k, s], d["offsets"][k, s + 1]
                out[s, k * dim:(k + 1) * dim] = d["tables"][k][d["indices"][k, lo:hi]].astype(np.float64).sum(0)
        pooled.append(out)
    for p in range(n):
        torchrec = np.concatenate([pooled[r][p * b:(p + 1) * b] for r in range(n)], axis=1)    # [b, N*T*dim]
        got = res.outputs[p].astype(np.float64).reshape(n, b, t * dim).transpose(1, 0, 2).reshape(b, -1)
        assert np.array_equal(got, torchrec)


def test_dsl_checks():
    n, c = 2, 1
    with pytest.raises(PostconditionError, match=r"ebag\(1,0\)"):
        with GC3Program("half", EmbeddingBagAllToAll(n, c, batch=2)):
            for r in range(n):
                embedding_bag(r, "out", r, rows=r)
            embedding_bag(0, "scratch", 1, rows=1).copy(1, "out", 0)
            Check()
    with pytest.raises(TraceError, match="EmbeddingBagAllToAll"):
        with GC3Program("plain", GemvAllReduce(n, 1, k_shard=8, n_out=8)):
            embedding_bag(0, "out", 0)
    with pytest.raises(TraceError, match="multiple of chunk_factor"):
        EmbeddingBagAllToAll(n, 3, batch=4)
    with pytest.raises(TraceError, match="outside"):
        with GC3Program("far", EmbeddingBagAllToAll(n, c, batch=2)):
            embedding_bag(0, "scratch", 0, rows=n)


def test_runtime_tables_carry_the_compute_operands(default):
    """ebag device steps point at their sample range and (T, rows, dim, nnz, B); the program never
    names buffer i (the runtime binds no input), and a step reading other inputs is refused."""
    tables = pytest.importorskip("runtime_cuda.core.tables")
    from runtime_cuda.core import abi
    t = tables.build(default)
    dims = list(default.compute.ebag_dims())
    rows = t.steps[t.steps[:, abi.field("ST", "OP")] == abi.OPCODE["ebag"]]
    assert len(rows) == 4 * 4 * 2
    for row in rows:
        ex = t.extras[row[abi.field("ST", "EXTRA_START")]:][:abi.C["GC3_CMP_EXTRA_PAIRS"]].reshape(-1)
        assert list(ex[2:7]) == dims and ex[1] - ex[0] == 2
    assert t.chunk_units == {2} and not t.uses_input
    bad = from_xml(to_xml(default).replace('inputs="tables,indices,offsets"', 'inputs="tables,offsets,indices"', 1))
    with pytest.raises(IRStructureError, match="ebag.*reads compute inputs tables,offsets,indices"):
        tables.build(bad)


def test_cli_simulate_and_check(tmp_path, default):
    from click.testing import CliRunner
    from gc3.cli import main

    xml = tmp_path / "e.xml"
    xml.write_text(to_xml(default))
    res = CliRunner().invoke(main, ["simulate", str(xml)])
    assert res.exit_code == 0 and "OK" in res.output, res.output
    bad = tmp_path / "bad.xml"
    bad.write_text(to_xml(_shifted(default, 1)))
    res = CliRunner().invoke(main, ["simulate", str(bad)])
    assert res.exit_code == 1 and "WRONG" in res.output
    assert CliRunner().invoke(main, ["check", str(bad)]).exit_code == 1
