"""Fused GEMM + ReduceScatter / AllReduce / AllToAll and AllGather + GEMM (CPU layers): DSL -> IR ->
check -> simulate, the fused (not compute-then-send) dependency structure, the cost
model's compute term and overlap, the chunk-count chooser, and the runtime's refusal."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gc3 import Check, GC3Program, algorithms, chunk, gemm
from gc3.collectives import GemmAllToAll, GemmReduceScatter
from gc3.compiler.pipeline import lower
from gc3.errors import NotOnDeviceError, PostconditionError, SemanticError, TraceError
from gc3.ir.opcodes import COMPUTE, DEVICE_OPCODES, NOT_ON_DEVICE
from gc3.ir.xml_io import from_xml, to_xml
from gc3.simulator import simulate
from gc3.simulator.chunking import choose_gemm_chunks
from gc3.simulator.cost_config import preset
from gc3.simulator.cost_model import gemm_seconds
from gc3.verify import verify

from fused_deps import happens_before

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("gemm_reducescatter", "allgather_gemm", "gemm_allreduce", "gemm_alltoall")
GEMMS = ("gemm", "agemm")


def _algo(name):
    return algorithms.builder(f"fused.{name}")


@pytest.fixture(scope="module", params=PROGRAMS)
def default(request):
    return request.param, lower(_algo(request.param)())


def test_default_arguments_compile_check_and_simulate(default):
    name, prog = default
    assert prog.fused and prog.compute.op in GEMMS and prog.compute.gemm_dims() == (64, 32, 32)
    assert verify(prog).proven > 0
    text = to_xml(prog)
    assert from_xml(text) == prog
    res = simulate(from_xml(text))
    assert res.ok, res.errors
    assert (ROOT / "ir_samples" / f"{name}.xml").read_text() == text


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("n,m,k,cols,chunks", [(2, 16, 8, 8, 1), (2, 32, 16, 24, 4), (4, 32, 24, 8, 2),
                                               (8, 64, 8, 16, 2), (8, 16, 8, 8, 1)])
def test_sizes_and_rank_counts(name, n, m, k, cols, chunks):
    prog = lower(_algo(name)(n, m, k, cols, chunks))
    assert prog.ngpus == n and prog.compute.gemm_dims() == (m, k, cols)
    verify(prog)
    res = simulate(prog, seed=n + chunks)
    assert res.ok, res.errors


def test_reductions_carry_fp32_partials_as_the_ir_states():
    """accum="float32" in <compute>: float32 buffers, and the output is the exact sum (the
    test data makes fp32 sums exact); fp32=0 rounds per hop in bf16, which differs from the
    exact sum by more than the fp32 bound, so the fp32 check can tell the two apart."""
    from gc3.simulator.compute import make_compute_inputs
    for name in ("gemm_reducescatter", "gemm_allreduce"):
        prog = lower(_algo(name)(4, 32, 64, 16, 2, 1))
        assert prog.compute.accum == "float32" and 'accum="float32"' in to_xml(prog)
        res = simulate(prog, seed=1)
        assert res.ok and res.dtype == "float32", res.errors
        ins = make_compute_inputs(prog.compute, 4, 1)
        exact = sum(d["a"].astype(np.float64) @ d["b"].astype(np.float64) for d in ins)
        rows = 32 // 4 if name == "gemm_reducescatter" else 32
        np.testing.assert_array_equal(res.outputs[0].astype(np.float64), exact[:rows].reshape(-1))
        per_hop = lower(_algo(name)(4, 32, 64, 16, 2, 0))
        assert per_hop.compute.accum == "" and "accum" not in to_xml(per_hop)
        res = simulate(per_hop, seed=1)
        assert res.ok and res.dtype == "bfloat16", res.errors
        err = np.abs(res.outputs[0].astype(np.float64) - exact[:rows].reshape(-1))
        assert err.max() > 1e-5 * np.abs(exact).max()     # per-hop rounding shows


def test_simulated_output_is_the_unfused_gemm_then_collective():
    prog = lower(_algo("gemm_reducescatter")(2, 8, 16, 4, 2))
    res = simulate(prog, seed=5)
    from gc3.simulator.compute import make_compute_inputs
    ins = make_compute_inputs(prog.compute, 2, 5)
    total = sum(d["a"].astype(np.float64) @ d["b"].astype(np.float64) for d in ins)
    for r in range(2):
        np.testing.assert_array_equal(res.outputs[r].astype(np.float64), total[4 * r:4 * (r + 1)].reshape(-1))
    prog = lower(_algo("gemm_alltoall")(2, 8, 16, 4, 2))
    res = simulate(prog, seed=5)
    ins = make_compute_inputs(prog.compute, 2, 5)
    import ml_dtypes
    c = [(d["a"].astype(np.float32) @ d["b"].astype(np.float32)).astype(ml_dtypes.bfloat16) for d in ins]
    for p in range(2):
        want = np.concatenate([c[r][4 * p:4 * (p + 1)].reshape(-1) for r in range(2)])
        np.testing.assert_array_equal(res.outputs[p], want)


def _mutated(prog, row_shift=0, block_shift=0):
    text = to_xml(prog)
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.type in GEMMS)
    w = st.compute.col1 - st.compute.col0
    a = st.compute.col0 + row_shift + block_shift * w
    if a + w > prog.compute.gemm_dims()[0]:
        a = st.compute.col0 - row_shift - block_shift * w
    old = f'col0="{st.compute.col0}" col1="{st.compute.col1}"'
    assert old in text
    return from_xml(text.replace(old, f'col0="{a}" col1="{a + w}"', 1))


@pytest.mark.parametrize("row_shift,block_shift,match", [(1, 0, "not whole row blocks"), (0, 1, "should hold gemm")])
def test_shifted_or_wrong_block_is_rejected_by_check_and_simulate(default, row_shift, block_shift, match):
    name, prog = default
    bad = _mutated(prog, row_shift, block_shift)
    with pytest.raises(SemanticError, match=match if name != "allgather_gemm" else "says rows"):
        verify(bad)
    res = simulate(bad)
    assert not res.ok
    if name != "allgather_gemm":
        assert res.wrong > 0 and "unfused reference" in res.errors[0]
    else:       # the rows it names are not the output chunk's it writes
        assert any("writes rows" in e for e in res.errors), res.errors


def test_allgather_gemm_of_the_wrong_chunk_is_rejected():
    """An agemm step that multiplies another block than the rows it names (here the rank's own
    first block instead of the one that arrived): the proof names the block it holds, and the
    simulator, computing from the data, finds the output wrong."""
    prog = lower(_algo("allgather_gemm")(4, 32, 16, 8, 2))
    text = to_xml(prog)
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps
              if st.type == "agemm" and st.srcbuf == "s")
    old = f'type="agemm" srcbuf="s" srcoff="{st.srcoff}" dstbuf="o" dstoff="{st.dstoff}"'
    assert old in text
    bad = from_xml(text.replace(old, f'type="agemm" srcbuf="i" srcoff="0" dstbuf="o" dstoff="{st.dstoff}"', 1))
    with pytest.raises(SemanticError, match="says rows .* holds A block 0"):
        verify(bad)
    res = simulate(bad)
    assert not res.ok and res.wrong > 0 and "unfused reference" in res.errors[0]


def test_allgather_gemm_output_and_padding():
    """C_r = concat(A) @ b_r, bit-exact, in the agemm chunk grid (K != N both ways)."""
    import ml_dtypes
    from gc3.simulator.compute import make_compute_inputs
    for k, cols in ((16, 8), (8, 24)):
        prog = lower(_algo("allgather_gemm")(2, 8, k, cols, 2))
        res = simulate(prog, seed=4)
        assert res.ok, res.errors
        ins = make_compute_inputs(prog.compute, 2, 4)
        a = np.concatenate([ins[0]["a"][:4], ins[1]["a"][4:]])
        lanes = 2 * max(k, cols)                      # R = 8 / (2*2) = 2 rows a chunk
        for r in range(2):
            want = (a.astype(np.float32) @ ins[r]["b"].astype(np.float32)).astype(ml_dtypes.bfloat16)
            got = res.outputs[r].reshape(4, lanes)[:, :2 * cols].reshape(8, cols)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("return_a", [0, 1])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_allgather_gemm_waits_for_its_own_chunk_only(n, return_a):
    """The GEMM of an arrived block waits for that block's receive (and, FIFO, earlier ones of
    the same connection) only, never for another peer's; no send waits for any GEMM (with
    return_a as well: its blocks arrive into the output's gathered A, not scratch)."""
    prog = lower(_algo("allgather_gemm")(n, 8 * n, 8, 8, 4, return_a))
    steps, before = happens_before(prog)
    tbs = {(g.id, tb.id): tb for g in prog.gpus for tb in g.threadblocks}
    checked = 0
    for key, st in steps.items():
        if st.type == "s":
            assert not [p for p in before(key) if steps[p].type == "agemm"]
        if st.type != "agemm" or st.srcbuf == "i":
            continue
        recvs = [p for p in before(key) if steps[p].info.recv and p[0] == key[0]]
        writer = [p for p in recvs if (steps[p].dstbuf, steps[p].dstoff) == (st.srcbuf, st.srcoff)]
        assert len(writer) == 1, (key, recvs)
        peer = tbs[writer[0][:2]].recv
        assert {tbs[p[:2]].recv for p in recvs} == {peer}, (key, recvs)
        checked += 1
    assert checked == n * (n - 1) * 4


@pytest.mark.parametrize("n,m,k,cols,chunks", [(2, 8, 16, 8, 2), (2, 8, 8, 24, 2), (4, 64, 32, 32, 2),
                                               (3, 12, 8, 8, 1), (8, 64, 8, 16, 2)])
def test_allgather_gemm_return_a_states_and_returns_the_gathered_a(n, m, k, cols, chunks):
    """return_a: n*c more output chunks after C's, each A block as the caller gave it (bit-exact),
    stated in the IR (<compute return_a="1">, AllGather-style <postcondition> terms), proven for
    every output chunk, round-tripped, and simulated; the default IR says none of it."""
    import ml_dtypes
    from gc3.simulator.compute import make_compute_inputs
    plain = lower(_algo("allgather_gemm")(n, m, k, cols, chunks))
    prog = lower(_algo("allgather_gemm")(n, m, k, cols, chunks, 1))
    nc = n * chunks
    assert not plain.compute.return_a and "return_a" not in to_xml(plain)
    assert {g.o_chunks for g in plain.gpus} == {nc} and {g.o_chunks for g in prog.gpus} == {2 * nc}
    text = to_xml(prog)
    assert '<compute op="agemm" dtype="bfloat16" return_a="1">' in text and from_xml(text) == prog
    for r in range(n):
        for p in range(n):
            for i in range(chunks):
                assert prog.postcondition[(r, nc + p * chunks + i)] == ((p, i),)
    assert verify(from_xml(text)).proven == n * 2 * nc
    res = simulate(from_xml(text), seed=n + k)
    assert res.ok, res.errors
    ins = make_compute_inputs(prog.compute, n, n + k)
    rows = m // n
    a = np.concatenate([ins[r]["a"][r * rows:(r + 1) * rows] for r in range(n)])
    R, lanes = m // nc, (m // nc) * max(k, cols)
    for r in range(n):
        got = res.outputs[r].reshape(2 * nc, lanes)
        want = (a.astype(np.float32) @ ins[r]["b"].astype(np.float32)).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(got[:nc, :R * cols].reshape(m, cols), want)
        np.testing.assert_array_equal(got[nc:, :R * k].reshape(m, k), a)


def _ag_return_a(n, c, own, check=False):
    """allgather_gemm(return_a=1)'s schedule at m = n*c, k = n = 1, except that rank r copies its own
    A block i to gathered-A block own(r, i) (None: it copies none)."""
    from gc3.collectives import AllGatherGemm
    from gc3.topology import fully_connected
    coll = AllGatherGemm(n, c, m=n * c, k=1, n=1, return_a=True)
    with GC3Program("ag_bad", coll, topology=fully_connected(n)) as prog:
        for s in range(n):
            for i in range(c):
                for r in range(n):
                    p = (r + s) % n
                    a = chunk(r, "in", i) if s == 0 else chunk(p, "in", i).copy(r, "out", n * c + p * c + i)
                    gemm(r, "out", p * c + i, a=a)
                    if s == 0 and own(r, i) is not None:
                        a.copy(r, "out", n * c + own(r, i))
        if check:
            Check()
    return prog


def test_allgather_gemm_return_a_that_drops_or_misplaces_an_a_block_is_rejected():
    """The proof rejects a program whose gathered A misses a block (never written) or holds one
    in another's place (two of a rank's own blocks swapped), naming the chunk and the value;
    so does the DSL's Check, and the simulator, from the data."""
    n, c = 2, 2
    good = lower(_ag_return_a(n, c, lambda r, i: r * c + i, check=True))
    assert verify(good).proven == n * 2 * n * c
    dropped = lower(_ag_return_a(n, c, lambda r, i: None if (r, i) == (1, 0) else r * c + i))
    with pytest.raises(SemanticError, match=r"rank 1 output chunk o\[6\] should hold in\(1,0\) but holds nothing"):
        verify(dropped)
    swapped = lower(_ag_return_a(n, c, lambda r, i: r * c + (1 - i) if r == 0 else r * c + i))
    with pytest.raises(SemanticError, match=r"rank 0 output chunk o\[4\] should hold in\(0,0\) but holds in\(0,1\)"):
        verify(swapped)
    with pytest.raises(PostconditionError):
        _ag_return_a(n, c, lambda r, i: r * c + (1 - i) if r == 0 else r * c + i, check=True)
    for bad in (dropped, swapped):
        res = simulate(bad)
        assert not res.ok and res.wrong > 0, res.errors
    # the same program read as plain agemm (no return_a): its A chunks are not the operator's leaves
    text = to_xml(good).replace(' return_a="1"', "")
    with pytest.raises(SemanticError, match=r"should hold agemm\(0,0\) but holds in\(0,0\)"):
        verify(from_xml(text))


def test_return_a_in_the_ir_is_read_strictly():
    from gc3.errors import IRFormatError
    text = to_xml(lower(_algo("allgather_gemm")(2, 8, 8, 8, 1, 1)))
    with pytest.raises(IRFormatError, match="return_a"):
        from_xml(text.replace('return_a="1"', 'return_a="yes"'))
    rs = to_xml(lower(_algo("gemm_reducescatter")(2, 8, 8, 8, 1)))
    with pytest.raises(IRFormatError, match="return_a.*needs the agemm operator"):
        from_xml(rs.replace('<compute op="gemm"', '<compute op="gemm" return_a="1"'))
    with pytest.raises(TraceError, match="return_a must be True or False"):
        from gc3.collectives import AllGatherGemm
        AllGatherGemm(2, 1, m=8, return_a=1)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", [p for p in PROGRAMS if p != "allgather_gemm"])
def test_fused_not_compute_then_send(name, n):
    """On every rank, the first send waits for exactly one GEMM chunk, the one it sends;
    and no rank's first send waits for all of the rank's GEMM chunks."""
    prog = lower(_algo(name)(n, 8 * n, 8, 8, 4))
    steps, before = happens_before(prog)
    for g in prog.gpus:
        mine = [key for key, st in steps.items() if key[0] == g.id]
        gemms = [key for key in mine if steps[key].type == "gemm"]
        sends = [key for key in mine if steps[key].type == "s"]
        counts = sorted((sum(steps[p].type == "gemm" and p[0] == g.id for p in before(s)), s) for s in sends)
        n_gemm, first = counts[0]
        assert n_gemm == 1, (g.id, counts[:3])
        (only,) = [p for p in before(first) if steps[p].type == "gemm"]
        assert (steps[only].dstbuf, steps[only].dstoff) == (steps[first].srcbuf, steps[first].srcoff)
        assert len(gemms) > 1


def _compute_and_send_spans(res, rank):
    t = res.timing        # a compute step runs on its first tile (the whole chunk): span 0
    ev = [(rec.type, rec.tb, t.start[i], t.end[i]) for i, rec in enumerate(res.records) if rec.rank == rank]
    gemms = sorted(t.spans[i][0] for i, rec in enumerate(res.records) if rec.rank == rank and rec.type in GEMMS)
    sends = sorted((s, e) for ty, _, s, e in ev if ty == "s")
    return gemms, sends


@pytest.mark.parametrize("name", [p for p in PROGRAMS if p != "allgather_gemm"])
def test_timeline_overlaps_compute_with_communication(name):
    """The compute of chunk c+1 overlaps the send of chunk c; and the fused run beats
    the sum of its rank's compute and its communication (serial would be the sum)."""
    prog = lower(_algo(name)(4, 1024, 1024, 1024, 2))
    res = simulate(prog)
    assert res.ok, res.errors
    gemms, sends = _compute_and_send_spans(res, 0)
    assert len(gemms) == 4 * 2
    s0, e0 = sends[0]
    g1s, g1e = gemms[1]
    assert s0 < g1e and g1s < e0, (sends[0], gemms[1])
    assert abs(g1s - gemms[0][1]) < 1e-9          # one compute stream: chunk 1 starts when chunk 0 ends


def test_gemm_compute_term_models_the_measured_chunking_cost():
    """The 2x H200 measurements: +1-2% at GEMM+RS shapes, +18-28% at an AG shape, n=4 chunks."""
    from gc3.ir import ComputeSpec
    cfg = preset("h100")

    def spec(m, k, n):
        return ComputeSpec("gemm", "bfloat16", (("a", (m, k)), ("b", (k, n))))
    rs = spec(4096, 7168, 8192)
    ag = spec(4096, 8192, 7168)
    rs_cost = gemm_seconds(rs, 4, cfg) / gemm_seconds(rs, 1, cfg)
    ag_cost = gemm_seconds(ag, 4, cfg) / gemm_seconds(ag, 1, cfg)
    assert 1.0 < rs_cost < 1.04 and 1.10 < ag_cost < 1.35, (rs_cost, ag_cost)
    one = gemm_seconds(rs, 1, cfg)   # about 2*M*K*N at 70% of 989 TFLOPS: 0.7 ms
    assert 0.6e-3 < one < 0.9e-3
    assert gemm_seconds(rs, 1, preset("h200")) == one     # same tensor-core peak
    # more chunks never make the GEMM itself faster
    for s in (rs, ag, spec(512, 1024, 1024)):
        t = [gemm_seconds(s, c, cfg) for c in (1, 2, 4, 8, 16)]
        assert all(a <= b + 1e-12 for a, b in zip(t, t[1:])), t


def test_chunk_chooser_is_sane():
    build = _algo("gemm_reducescatter")
    best, times = choose_gemm_chunks(build, 4, 256, 64, 64)
    assert best == 1 and set(times) == {1, 2, 4, 8, 16}   # tiny GEMM: chunk overheads dominate
    assert times[16] > times[1]
    best, times = choose_gemm_chunks(_algo("gemm_allreduce"), 4, 4096, 7168, 8192)
    assert best > 1 and times[best] < times[1]           # big GEMM: overlapping pays
    assert times[best] == min(times.values())
    _, times = choose_gemm_chunks(build, 4, 24, 64, 64)  # 24 = 4*6: only 1, 2 of the candidates split it
    assert set(times) == {1, 2}
    best, times = choose_gemm_chunks(_algo("allgather_gemm"), 4, 4096, 8192, 1792)
    assert times[best] == min(times.values()) and all(t > 0 for t in times.values())
    from gc3.errors import SimulationError
    with pytest.raises(SimulationError, match="splits m"):
        choose_gemm_chunks(build, 4, 6, 64, 64)


def test_timeline_cli_shows_the_gemm_steps(tmp_path, default):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner
    from gc3.cli import main

    _, prog = default
    xml = tmp_path / "f.xml"
    xml.write_text(to_xml(prog))
    png = tmp_path / "t.png"
    res = CliRunner().invoke(main, ["simulate", str(xml), "--timeline", str(png)])
    assert res.exit_code == 0, res.output
    assert png.exists() and png.stat().st_size > 0


def test_dsl_checks():
    with pytest.raises(PostconditionError, match=r"gemm\(1,"):
        with GC3Program("own_only", GemmReduceScatter(2, 1, m=4, k_shard=2, n=2)):
            for r in range(2):
                gemm(r, "out", 0, rows=r)
            Check()
    with pytest.raises(TraceError, match="fused collective"):
        from gc3.collectives import AllToAll
        with GC3Program("plain", AllToAll(2, 1)):
            gemm(0, "out", 0)
    with pytest.raises(TraceError, match="do not split"):
        GemmAllToAll(4, 2, m=12)
    with pytest.raises(TraceError, match="accum"):
        GemmReduceScatter(2, 1, accum="float16")
    with pytest.raises(TraceError, match="floating point"):
        GemmAllToAll(2, 1, m=4, dtype="int32")


def test_opcode_row_is_cpu_only_and_the_runtime_refuses_it(default):
    for op in GEMMS:
        assert op in COMPUTE and op in NOT_ON_DEVICE and op not in DEVICE_OPCODES
    tables = pytest.importorskip("runtime_cuda.core.tables")
    with pytest.raises(NotOnDeviceError, match="'a?gemm' step"):
        tables.build(default[1])


def test_ir_reader_rejects_a_bad_accum(default):
    from gc3.errors import IRFormatError
    el = f'<compute op="{default[1].compute.op}" dtype="bfloat16"'
    text = to_xml(default[1]).replace(el, el + ' accum="float16"')
    assert text != to_xml(default[1])
    with pytest.raises(IRFormatError, match="accum"):
        from_xml(text)
    assert replace(default[1].compute, accum="float32").buffer_dtype == "float32"


def test_allgather_gemm_timeline_overlaps_transfers_with_gemms():
    """The GEMMs of the rank's own blocks run while the first blocks travel, and a later GEMM
    overlaps a later transfer."""
    res = simulate(lower(_algo("allgather_gemm")(4, 1024, 1024, 1024, 2)))
    assert res.ok, res.errors
    gemms, sends = _compute_and_send_spans(res, 0)
    assert len(gemms) == 4 * 2
    assert any(g0 < s1 and s0 < g1 for g0, g1 in gemms[:2] for s0, s1 in sends[:3])
    assert any(g0 < s1 and s0 < g1 for g0, g1 in gemms[2:] for s0, s1 in sends[3:])


@pytest.mark.parametrize("n,m,chunks", [(2, 16, 4), (4, 64, 2), (4, 48, 3), (8, 64, 2)])
def test_skewed_alltoall_compiles_checks_and_simulates(n, m, chunks):
    prog = lower(_algo("gemm_alltoall")(n, m, 8, 8, chunks, 1))
    splits = prog.compute.splits
    assert len(splits) == n and splits[0] > splits[1] and sum(splits) == n * chunks
    text = to_xml(prog)
    assert f'splits="{",".join(map(str, splits))}"' in text and "<postcondition>" in text
    back = from_xml(text)
    assert back.compute == prog.compute
    assert verify(back).proven == n * sum(splits)        # padding chunks are not claimed
    res = simulate(back, seed=n)
    assert res.ok, res.errors


def test_skewed_alltoall_output_is_each_ranks_rows_by_the_split():
    import ml_dtypes
    from gc3.simulator.compute import make_compute_inputs
    prog = lower(_algo("gemm_alltoall")(2, 16, 8, 4, 4, 1))      # splits (6, 2) blocks of 2 rows
    res = simulate(prog, seed=2)
    assert res.ok, res.errors
    ins = make_compute_inputs(prog.compute, 2, 2)
    c = [(d["a"].astype(np.float32) @ d["b"].astype(np.float32)).astype(ml_dtypes.bfloat16) for d in ins]
    rows = {0: (0, 12), 1: (12, 16)}
    for p in range(2):
        out = res.outputs[p].reshape(2, 12, 4)                   # n slices of max(splits)=6 blocks of 2 rows
        a, b = rows[p]
        for r in range(2):
            np.testing.assert_array_equal(out[r, :b - a], c[r][a:b])


def test_skewed_wrong_block_is_rejected_by_check_and_simulate():
    prog = lower(_algo("gemm_alltoall")(4, 64, 8, 8, 2, 1))
    bad = _mutated(prog, 0, 1)
    with pytest.raises(SemanticError, match="should hold gemm"):
        verify(bad)
    res = simulate(bad)
    assert not res.ok and res.wrong > 0


def test_skewed_first_send_waits_for_one_gemm():
    prog = lower(_algo("gemm_alltoall")(4, 64, 8, 8, 2, 1))
    steps, before = happens_before(prog)
    for g in prog.gpus:
        sends = [key for key, st in steps.items() if key[0] == g.id and st.type == "s"]
        assert min(sum(steps[p].type == "gemm" for p in before(s)) for s in sends) == 1


def test_skewed_split_errors():
    with pytest.raises(TraceError, match="summing to m"):
        GemmAllToAll(2, 2, m=8, splits=[4, 2])
    with pytest.raises(TraceError, match="must divide every slice"):
        GemmAllToAll(2, 2, m=8, splits=[5, 3])
    with pytest.raises(ValueError, match="chunks >= 2"):
        _algo("gemm_alltoall")(4, 64, 8, 8, 1, 1)


def test_chunk_counts_follow_the_measured_gemm_figures(tmp_path):
    """The chooser's GEMM rate and per-chunk cost come from the measured chunked-GEMM file:
    the fit prices each measured one-call GEMM closely, and a measurement where chunking
    costs more makes it choose fewer chunks."""
    from gc3.errors import GC3Error
    from gc3.simulator import gemm_measured
    from gc3.simulator.cost_config import DEFAULT
    from gc3.simulator.cost_model import _gemm_time
    points = gemm_measured.read_points()
    assert len(points) >= 8 and {p.op for p in points} >= {"gemm_reduce_scatter", "all_gather_gemm"}
    cfg = gemm_measured.measured(preset(DEFAULT))
    assert cfg.gemm_efficiency != preset(DEFAULT).gemm_efficiency and 0.4 < cfg.gemm_efficiency < 1.0
    assert 0 < cfg.gemm_chunk_s < 50e-6 and "measured_gemm_1xh100.txt" in cfg.calibration
    for p in points:
        if p.split == "equal" and p.one_s > 0.5e-3:     # the large shapes: within 15% of each measurement
            assert abs(_gemm_time(p.m, p.n, p.k, cfg) / p.one_s - 1) < 0.15, p
    build = _algo("gemm_allreduce")
    shape = (4, 4096, 7168, 8192)
    assert choose_gemm_chunks(build, *shape) == choose_gemm_chunks(build, *shape, cost=cfg)
    real, _ = choose_gemm_chunks(build, *shape)
    text = gemm_measured.MEASURED_GEMM.read_text()
    costly = tmp_path / "costly.txt"     # every chunked GEMM twice the one call
    costly.write_text("".join(line.split("T_gemm_chunked=")[0] + "T_gemm_chunked=" +
                              f"{2 * float(line.split('T_gemm=')[1].split()[0]):.3f} (x2.000," +
                              line.split("(x")[1].split(",", 1)[1] + "\n"
                              for line in text.splitlines() if line and not line.startswith("#")))
    dear = gemm_measured.measured(preset(DEFAULT), costly)
    assert dear.gemm_chunk_s > 10 * cfg.gemm_chunk_s
    fewer, _ = choose_gemm_chunks(build, *shape, cost=dear)
    assert fewer < real, (fewer, real)
    bad = tmp_path / "bad.txt"
    bad.write_text("# header\ngemm_reduce_scatter M=4096 T_gemm=oops\n")
    with pytest.raises(GC3Error, match=r"bad.txt:2: not a measured GEMM row"):
        gemm_measured.read_points(bad)
