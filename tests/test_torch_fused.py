"""The GEMM operators' stream pipeline and the measured choice between it and the
sequential path: CPU tests of the choice table, the chunking and the benchmark's
record format, and a GPU test that runs every operator on ranks sharing one GPU
(tests/gpu_programs/torch_fused.py)."""
import json
import os
from pathlib import Path
from typing import Optional

import pytest

from gc3.errors import InputError
from runtime_cuda.fused import choice

ROOT = Path(__file__).resolve().parents[1]
try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def table_file(tmp_path, entries, rest=None):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(dict(rest or {"version": 1, "algorithms": []}, fused={"entries": entries})))
    return path


def entry(M, path, op="gemm_rs", gpus=4, K=7168, N=8192, chunks=4):
    return {"op": op, "gpus": gpus, "dtype": "bfloat16", "shape": {"M": M, "K": K, "N": N}, "path": path,
            "chunks": chunks, "fused_us": 1.0, "sequential_us": 2.0}


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    def use(entries):
        path = table_file(tmp_path, entries)
        monkeypatch.setattr(choice, "catalog_path", lambda: path)
        return path
    monkeypatch.delenv("GC3_FUSED", raising=False)
    return use


def test_an_unmeasured_machine_runs_the_sequential_path(monkeypatch):
    monkeypatch.setattr(choice, "catalog_path", lambda: None)
    monkeypatch.delenv("GC3_FUSED", raising=False)
    got = choice.choose("gemm_rs", 4, "bfloat16", {"M": 8192, "K": 7168, "N": 8192})
    assert not got.fused and "no measured catalog" in got.why


def test_the_measured_path_and_chunks_win(catalog):
    catalog([entry(8192, "fused", chunks=8), entry(1024, "sequential")])
    got = choice.choose("gemm_rs", 4, "bfloat16", {"M": 8192, "K": 7168, "N": 8192})
    assert got.fused and got.chunks == 8 and "measured at this shape" in got.why
    assert not choice.choose("gemm_rs", 4, "bfloat16", {"M": 1024, "K": 7168, "N": 8192}).fused


def test_the_measured_way_of_sending_the_peers_tiles_rides_with_the_choice(catalog, tmp_path):
    """An entry's peer_tiles (gc3 tune --fused timed both) comes with its choice, a forced
    fused call's too; entries without one, and unmeasured shapes, store; a value other than
    store or copy-engine is refused naming the entry."""
    catalog([dict(entry(8192, "fused"), peer_tiles="copy-engine"), entry(1024, "fused")])
    shape = {"M": 8192, "K": 7168, "N": 8192}
    assert choice.choose("gemm_rs", 4, "bfloat16", shape).peer_tiles == "copy-engine"
    assert choice.choose("gemm_rs", 4, "bfloat16", shape, path="fused").peer_tiles == "copy-engine"
    assert choice.choose("gemm_rs", 4, "bfloat16", dict(shape, M=1024)).peer_tiles == "store"
    assert choice.choose("gemm_rs", 4, "bfloat16", dict(shape, N=512), path="fused").peer_tiles == "store"
    with pytest.raises(InputError, match=r"fused.entries\[0\]: peer_tiles 'copy'"):
        choice.FusedTable([dict(entry(8192, "fused"), peer_tiles="copy")], "c.json")


def test_the_variable_overrides_the_measured_way_of_sending_the_peers_tiles(monkeypatch):
    """tile_store._copy_engines(measured): GC3_FUSED_PEER_TILES where set, else the shape's
    measured choice; a captured call always stores."""
    from runtime_cuda.core import cudadriver
    from runtime_cuda.torch_dist import tile_store
    monkeypatch.setattr(cudadriver, "driver", lambda *a: object())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("GC3_FUSED_PEER_TILES", raising=False)
    assert tile_store._copy_engines("copy-engine") is True and tile_store._copy_engines("store") is False
    monkeypatch.setenv("GC3_FUSED_PEER_TILES", "store")
    assert tile_store._copy_engines("copy-engine") is False
    monkeypatch.setenv("GC3_FUSED_PEER_TILES", "copy-engine")
    assert tile_store._copy_engines("store") is True
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tile_store._copy_engines("copy-engine") is False


def test_a_near_m_stands_in_only_within_a_factor_of_two(catalog):
    catalog([entry(8192, "fused")])
    assert choice.choose("gemm_rs", 4, "bfloat16", {"M": 12000, "K": 7168, "N": 8192}).fused
    assert choice.choose("gemm_rs", 4, "bfloat16", {"M": 4096, "K": 7168, "N": 8192}).fused
    for other in ({"M": 4000, "K": 7168, "N": 8192}, {"M": 8192, "K": 7168, "N": 4096}):
        assert not choice.choose("gemm_rs", 4, "bfloat16", other).fused, other
    assert not choice.choose("gemm_rs", 2, "bfloat16", {"M": 8192, "K": 7168, "N": 8192}).fused
    assert not choice.choose("gemm_ar", 4, "bfloat16", {"M": 8192, "K": 7168, "N": 8192}).fused
    assert not choice.choose("gemm_rs", 4, "float16", {"M": 8192, "K": 7168, "N": 8192}).fused


def test_between_two_measured_sizes_that_agree_their_path_holds(catalog):
    """Along an op's size axis (bytes for the epilogue, b for the GEMV, samples for the bags, M for
    the GEMMs): a size between two measured ones takes their path where they agree, else only a
    size within a factor of 2 of one of them does; other dimensions must be equal."""
    def ep(nbytes, path, dtype="bfloat16"):
        return {"op": "ar_epilogue", "gpus": 4, "dtype": dtype, "shape": {"bytes": nbytes}, "path": path}
    catalog([ep(16384, "fused"), ep(1 << 20, "fused"), ep(8 << 20, "sequential"), ep(64 << 20, "fused")])
    pick = lambda n, dtype="bfloat16": choice.choose("ar_epilogue", 4, dtype, {"bytes": n})  # noqa: E731
    assert pick(131072).fused and "between measured bytes=16384 and 1048576" in pick(131072).why
    assert pick(24576).fused and pick(1 << 21).fused                 # within a factor of 2 of a fused size
    assert not pick(3 << 20).fused                                  # 1 MiB fused, 8 MiB sequential: unsure
    assert not pick(16 << 20).fused and not pick(24 << 20).fused     # 8 MiB's side, and nobody agrees above
    assert not pick(4096).fused and not pick(1 << 30).fused          # outside the measured range
    assert not pick(131072, "float32").fused                         # another dtype was not measured
    # The small kernels' limit is a break: 2 MiB (the kernel) stands in for nothing above it.
    from gc3.limits import SMALL_ALLREDUCE_MAX_BYTES as LIMIT
    catalog([ep(LIMIT, "fused"), ep(LIMIT * 8, "fused")])
    assert pick(LIMIT // 2).fused and not pick(LIMIT + 2).fused and pick(LIMIT * 4).fused
    gemv = {"op": "gemv_ar", "gpus": 4, "dtype": "bfloat16", "path": "fused"}
    catalog([dict(gemv, shape={"b": 1, "K": 2048, "N": 8192}), dict(gemv, shape={"b": 32, "K": 2048, "N": 8192})])
    assert choice.choose("gemv_ar", 4, "bfloat16", {"b": 8, "K": 2048, "N": 8192}).fused
    assert not choice.choose("gemv_ar", 4, "bfloat16", {"b": 8, "K": 2048, "N": 4096}).fused


def test_a_call_captured_into_a_cuda_graph_takes_the_graph_path_where_one_was_measured(catalog):
    """A fused GEMV can win eager calls by host time and lose replays by GPU time: an entry's
    graph_path decides captured calls, its path eager ones, and where an entry has no graph_path
    a captured call takes its path.  The bracket rule compares the captured call's paths."""
    def gv(b, path, graph=None):
        e = {"op": "gemv_ar", "gpus": 4, "dtype": "bfloat16", "shape": {"b": b, "K": 3584, "N": 4096}, "path": path,
             "fused_us": 40.0, "sequential_us": 90.0}
        return e if graph is None else dict(e, graph_path=graph, graph_fused_us=27.0, graph_sequential_us=18.7)
    catalog([gv(1, "fused", "fused"), gv(8, "fused", "sequential"), gv(32, "fused", "sequential"), gv(4, "fused")])
    pick = lambda b, captured: choice.choose("gemv_ar", 4, "bfloat16", {"b": b, "K": 3584, "N": 4096},  # noqa: E731
                                             captured=captured)
    assert pick(8, False).fused and not pick(8, True).fused
    assert "in a CUDA graph: fused 27.0 us, sequential 18.7 us" in pick(8, True).why
    assert pick(1, True).fused and pick(4, True).fused          # graph fused; no graph measure: the eager path
    assert pick(16, False).fused and not pick(16, True).fused   # between 8 and 32: both fused eager, sequential replayed
    assert not choice.choose("gemv_ar", 4, "bfloat16", {"b": 8, "K": 3584, "N": 4096}, path="sequential").fused
    assert choice.choose("gemv_ar", 4, "bfloat16", {"b": 8, "K": 3584, "N": 4096}, path="fused", captured=True).fused
    with pytest.raises(InputError, match="graph_path 'maybe'"):
        choice.FusedTable([dict(gv(1, "fused"), graph_path="maybe")], "x")


def test_a_group_keeps_its_captured_and_its_eager_decisions_apart(tmp_path, monkeypatch):
    """The torch operators keep choices per group; whether the call is being captured is part of
    the key, so a capture neither reuses an eager call's choice nor leaves one for it.  A captured
    call takes the table's graph path only once an eager call of the shape has run it (its set-up
    cannot run in a capture), else the path the eager calls took."""
    import types

    torch = pytest.importorskip("torch")
    from runtime_cuda.torch_dist import ops
    e = {"op": "gemv_ar", "gpus": 4, "dtype": "bfloat16", "shape": {"b": 8, "K": 3584, "N": 4096}, "path": "fused",
         "graph_path": "sequential"}
    path = table_file(tmp_path, [e])
    monkeypatch.setattr(choice, "catalog_path", lambda: None)
    monkeypatch.delenv("GC3_FUSED", raising=False)
    monkeypatch.delenv("GC3_CONFIG", raising=False)
    pg = types.SimpleNamespace(size=lambda: 4, _comm=types.SimpleNamespace(machine=types.SimpleNamespace(path=path)))
    capturing = [False]
    monkeypatch.setattr(ops, "_capturing", lambda: capturing[0])
    like = torch.zeros(1, dtype=torch.bfloat16)
    pick = lambda: ops._choose("gemv_ar", pg, torch.bfloat16, e["shape"], None, None, like)  # noqa: E731
    assert pick().fused
    capturing[0] = True
    assert pick().fused and "never ran eagerly" in pick().why
    capturing[0] = False
    assert pick().fused and len(pg._gc3_choices) == 2
    assert ops._decision_context()[-1] is False
    # Once the sequential path ran the shape eagerly (forced), a fresh capture takes the graph path.
    assert not ops._choose("gemv_ar", pg, torch.bfloat16, e["shape"], "sequential", None, like).fused
    pg._gc3_choices.clear()
    capturing[0] = True
    assert not pick().fused and "in a CUDA graph" in pick().why


def test_the_caller_and_the_environment_force_a_path(catalog, monkeypatch):
    catalog([entry(8192, "fused")])
    shape = {"M": 8192, "K": 7168, "N": 8192}
    assert not choice.choose("gemm_rs", 4, "bfloat16", shape, path="sequential").fused
    monkeypatch.setenv("GC3_FUSED", "0")
    assert not choice.choose("gemm_rs", 4, "bfloat16", shape).fused
    got = choice.choose("gemm_rs", 4, "bfloat16", {"M": 64, "K": 1, "N": 1}, path="fused", chunks=3)
    assert got.fused and got.chunks == 3
    monkeypatch.setenv("GC3_FUSED", "maybe")
    with pytest.raises(InputError, match="GC3_FUSED='maybe'"):
        choice.choose("gemm_rs", 4, "bfloat16", shape)
    with pytest.raises(InputError, match="path must be"):
        choice.choose("gemm_rs", 4, "bfloat16", shape, path="fast")


@pytest.mark.parametrize("bad, words", [
    ({"op": "gemm_rs"}, "malformed entry"),
    (dict(entry(1, "fused"), op="gemm_xx"), "op 'gemm_xx'"),
    (dict(entry(1, "fused"), path="maybe"), "path 'maybe'"),
    (dict(entry(1, "fused"), chunks=0), "chunks 0"),
])
def test_a_malformed_table_names_the_entry(tmp_path, bad, words):
    path = table_file(tmp_path, [entry(2, "fused"), bad])
    with pytest.raises(InputError, match=r"fused\.entries\[1\]") as err:
        choice.FusedTable.from_catalog(path)
    assert words in str(err.value)


def test_a_catalog_without_a_fused_section_measures_nothing(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"version": 1, "algorithms": []}))
    assert choice.FusedTable.from_catalog(path).lookup("gemm_rs", 2, "bfloat16", {"M": 1})[0] is None


@needs_torch
@pytest.mark.parametrize("total, chunks", [(1, 4), (64, 4), (100, 3), (776, 4), (8192, 8), (8192, 1), (130, 64)])
def test_chunk_bounds_cover_the_range_aligned(total, chunks):
    from runtime_cuda.torch_dist.overlap import ALIGN, bounds
    cuts = bounds(total, chunks)
    assert cuts[0] == 0 and cuts[-1] == total and all(a < b for a, b in zip(cuts, cuts[1:]))
    assert len(cuts) - 1 <= chunks and all(c % ALIGN == 0 for c in cuts[1:-1])
    if total >= chunks * ALIGN:
        assert len(cuts) - 1 == chunks


@needs_torch
def test_the_record_line_has_every_field_of_the_schema():
    from runtime_cuda.torch_dist import bench_fused as bf
    case = bf.Case("gemm_rs", 8192, 28672, 8192, 4, torch.device("cpu"))
    text = bf.line(case, {"fused_us": 12.34, "seq_nccl_us": None}, "fused", "ok", "4xH100")
    fields = dict(cell.split("=", 1) for cell in text.split()[1:])
    assert text.startswith("fused op=gemm_rs gpus=4 M=8192 K=28672 N=8192 dtype=bfloat16 ")
    assert fields["fused_us"] == "12.3" and fields["seq_nccl_us"] == "n/a" and fields["path"] == "fused"
    assert set(bf.FIELDS) <= set(fields) and fields["hw"] == "4xH100"


@needs_torch
def test_the_grid_is_the_issue_grid_and_quick_is_a_third():
    from runtime_cuda.torch_dist import bench_fused as bf
    full = bf.grid(bf.OPS, quick=False)
    assert len(full) == 15 + 15 + 12 + 6
    assert ("gemm_rs", 16384, 53248, 16384) in full and ("gemm_ar", 256, 14336, 4096) in full
    assert len(bf.grid(bf.OPS, quick=True)) == -(-len(full) // 3)
    with pytest.raises(ValueError, match="unknown fused op"):
        bf.grid(["gemm_xx"], quick=False)


def _write(args):
    path, i = args
    from runtime_cuda.torch_dist import bench_fused as bf
    bf.write_section(Path(path), [entry(1024 * (i + 1), "fused", op="gemm_rs", gpus=i + 2)],
                     {"hw": f"{i + 2}xH100", "date": "d"})


@needs_torch
def test_the_fused_section_merges_into_a_catalog_and_keeps_the_rest(tmp_path):
    from runtime_cuda.torch_dist import bench_fused as bf
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 1, "algorithms": [{"name": "x"}]}))
    bf.write_section(path, [entry(1024, "fused"), entry(2048, "sequential")], {"hw": "4xH100"})
    bf.write_section(path, [entry(4096, "fused")], {"hw": "4xH100"})         # same (op, gpus): replaced
    bf.write_section(path, [entry(4096, "fused", op="gemm_ar")], {"hw": "4xH100"})
    data = json.loads(path.read_text())
    assert data["algorithms"] == [{"name": "x"}]
    assert sorted((e["op"], e["shape"]["M"]) for e in data["fused"]["entries"]) == [("gemm_ar", 4096),
                                                                                     ("gemm_rs", 4096)]
    assert choice.FusedTable.from_catalog(path).lookup("gemm_ar", 4, "bfloat16",
                                                       {"M": 4096, "K": 7168, "N": 8192})[0]["path"] == "fused"
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


@needs_torch
def test_shape_picks_grid_cases_by_their_record_fields():
    """bench_fused.cases with --shape specs: the named cases of the whole grid (quick or not),
    GEMM and memory-bound together, in grid order; a spec that is malformed, names an unknown
    operator or field, or names no case is refused before anything runs."""
    from runtime_cuda.torch_dist import bench_fused as bf
    every = list(bf.OPS) + list(bf.MEMORY_OPS)
    gemm, mem = bf.cases(every, True, ["gemm_ar:M=8192,K=53248", "ag_gemm:M=16384,K=16384,N=53248",
                                       "ar_epilogue:bytes=16777216,dtype=bfloat16"])
    assert gemm == [("ag_gemm", 16384, 16384, 53248), ("gemm_ar", 8192, 53248, 16384)]
    assert [(op, dict(dims), bf.DTYPE_NAME[dt]) for op, dims, dt, _ in mem] == \
        [("ar_epilogue", {"bytes": 16 << 20}, "bfloat16")]
    gemm, mem = bf.cases(every, False, ["gemm_a2a"])
    assert len(gemm) == 6 and {c[0] for c in gemm} == {"gemm_a2a"} and mem == []
    assert bf.cases(["gemm_rs"], True, []) == (bf.grid(["gemm_rs"], True), [])
    for spec, words in (("gemm_xx:M=1", "unknown operator"), ("gemm_ar:M", "not field=value"),
                        ("gemm_ar:b=1", "no field b"), ("gemm_ar:M=8191", "names no shape"),
                        ("gemv_ar:b=1", "names no shape")):
        with pytest.raises(ValueError, match=words):
            bf.cases(["gemm_ar"] if spec != "gemm_xx:M=1" else every, False, [spec])


@needs_torch
def test_the_cli_refuses_a_shape_that_names_nothing():
    from click.testing import CliRunner
    from runtime_cuda.commands import cli
    out = CliRunner().invoke(cli(), ["bench", "--fused", "--shape", "gemm_rs:M=1000"])
    assert out.exit_code == 2 and "--shape" in out.output and "gemm_rs:M=1000" in out.output
    out = CliRunner().invoke(cli(), ["bench", "--shape", "gemm_rs:M=1024"])
    assert out.exit_code == 2 and "use it with --fused" in out.output
    out = CliRunner().invoke(cli(), ["tune", "--fused", "--shape", "gemm_ar:M=257"])
    assert out.exit_code == 2 and "--shape" in out.output and "gemm_ar:M=257" in out.output
    out = CliRunner().invoke(cli(), ["tune", "-o", "x.json", "--shape", "gemm_ar:M=256"])
    assert out.exit_code == 2 and "use it with --fused" in out.output


def test_a_tune_of_named_shapes_replaces_their_entries_alone(tmp_path):
    """bench_fused.write_section with by_shape: the entries of the same (op, gpus, dtype, shape)
    are replaced, the operator's others at those GPUs kept, and the edit line added; without it,
    every entry of the (op, gpus) goes."""
    from runtime_cuda.torch_dist import bench_fused as bf

    def entry(M, path, gpus=2):
        return {"op": "gemm_ar", "gpus": gpus, "dtype": "bfloat16", "shape": {"M": M, "K": 14336, "N": 8192},
                "path": path, "chunks": 1}
    catalog = tmp_path / "catalog.json"
    bf.write_section(catalog, [entry(256, "fused"), entry(1024, "fused"), entry(256, "fused", 4)], {"hw": "2xH200"})
    bf.write_section(catalog, [entry(256, "sequential")], None, "2026-11-28: gc3 tune --fused --shape", by_shape=True)
    section = json.loads(catalog.read_text())["fused"]
    got = {(e["gpus"], e["shape"]["M"]): e["path"] for e in section["entries"]}
    assert got == {(2, 256): "sequential", (2, 1024): "fused", (4, 256): "fused"}
    assert section["edits"] == ["2026-11-28: gc3 tune --fused --shape"] and list(section["provenance"]) == ["2xH200"]
    bf.write_section(catalog, [entry(1024, "sequential")], None)
    got = {(e["gpus"], e["shape"]["M"]): e["path"] for e in json.loads(catalog.read_text())["fused"]["entries"]}
    assert got == {(2, 1024): "sequential", (4, 256): "fused"}


def test_the_cli_refuses_unknown_fused_ops():
    from click.testing import CliRunner
    from runtime_cuda.commands import cli
    out = CliRunner().invoke(cli(), ["bench", "--fused", "--ops", "gemm_rs,gemv_xx"])
    assert out.exit_code == 2 and "gemv_xx" in out.output


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("exchange", ["collective", "copy-engine"])
def test_every_fused_operator_on_ranks_sharing_one_gpu(n, exchange, tmp_path):
    """Each GEMM operator fused at several chunk counts against fp32 and the sequential
    path, bit-identical across ranks, CUDA-graph replay, back-to-back calls, and auto
    following the measured table (tests/gpu_programs/torch_fused.py), with either exchange."""
    pytest.importorskip("cupy")
    from test_torch_backend import spawn_ranks, tuned_catalog
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    catalog = tuned_catalog(n, tmp_path)
    data = json.loads(catalog.read_text())
    M, K, N = 8 * 97, 200, 3 * 64 + 40
    data["fused"] = {"entries": [entry(M * 2, "fused", gpus=n, K=K, N=N, chunks=3),
                                 entry(M * 4, "sequential", gpus=n, K=K, N=N)]}
    catalog.write_text(json.dumps(data))
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH_FALLBACK="0", NCCL_NVLS_ENABLE="0", GC3_TIMEOUT_S="90",
               GC3_CONFIG=str(catalog), GC3_CACHE_DIR=str(tmp_path / "cache"), GC3_FUSED_EXCHANGE=exchange)
    outs = spawn_ranks([str(ROOT / "tests" / "gpu_programs" / "torch_fused.py")], n, tmp_path, env, str(catalog),
                       says="ALL OK rank={rank}", timeout=300)
    for needed in ("gemm_a2a fused chunks=4", "ag_gemm cuda graph replay", "back to back gemm_ar",
                   f"auto M={M * 2} fused", f"auto M={M * 4} sequential", f"auto M={M * 8} sequential",
                   "trace overlap" if exchange == "collective" else "copy-engine pipeline served"):
        assert needed in outs[0], f"{needed!r} did not run on rank 0:\n{outs[0][-3000:]}"


def test_the_exchange_setting_picks_the_pipeline(monkeypatch):
    """By default the tile-store GEMM serves every GEMM operator;
    GC3_FUSED_EXCHANGE=collective takes overlap.py's functions, =copy-engine copy_engine.py's
    except while a CUDA graph captures; a bad value names the variable."""
    from runtime_cuda.torch_dist import copy_engine, ops, overlap, tile_store
    monkeypatch.delenv("GC3_FUSED_EXCHANGE", raising=False)
    names = ("matmul_reduce_scatter", "matmul_all_reduce", "all_gather_matmul", "matmul_all_to_all")
    got = [ops._pipeline(n) for n in names]
    assert set(tile_store.RUNS) == set(names)
    assert [(g.func, g.args) for g in got] == [(ops._tile_store, (n, "store")) for n in names]
    # The measured choice's way of sending the peers' tiles rides along.
    assert ops._pipeline(names[0], "copy-engine").args == (names[0], "copy-engine")
    monkeypatch.setenv("GC3_FUSED_EXCHANGE", "collective")
    assert [ops._pipeline(n) for n in names] == [getattr(overlap, n) for n in names]
    monkeypatch.setenv("GC3_FUSED_EXCHANGE", "copy-engine")
    monkeypatch.setattr(ops, "_capturing", lambda: False)
    assert [ops._pipeline(n) for n in names] == [getattr(copy_engine, n) for n in names]
    monkeypatch.setattr(ops, "_capturing", lambda: True)
    assert ops._pipeline("matmul_reduce_scatter") is overlap.matmul_reduce_scatter   # a capture: overlap's
    monkeypatch.setenv("GC3_FUSED_EXCHANGE", "dma")
    with pytest.raises(InputError, match="GC3_FUSED_EXCHANGE"):
        ops._pipeline("matmul_reduce_scatter")


def test_a_record_line_reads_back_and_later_lines_win(tmp_path):
    from runtime_cuda.fused import records
    first = records.format_line("gemm_rs", 4, {"M": 8192, "K": 28672, "N": 8192}, "bfloat16",
                                {"seq_nccl_us": 100.0, "fused_us": 80.0, "gemm_us": 60.0, "comm_nccl_us": 50.0},
                                "fused", "ok", "4xH100", date="2026-11-26")
    again = first.replace("fused_us=80.0", "fused_us=90.0")
    other = first.replace("gpus=4", "gpus=2").replace("4xH100", "2xH100")
    wider = other.replace("dtype=bfloat16", "dtype=float32")   # the same shape in another input dtype: its own row
    path = tmp_path / "fused.txt"
    path.write_text("# a comment\n" + "\n".join([first, again, other, wider]) + "\n")
    both = records.read(path)
    assert sorted((r["gpus"], r["dtype"]) for r in both) == [(2, "bfloat16"), (2, "float32"), (4, "bfloat16")]
    assert "| gemm_rs | 2 | M=8192 K=28672 N=8192 dtype=float32 | 100.0 |" in records.markdown(both)
    got = {r["gpus"]: r for r in both if r["dtype"] == "bfloat16"}
    assert set(got) == {2, 4} and got[4]["fused_us"] == 90.0 and got[4]["symm_us"] is None
    assert got[4]["shape"] == {"M": 8192, "K": 28672, "N": 8192}
    d = records.derived(got[4])
    assert d["fused"] == pytest.approx(100 / 90) and d["headroom"] == pytest.approx(100 / 60)
    assert d["E"] == pytest.approx((100 - 90) / (100 - 60)) and d["symm"] is None
    table = records.markdown(list(got.values()))
    assert table.count("\n") == 3 and "| gemm_rs | 4 | M=8192 K=28672 N=8192 | 100.0 |" in table
    replayed = dict(got[4], graph_seq_nccl_us=20.0, graph_auto_us=16.0, graph_fused_us=25.0)
    assert records.markdown([replayed]).endswith("| fused | ok | 1.25× | 0.80× |")
    records.plot(list(got.values()), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    # The same shape measured on another machine kind is a line of its own, never joined to this one.
    h200 = dict(got[4], hw="4xH200", fused_us=70.0)
    lines = records.series([got[4], h200], 4, ("gemm_rs",), "M")
    assert sorted(lines) == [("gemm_rs", "K=28672 N=8192 4xH100"), ("gemm_rs", "K=28672 N=8192 4xH200")]
    assert records.series([got[4]], 4, ("gemm_rs",), "M") == {("gemm_rs", "K=28672 N=8192"): [got[4]]}


@pytest.mark.parametrize("bad, words", [("gemm_rs gpus=4", "not a fused record"), ("fused op=x gpus=2 path=fused",
                                                                                     "check, hw missing"),
                                        ("fused op=x gpus=2 fused_us=fast path=f check=ok hw=h", "fused_us='fast'"),
                                        ("fused op=x gpus", "not key=value")])
def test_a_malformed_record_names_the_line(tmp_path, bad, words):
    from runtime_cuda.fused import records
    path = tmp_path / "fused.txt"
    path.write_text("\n" + bad + "\n")
    with pytest.raises(InputError, match="fused.txt:2") as err:
        records.read(path)
    assert words in str(err.value)


def test_the_report_prints_the_table_of_a_record(tmp_path):
    from click.testing import CliRunner
    from runtime_cuda.commands import cli
    from runtime_cuda.fused import records
    path = tmp_path / "fused.txt"
    path.write_text(records.format_line("gemm_ar", 2, {"M": 256, "K": 14336, "N": 4096}, "bfloat16",
                                        {"seq_nccl_us": 50.0, "auto_us": 49.0}, "sequential", "ok", "2xH100") + "\n")
    out = CliRunner().invoke(cli(), ["bench", "--fused", "--report", "--record", str(path), "--plot",
                                     str(tmp_path / "p.png")])
    assert out.exit_code == 0, out.output
    assert "| gemm_ar | 2 | M=256 K=14336 N=4096 | 50.0 |" in out.output and (tmp_path / "p.png").exists()
    out = CliRunner().invoke(cli(), ["bench", "--report"])
    assert out.exit_code == 2 and "--fused" in out.output


def test_a_catalog_rewritten_in_place_is_read_again_and_forget_tells_the_keepers(catalog, tmp_path):
    """choose() keeps nothing itself: a catalog `gc3 tune --fused` rewrote is read at the next
    call (its mtime changed); callers that keep answers key them by choice.generation."""
    shape = {"M": 8192, "K": 7168, "N": 8192}
    path = catalog([entry(8192, "fused")])
    assert choice.choose("gemm_rs", 4, "bfloat16", shape).fused
    path.write_text(json.dumps({"version": 1, "algorithms": [], "fused": {"entries": [entry(8192, "sequential")]}}))
    os.utime(path, (1, 1))              # a distinct mtime, whatever the clock's resolution
    assert not choice.choose("gemm_rs", 4, "bfloat16", shape).fused
    before = choice.generation
    choice.forget()
    assert choice.generation == before + 1


class _Full(Exception):
    """Raised where a call left the repeat path for the full one."""


@needs_torch
def test_a_repeated_gemm_call_takes_the_kept_path_and_any_change_the_key_covers_does_not(monkeypatch):
    """A call whose operands and options match a kept key runs the kept path with the call's own
    tensors and no checks; other strides, dtypes, options, path or GC3_FUSED take the full path."""
    import types

    from runtime_cuda.torch_dist import ops
    monkeypatch.delenv("GC3_FUSED", raising=False)
    A, B = torch.randn(8, 4), torch.randn(4, 6)
    seen = []

    def kept(a, b):
        seen.append((a, b))
        return "kept"
    keys = {
        "fused_matmul_reduce_scatter": ops._gemm_key("fused_matmul_reduce_scatter", (A, B), ("sum", 0, None, None)),
        "fused_matmul_all_reduce": ops._gemm_key("fused_matmul_all_reduce", (A, B), ("sum", None, None)),
        "fused_matmul_all_to_all": ops._gemm_key("fused_matmul_all_to_all", (A, B), (None, None)),
        "fused_all_gather_matmul": ops._gemm_key("fused_all_gather_matmul", [A, B], (0, True, None, None)),
    }
    pg = types.SimpleNamespace(**{ops._GEMM_REPEATS: {k: kept for k in keys.values()}})

    def full(*args, **kw):
        raise _Full()
    monkeypatch.setattr(ops, "_gemm_refusal", full)
    monkeypatch.setattr(ops, "_refusal", full)
    calls = {
        "fused_matmul_reduce_scatter": lambda A, B, **kw: ops.fused_matmul_reduce_scatter(A, B, "sum", 0, pg, **kw),
        "fused_matmul_all_reduce": lambda A, B, **kw: ops.fused_matmul_all_reduce(A, B, pg, **kw),
        "fused_matmul_all_to_all": lambda A, B, **kw: ops.fused_matmul_all_to_all(A, B, pg, **kw),
        "fused_all_gather_matmul": lambda A, B, **kw: ops.fused_all_gather_matmul(A, [B], 0, pg, **kw),
    }
    for name, call in calls.items():
        seen.clear()
        assert call(A, B) == "kept", name
        assert seen[0][0] is A and (seen[0][1] is B or seen[0][1] == [B]), name
        A2 = A.clone()                     # another tensor of the same layout: still the kept path
        assert call(A2, B) == "kept" and seen[1][0] is A2, name
        for changed in (lambda: call(A, B.t().contiguous().t()),        # other strides
                        lambda: call(A.double(), B.double()),            # another dtype
                        lambda: call(A, B, path="sequential"),           # a forced path
                        lambda: call(A, B, chunks=2)):                   # a chunk count
            with pytest.raises(_Full):
                changed()
        monkeypatch.setenv("GC3_FUSED", "1")                           # the decision context
        with pytest.raises(_Full):
            call(A, B)
        monkeypatch.delenv("GC3_FUSED")


@needs_torch
def test_a_sequential_collective_goes_straight_to_the_gc3_communicator_only_where_its_dist_method_would_serve():
    """The sequential paths hand a collective to the gc3 group's communicator directly only for
    contiguous CUDA tensors on the group's GPU; anything else (another group, another GPU, a
    strided tensor, a group with no communicator yet) goes through torch.distributed."""
    import types

    from runtime_cuda.torch_dist import ops

    def tensor(device="cuda:0", contiguous=True):
        return types.SimpleNamespace(is_cuda=device.startswith("cuda"), device=device,
                                     is_contiguous=lambda: contiguous)
    log = []
    pg = types.SimpleNamespace(_comm="comm", _device="cuda:0", _submit=lambda *a: log.append(("direct",) + a))

    def call(group, send, recv):
        log.clear()
        ops._collective(group, "allreduce", send, recv, 8, "sum", lambda: log.append(("dist",)))
        return log[0][0]
    t = tensor()
    assert call(pg, t, t) == "direct" and log[0][1:] == ("comm", "allreduce", t, t, 8, "sum")
    assert call(pg, tensor("cuda:1"), tensor("cuda:1")) == "dist"
    assert call(pg, t, tensor("cuda:1")) == "dist"
    assert call(pg, tensor(contiguous=False), t) == "dist"
    assert call(pg, tensor("cpu"), tensor("cpu")) == "dist"
    assert call(types.SimpleNamespace(_comm=None, _device=None), t, t) == "dist"
    assert call(types.SimpleNamespace(), t, t) == "dist"          # not a gc3 group


def _tile_store_ranks(n, tmp_path, *flags):
    """tests/gpu_programs/torch_tile_store.py on n ranks (see there for what it checks)."""
    pytest.importorskip("cupy")
    pytest.importorskip("triton")
    from test_torch_backend import spawn_ranks, tuned_catalog
    if torch.cuda.get_device_capability(0)[0] < 9:
        pytest.skip("the tile-store GEMM needs TMA (compute capability 9.0 and up)")
    # The sequential path's collectives on ranks sharing a GPU (no NCCL there): a tuned catalog's.
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH_FALLBACK="0", NCCL_NVLS_ENABLE="0", GC3_TIMEOUT_S="90",
               GC3_FUSED_TIMEOUT="5", GC3_CACHE_DIR=str(tmp_path / "cache"))
    if "--spread" in flags:
        del env["GC3_TORCH_FALLBACK"]     # one GPU a rank: the machine's catalog, NCCL for what it leaves
    else:
        env["GC3_CONFIG"] = str(tuned_catalog(n, tmp_path))
    env.pop("GC3_FUSED_EXCHANGE", None)     # the default exchange is the one under test
    outs = spawn_ranks([str(ROOT / "tests" / "gpu_programs" / "torch_tile_store.py")], n, tmp_path, env, *flags,
                       says="ALL OK rank={rank}", timeout=400)
    for needed in ("gemm_a2a served by the tile-store GEMM", "ag_gemm served by the tile-store GEMM",
                   "gemm_ar cuda graph replay", "ag_gemm cuda graph replay", "back to back gemm_rs",
                   "back to back ag_gemm", "ag_gemm without A", "ag_gemm trace",
                   "the copy engines carrying the peers' tiles"):
        assert needed in outs[0], f"{needed!r} did not run on rank 0:\n{outs[0][-3000:]}"
    spanning = f"({n * 64}, 200, 17600)"       # tiles of two ranks' rows
    for needed in (f"gemm_ar {spanning} call 5", f"gemm_rs cuda graph replay {spanning}", f"gemm_a2a {spanning} call 1"):
        assert n % 2 or needed in outs[0], f"{needed!r} did not run on rank 0:\n{outs[0][-3000:]}"
    assert "a missing rank is reported, not waited for" in outs[1], outs[1][-3000:]
    print("\n".join(line for out in outs for line in out.splitlines() if "ag_gemm trace" in line))


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("n", [2, 4])
def test_tile_store_gemm_on_ranks_sharing_one_gpu(n, tmp_path):
    _tile_store_ranks(n, tmp_path)


@pytest.mark.multigpu
@needs_torch
def test_tile_store_gemm_one_gpu_per_rank(tmp_path):
    _tile_store_ranks(torch.cuda.device_count(), tmp_path, "--spread")


class _FakeGroup:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


def test_tile_store_refusals_name_what_is_missing(monkeypatch):
    """Every shape the tile-store GEMM cannot take is named (CPU tensors stand in: refusal reads
    only shapes, strides, dtypes and the GPU's capability)."""
    from runtime_cuda.torch_dist import tile_store
    monkeypatch.setattr(tile_store, "_triton_missing", lambda: "")
    monkeypatch.setattr(tile_store, "_capability", lambda device: 9)
    pg = _FakeGroup(4)
    M = 4 * tile_store.BM

    def why(m=M, k=200, n=296, dtype=torch.bfloat16, b_t=False, group=pg):
        A = torch.zeros((m, k), dtype=dtype)
        B = torch.zeros((n, k), dtype=dtype).t() if b_t else torch.zeros((k, n), dtype=dtype)
        return tile_store.refusal(group, "gemm_rs", A, B)

    assert why() == ""
    assert "multiples of 8" in why(k=201) and "multiples of 8" in why(n=300 - 1)
    assert f"multiple of {tile_store.MIN_BM}" in why(m=M + 8)
    assert why(m=4 * tile_store.MIN_BM) == ""        # a rank's rows: one tile of the lower height
    assert "float32" in why(dtype=torch.float32)
    assert "strided" in why(b_t=True)
    assert "at most 8" in why(group=_FakeGroup(9), m=9 * tile_store.BM)
    # All-gather + GEMM: A is the shard, whose rows alone must be whole tiles.
    shard = torch.zeros((tile_store.BM, 200), dtype=torch.bfloat16)
    assert tile_store.refusal(pg, "ag_gemm", shard, torch.zeros((200, 296), dtype=torch.bfloat16)) == ""
    assert f"a shard of {tile_store.BM + 8} rows" in tile_store.refusal(
        pg, "ag_gemm", torch.zeros((tile_store.BM + 8, 200), dtype=torch.bfloat16),
        torch.zeros((200, 296), dtype=torch.bfloat16))
    monkeypatch.setattr(tile_store, "_capability", lambda device: 8)
    assert "TMA" in why()
    monkeypatch.setattr(tile_store, "_triton_missing", lambda: "Triton is not importable (x)")
    assert why() == "Triton is not importable (x)"


def test_the_tile_store_hands_a_call_it_refuses_to_the_collectives(monkeypatch):
    from runtime_cuda.torch_dist import ops, overlap, tile_store
    pg = _FakeGroup(2)
    monkeypatch.setattr(ops, "_capturing", lambda: False)
    monkeypatch.setattr(overlap, "matmul_reduce_scatter", lambda *a: "collectives")
    monkeypatch.setattr(tile_store, "matmul_reduce_scatter", lambda *a, peer_tiles: f"tile-store {peer_tiles}")
    A, B = torch.zeros((256, 16), dtype=torch.bfloat16), torch.zeros((16, 8), dtype=torch.bfloat16)
    monkeypatch.setattr(tile_store, "refusal", lambda *a: "no Triton")
    assert ops._tile_store("matmul_reduce_scatter", "store", pg, A, B, 1, "t") == "collectives"
    pg2 = _FakeGroup(2)       # the answer is kept per group and shape: a new group asks again
    monkeypatch.setattr(tile_store, "refusal", lambda *a: "")
    assert ops._tile_store("matmul_reduce_scatter", "copy-engine", pg2, A, B, 1, "t") == "tile-store copy-engine"
    monkeypatch.setattr(ops, "_capturing", lambda: True)       # a capture of a shape never mapped
    monkeypatch.setattr(tile_store, "ready", lambda *a: False)
    assert ops._tile_store("matmul_reduce_scatter", "store", pg2, A, B, 1, "t") == "collectives"
    # All-gather + GEMM takes overlap.py's arguments; it multiplies by one B.
    monkeypatch.setattr(ops, "_capturing", lambda: False)
    monkeypatch.setattr(overlap, "all_gather_matmul", lambda *a: ("collectives", a[2:]))
    monkeypatch.setattr(tile_store, "all_gather_matmul", lambda *a: ("tile-store", a[2:]))
    assert ops._tile_store("all_gather_matmul", "store", pg2, A, [B], 1, True, "t") == ("tile-store", ([B], 1, True, "t"))
    assert ops._tile_store("all_gather_matmul", "store", pg2, A, [B, B], 1, False, "t")[0] == "collectives"


def test_auto_runs_sequential_where_the_measured_tile_store_cannot_serve(monkeypatch):
    """A measured table's fused entry timed the tile-store GEMM: where that refuses the call,
    auto takes the sequential path rather than the collectives' pipeline; a forced call still
    runs fused."""
    from runtime_cuda.torch_dist import ops, tile_store
    monkeypatch.delenv("GC3_FUSED_EXCHANGE", raising=False)
    monkeypatch.setattr(ops, "_choose", lambda *a: choice.Choice(True, 1, "measured"))
    monkeypatch.setattr(tile_store, "refusal", lambda *a: "no Triton")
    A, B = torch.zeros((256, 16), dtype=torch.bfloat16), torch.zeros((16, 8), dtype=torch.bfloat16)
    run, why = ops._gemm_fused("gemm_rs", "t", _FakeGroup(2), A, B, None, None, "matmul_reduce_scatter")
    assert run is None and "tile-store" in why and "no Triton" in why
    run, why = ops._gemm_fused("gemm_rs", "t", _FakeGroup(2), A, B, "fused", None, "matmul_reduce_scatter")
    assert run is not None and why == ""


def test_a_measured_all_gather_entry_holds_only_where_the_tile_store_serves(monkeypatch):
    """All-gather + GEMM: the measured fused entry timed the tile-store GEMM of one B; several Bs,
    or operands it refuses, make auto sequential, and a forced call is not second-guessed."""
    from runtime_cuda.torch_dist import ops, tile_store
    monkeypatch.delenv("GC3_FUSED_EXCHANGE", raising=False)
    monkeypatch.setattr(tile_store, "refusal", lambda *a: "")
    A, B = torch.zeros((256, 16), dtype=torch.bfloat16), torch.zeros((16, 8), dtype=torch.bfloat16)
    assert ops._unmeasured(_FakeGroup(2), "ag_gemm", A, [B], None) == ""
    assert "2 matrices B" in ops._unmeasured(_FakeGroup(2), "ag_gemm", A, [B, B], None)
    assert ops._unmeasured(_FakeGroup(2), "ag_gemm", A, [B, B], "fused") == ""
    monkeypatch.setattr(tile_store, "refusal", lambda *a: "no Triton")
    assert "no Triton" in ops._unmeasured(_FakeGroup(2), "ag_gemm", A, [B], "auto")
    monkeypatch.setenv("GC3_FUSED_EXCHANGE", "collective")          # the user chose the exchange
    assert ops._unmeasured(_FakeGroup(2), "ag_gemm", A, [B], None) == ""


def test_fused_entries_come_from_bench_lines_that_timed_the_sequential_path(tmp_path):
    from runtime_cuda.fused import records
    from runtime_cuda.torch_dist import bench_fused
    v = {"seq_nccl_us": 100.0, "auto_us": 90.0, "fused_us": 80.0, "graph_auto_us": 85.0, "graph_fused_us": 84.0}
    lines = [records.format_line("gemm_rs", 4, {"M": 8192, "K": 28672, "N": 8192}, "bfloat16", v, "sequential",
                                 "ok", "4xH100", date="2026-11-27"),
             records.format_line("gemm_a2a", 4, {"M": 2048, "K": 4096, "N": 4096}, "bfloat16",
                                 dict(v, fused_us=89.0), "sequential", "ok", "4xH100", date="2026-11-27"),
             records.format_line("gemm_ar", 4, {"M": 1024, "K": 28672, "N": 8192}, "bfloat16", v, "fused",
                                 "ok", "4xH100", date="2026-11-27"),
             records.format_line("gemm_rs", 2, {"M": 8192, "K": 28672, "N": 8192}, "bfloat16", v, "sequential",
                                 "ok", "2xH100", date="2026-11-27")]
    path = tmp_path / "fused.txt"
    path.write_text("\n".join(lines) + "\n")
    entries, skipped = bench_fused.entries_from_records(records.read(path), 4, ["gemm_rs", "gemm_ar", "gemm_a2a"])
    got = {e["op"]: e for e in entries}
    assert set(got) == {"gemm_rs", "gemm_a2a"} and len(skipped) == 1 and "gemm_ar" in skipped[0]
    rs = got["gemm_rs"]
    assert rs["shape"] == {"M": 8192, "K": 7168, "N": 8192} and rs["path"] == "fused"     # K as one rank holds it
    assert (rs["fused_us"], rs["sequential_us"], rs["graph_path"]) == (80.0, 90.0, "sequential")  # 84 > 0.98 * 85
    assert got["gemm_a2a"]["path"] == "sequential" and got["gemm_a2a"]["shape"]["K"] == 4096   # 89 > 0.98 * 90
    assert "peer_tiles" not in rs                    # a line without the copy engines' time
    # With the copy engines' time: the faster way of sending the peers' tiles by 1%, and its time.
    # 85 < 0.99 * 89: the copy engines, whose time then beats the sequential 90 by 2%;
    # 88.5 > 0.99 * 89: the stores, and 89 does not.
    for ce, tiles, fused_us, way in ((85.0, "copy-engine", 85.0, "fused"), (88.5, "store", 89.0, "sequential")):
        line = records.format_line("gemm_a2a", 4, {"M": 2048, "K": 4096, "N": 4096}, "bfloat16",
                                   dict(v, fused_us=89.0, fused_ce_us=ce), "sequential", "ok", "4xH100",
                                   date="2026-11-28")
        path.write_text(line + "\n")
        (e,), _ = bench_fused.entries_from_records(records.read(path), 4, ["gemm_a2a"])
        assert (e["peer_tiles"], e["fused_store_us"], e["fused_ce_us"]) == (tiles, 89.0, ce), e
        assert (e["fused_us"], e["path"]) == (fused_us, way), e
    # A line that timed gc3's own sequential path decides whatever auto ran, without a graph_path.
    line = records.format_line("gemm_ar", 4, {"M": 1024, "K": 28672, "N": 8192}, "bfloat16",
                               dict(v, seq_gc3_us=78.0), "fused", "ok", "4xH100", date="2026-11-28")
    path.write_text(line + "\n")
    (e,), _ = bench_fused.entries_from_records(records.read(path), 4, ["gemm_ar"])
    assert (e["path"], e["sequential_us"], e["fused_us"]) == ("sequential", 78.0, 80.0) and "graph_path" not in e
    path.write_text("\n".join(lines) + "\n")
    catalog = tmp_path / "catalog.json"
    catalog.write_text('{"fused": {"provenance": {"4xH100": {"hw": "4xH100"}}, "entries": []}}')
    bench_fused.write_section(catalog, entries, None, "from the bench")
    section = json.loads(catalog.read_text())["fused"]
    assert section["edits"] == ["from the bench"] and section["provenance"] == {"4xH100": {"hw": "4xH100"}}
    assert len(section["entries"]) == 2


def test_tile_shape_halves_tiles_only_where_they_would_leave_most_sms_idle():
    """128 x 256 wherever the call's tiles fill more than half the SMs; rows halved where a rank's
    rows are not whole tiles of 128, or (64 rows a rank, even ranks, not all-gather + GEMM) a tile
    of two ranks' rows; where a few rows leave most SMs idle, the next smaller tile, rows then
    columns, and never past one wave.  Of the benchmark's grid at 2 and 4 GPUs, only the
    all-reduce's M = 256 rows change."""
    from runtime_cuda.torch_dist import bench_fused, tile_store
    shape = tile_store.tile_shape
    assert shape(8192, 8192, 4, 132) == (tile_store.BM, tile_store.BN) == (128, 256)
    assert shape(256, 16384, 4, 132) == (128, 256)      # two ranks' 64 rows a tile: 128 tiles
    assert shape(256, 8192, 4, 132) == (128, 128)       # 64 such tiles of 256 columns fill half
    assert shape(256, 8192, 4, 132, spanning=False) == (64, 256)
    assert shape(256, 4096, 4, 132) == (64, 128)        # spanning tiles fill half at either width
    assert shape(256, 4096, 2, 132) == (64, 128)        # 32 tiles of 128 x 256
    assert shape(256, 16384, 2, 132) == (128, 256)      # 128 tiles: one wave already
    assert shape(64, 128, 1, 132) == (64, 128)          # as small as it goes
    assert shape(192, 16384, 3, 132) == (64, 256)       # odd ranks: no pairs
    assert shape(1024, 296, 4, 16) == (128, 256)
    for M in (64, 128, 192, 256, 512, 1024, 4096):
        for N in (8, 128, 296, 2200, 4096, 16384):
            for G in (1, 2, 4, 8):
                if M % (G * tile_store.MIN_BM):
                    continue
                for sms in (16, 78, 114, 132):
                    bm, bn = shape(M, N, G, sms)
                    rows = M // G
                    assert (rows % bm == 0 or (bm == 2 * rows == 128 and G % 2 == 0)) and bm in (64, 128) \
                        and bn in (128, 256)
                    assert tile_store.span(M, G, bm) == (2 if bm > rows else 1)
                    halved = (bm, bn) != ((128 if rows % 128 == 0 or rows == 64 and G % 2 == 0 else 64), 256)
                    assert not halved or (M // bm) * -(-N // bn) <= sms, (M, N, G, sms)
    changed = {(G, op, M, K, N) for G in (2, 4) for op, M, K, N in bench_fused.grid(bench_fused.OPS, False)
               if shape(M, N // G if op == "ag_gemm" else N, G, 132, spanning=op != "ag_gemm") != (128, 256)}
    assert changed and {(op, M) for _, op, M, _, _ in changed} == {("gemm_ar", 256)}


def test_a_tile_the_user_asks_for_is_taken_or_refused_by_name(monkeypatch):
    """GC3_FUSED_TILE replaces the choice where the shape can take it; elsewhere InputError
    names the setting and why, and a malformed value names what was expected."""
    from gc3 import settings
    from gc3.errors import InputError
    from runtime_cuda.torch_dist import tile_store
    shape = tile_store.tile_shape
    assert shape(8192, 8192, 4, 132, (64, 128)) == (64, 128)
    assert shape(256, 8192, 4, 132, (64, 256)) == (64, 256)
    assert shape(256, 8192, 4, 132, (128, 256)) == (128, 256)       # a tile of two ranks' rows
    with pytest.raises(InputError, match=r"GC3_FUSED_TILE=128x256: 64 rows a rank .* only in GEMM \+ reduce"):
        shape(256, 8192, 4, 132, (128, 256), spanning=False)
    with pytest.raises(InputError, match="192 rows a rank are not whole tiles of 128"):
        shape(768, 8192, 4, 132, (128, 128))
    with pytest.raises(InputError, match="GC3_FUSED_TILE=.*expected ROWSxCOLUMNS"):
        settings.get("GC3_FUSED_TILE", {"GC3_FUSED_TILE": "96x256"})
    assert settings.get("GC3_FUSED_TILE", {"GC3_FUSED_TILE": " 128X128 "}) == (128, 128)


def test_the_tile_store_table_points_each_rank_at_the_right_peers_slots(monkeypatch):
    """The address table of one shape (tile_store._Shape), on rank 1 of 4: its rows' tiles land in
    slot 1 of each owner's buffer, its sums in block 1 of every rank's result, it flags each rank's
    own flags and reads its own slots and result; the call counters stay with the group's buffers,
    which every K of (op, M, N, dtype) shares."""
    from runtime_cuda.torch_dist import tile_store
    # As many SMs as the shape has tiles of 128 x 256: tile_shape keeps those.
    G, me, M, N = 4, 1, 4 * 256, 296
    slot = (M // G) * N * 2
    tiles = (M // G // tile_store.BM) * 2
    keys = []
    group, pg, made = _fake_tile_group(monkeypatch, G, me, keys)
    sh = tile_store._Shape(group, pg, "gemm_ar", M, 200, N, torch.bfloat16)
    st = made[keys[0][0]]
    assert keys[0][1] == {"stage": G * slot, "flags": 4 * 2 * G * tiles, "result": G * slot}
    t = sh.table.tolist()
    assert len(t) == 5 * G + 8 and t[5 * G + 5:] == [0, 0, 0]     # no outbox: the GEMM stores across the link
    for p in range(2):
        assert t[p * G:(p + 1) * G] == [st.buf("stage", d, p) + me * slot for d in range(G)]
        assert t[2 * G + p] == st.buf("stage", me, p)
        assert t[2 * G + 2 + p] == st.buf("result", me, p)
        assert t[2 * G + 4 + p * G:2 * G + 4 + (p + 1) * G] == [st.buf("result", q, p) + me * slot for q in range(G)]
    assert t[4 * G + 4:5 * G + 4] == [st.buf("flags", d, 0) for d in range(G)]
    assert t[5 * G + 4] == 12345
    # The next rank's rows first, each rank's own last; one counter a program, shared by every K.
    assert sh.scalars[4] == 2 * (M // G // tile_store.BM)         # the first block
    assert sh.cnt.numel() - 1 == sh.grid == (M // tile_store.BM) * 2
    other_k = tile_store._Shape(group, pg, "gemm_ar", M, 456, N, torch.bfloat16)
    assert other_k.cnt is sh.cnt and keys[1][0] == keys[0][0]
    # The table lives with the buffers too: a captured launch of a dropped _Shape still addresses it.
    assert other_k.table is sh.table and st.kept["table"] is sh.table
    # All-gather + GEMM: every rank's gather buffer by parity, every rank's row-block counts;
    # the buffers and counters are the (M, K, N)'s, a tile counter after the call counters.
    K = 200
    ag = tile_store._Shape(group, pg, "ag_gemm", M, K, N, torch.bfloat16)
    key, sizes = keys[2]
    st = made[key]
    assert key[1:3] == ("ag_gemm", M) and K in key and N in key
    assert sizes == {"gather": M * K * 2, "flags": 4 * G * (M // G // tile_store.BM)}
    t = ag.table.tolist()
    assert len(t) == 3 * G + 1 and t[3 * G] == 12345
    for p in range(2):
        assert t[p * G:(p + 1) * G] == [st.buf("gather", d, p) for d in range(G)]
    assert t[2 * G:3 * G] == [st.buf("flags", d, 0) for d in range(G)]
    assert ag.grid == 16 and ag.cnt.numel() == 18 and ag.cnt is not sh.cnt
    # Copiers: 4 a rank and 8 by default, never more than the blocks of the shard to push.
    assert ag.scalars == (M, N, K, M // G, me, min(24, 2 * -(-K // tile_store.COPY_COLUMNS)))
    monkeypatch.setenv("GC3_FUSED_GATHER_COPIERS", "3")
    assert tile_store._Shape(group, pg, "ag_gemm", M, 8192, N, torch.bfloat16).scalars[-1] == 3
    assert tile_store._Shape(group, pg, "ag_gemm", M, 456, N, torch.bfloat16).cnt is not ag.cnt


def _fake_tile_group(monkeypatch, G: int, me: int, keys: Optional[list] = None):
    """(group, pg, the states by key) of rank `me` of `G` for tile_store._Shape without a GPU: 16
    SMs, bf16, each rank's buffers at made-up addresses (ShapeState), one state per key; the
    (key, sizes) asked for are appended to `keys`."""
    from types import SimpleNamespace

    from runtime_cuda.fused.groups import ShapeState
    from runtime_cuda.torch_dist import tile_store
    monkeypatch.setattr(tile_store, "_sms", lambda device: 16)
    monkeypatch.setattr(tile_store, "_dt", lambda dtype: "bf16")
    made = {}

    def shape(key, sizes):
        if keys is not None:
            keys.append((key, sizes))
        bases = {name: {r: (1 + i) * 10 ** 9 + r * 10 ** 7 for r in range(G)} for i, name in enumerate(sizes)}
        return made.setdefault(key, ShapeState(G, sizes, bases, {}))
    group = SimpleNamespace(shape=shape, watchdog=SimpleNamespace(failed_ptr=12345, timeout=5.0, name=lambda what: 7))
    return group, SimpleNamespace(size=lambda: G, rank=lambda: me, _device=torch.device("cpu")), made


def test_the_copy_engines_carry_each_chunk_into_the_peers_slot_then_its_flags(monkeypatch):
    """GC3_FUSED_PEER_TILES=copy-engine's plan (tile_store._CopyPlan) for the three operators on
    rank 1 of 4: buffers of their own; the kernel's tiles for peer d go to the outbox's block d
    and their flags to the shadow's; a stream a peer in the kernel's order (the next rank's
    first); each chunk of row blocks waits for its count to reach a call's tiles, goes into slot
    1 of the peer's stage of the call's parity, then its flags into the peer's flags [0][1][tiles],
    which is what the peer's sum or copy reads and waits for."""
    from runtime_cuda.torch_dist import tile_store
    G, me, N = 4, 1, 296
    rows = 10 * tile_store.BM                       # 10 row blocks: chunks of 8 and 2
    M = G * rows
    pn, T = 2, 10 * 2
    group, pg, _ = _fake_tile_group(monkeypatch, G, me)
    for op in ("gemm_rs", "gemm_ar", "gemm_a2a"):
        plain = tile_store._Shape(group, pg, op, M, 200, N, torch.bfloat16)
        sh = tile_store._Shape(group, pg, op, M, 200, N, torch.bfloat16, True)
        assert (sh.bm, sh.bn, sh.span) == (tile_store.BM, tile_store.BN, 1) and plain.copies is None
        assert sh.state is not plain.state and sh.cnt is not plain.cnt
        assert sh.constexprs["CHUNK"] == 8 and plain.constexprs["CHUNK"] == 0
        outbox, shadow, counts = sh.state.kept["outbox"]
        assert outbox.numel() == G * rows * N and shadow.numel() == G * T and counts.numel() == G * 2
        assert sh.table.tolist()[5 * G + 5:] == [outbox.data_ptr(), shadow.data_ptr(), counts.data_ptr()]
        st, slot = sh.state, rows * N * 2
        assert [d for d, _ in sh.copies.peers] == [2, 3, 0]
        for d, steps in sh.copies.peers:
            assert len(steps) == 2
            for c, (count, per, data, src, nbytes, flags, shade, fbytes) in enumerate(steps):
                lo, blocks = 8 * c, (8, 2)[c]
                assert count == counts.data_ptr() + 4 * (d * 2 + c) and per == blocks * pn
                at = lo * tile_store.BM * N * 2
                assert data == [st.buf("stage", d, p) + me * slot + at for p in range(2)]
                assert src == outbox.data_ptr() + d * slot + at and nbytes == blocks * tile_store.BM * N * 2
                assert flags == st.buf("flags", d, 0) + 4 * (me * T + lo * pn)
                assert shade == shadow.data_ptr() + 4 * (d * T + lo * pn) and fbytes == 4 * blocks * pn
    # At most COPY_CHUNKS chunks a peer, of whole groups of GROUP_M row blocks.
    assert [tile_store.chunk_blocks(rb) for rb in (1, 8, 10, 32, 33, 64, 128)] == [8, 8, 8, 8, 16, 16, 32]
    assert all(-(-rb // tile_store.chunk_blocks(rb)) <= tile_store.COPY_CHUNKS for rb in range(1, 300))


@pytest.mark.parametrize("capture", [True, False], ids=["graph", "queued"])
@pytest.mark.parametrize("G, op", [(2, "gemm_rs"), (3, "gemm_ar")])
def test_a_copy_engine_call_queues_its_copies_after_the_kernel_and_joins_them(monkeypatch, capture, G, op):
    """tile_store._CopyPlan.run on rank 0 of G (a fake driver records the calls): the kernel is
    launched first; then, forked from the plan's own stream onto a stream a peer (every one of
    them before any work, so that no peer's copies wait for another's), each
    chunk waits for its count to reach its tiles, puts the count back to 0, is copied into the
    slot of the call's parity, then its flags; then the caller's stream waits for the plan's.
    That work is captured once a parity and replayed by one launch a call; where the driver
    cannot capture it, the same work is queued at every call.  Streams and events are made once."""
    import contextlib

    from runtime_cuda.core import cudadriver
    from runtime_cuda.torch_dist import tile_store
    me, N = 0, 296
    rows = 10 * tile_store.BM
    group, pg, _ = _fake_tile_group(monkeypatch, G, me)
    sh = tile_store._Shape(group, pg, op, G * rows, 200, N, torch.bfloat16, True)
    sides = [f"side {d}" for d, _ in sh.copies.peers]
    log, streams = [], iter(["origin"] + sides)

    def graph(origin, enqueue):
        if not capture:
            raise RuntimeError("cuStreamBeginCapture failed: not supported")
        before = len(log)
        enqueue()
        captured = log[before:]
        del log[before:]
        return ("graph", origin, tuple(captured))
    fake = dict(pointers=lambda *a: a, new_event=lambda: "event",
                new_stream=lambda: next(streams),
                wait_value32=lambda s, a, v: log.append(("wait", s, a, v)),
                write_value32=lambda s, a, v: log.append(("write", s, a, v)),
                copy=lambda s, d, src, n: log.append(("copy", s, d, src, n)),
                join=lambda s, e, after: log.append(("join", s, e, after)),
                graph=graph, graph_launch=lambda g, s: log.append(("launch", g, s)))
    for name, fn in fake.items():
        monkeypatch.setattr(cudadriver, name, fn)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "_get_device_index", lambda d, optional=False: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 77 + index, raising=False)

    def queued(par):
        want = [("join", side, "event", "origin") for side in sides]
        for side, (d, steps) in zip(sides, sh.copies.peers):
            for count, per, data, src, nbytes, flags, shadow, fbytes in steps:
                want += [("wait", side, count, per), ("write", side, count, 0),
                         ("copy", side, data[par], src, nbytes), ("copy", side, flags, shadow, fbytes)]
        return want + [("join", "origin", "event", side) for side in sides]
    for call in (1, 2, 3):
        log.clear()
        sh.copies.run(lambda: log.append("kernel"))
        par = (call - 1) & 1
        if capture:
            want = ["kernel", ("launch", ("graph", "origin", tuple(queued(par))), "origin")]
        else:
            want = ["kernel"] + queued(par)
        assert log == want + [("join", 77, "event", "origin")], call
    assert sh.state.epoch == 3
    # Another K of the shape (its buffers and its call count are the same) keeps the plan, and
    # so does the shape made again after the group's table let it go.
    again = tile_store._Shape(group, pg, op, G * rows, 456, N, torch.bfloat16, True)
    assert again.copies is sh.copies and again.state is sh.state


def test_copy_engines_asked_for_without_a_driver_say_so_and_store(monkeypatch):
    """GC3_FUSED_PEER_TILES=copy-engine where cuda.bindings finds no driver: the GEMM stores the
    tiles, and the log says why (once); a captured call stores them without a word; unset, stores."""
    from types import SimpleNamespace

    from runtime_cuda.core import cudadriver
    from runtime_cuda.torch_dist import tile_store
    said = []
    monkeypatch.setattr(tile_store, "_log", lambda: SimpleNamespace(warning=lambda *a: said.append(a[0] % a[1:])))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert tile_store._copy_engines() is False
    monkeypatch.setenv("GC3_FUSED_PEER_TILES", "copy-engine")
    monkeypatch.setattr(cudadriver, "driver", lambda *a: None)
    tile_store._no_driver.cache_clear()
    assert tile_store._copy_engines() is False and tile_store._copy_engines() is False
    assert len(said) == 1 and "cuda-bindings" in said[0], said
    monkeypatch.setattr(cudadriver, "driver", lambda *a: object())
    assert tile_store._copy_engines() is True
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tile_store._copy_engines() is False


def test_the_tile_store_trace_measures_the_pushes_inside_the_tiles():
    """overlap.covered, what either pipeline's GC3_FUSED_TRACE reports: the share of the
    transfers' time inside the union of the compute intervals (it can say 0); the all-gather's
    trace reads its pushes against its tiles."""
    from runtime_cuda.torch_dist import overlap, tile_store
    assert overlap.covered([(0, 10)], [(20, 30)]) == 0.0
    assert overlap.covered([(0, 10)], [(0, 4), (3, 10)]) == 1.0       # overlapping tiles count once
    assert overlap.covered([(0, 10), (10, 20)], [(5, 15)]) == 0.5
    assert overlap.covered([], [(0, 1)]) == 0.0
    trace = tile_store.Trace(torch.tensor([[0, 10], [2, 6], [8, 30]]), copiers=1)
    assert trace.intervals() == ([(0, 10)], [(2, 6), (8, 30)])
    assert trace.overlap() == 0.6


def test_the_tile_store_launch_passes_what_tritons_launcher_parses(monkeypatch):
    """tile_store._direct, a later call's launch: Triton's C launcher gets the grid, torch's raw
    stream, the function, the launch flags, the scratch (made once, kept under its name with the
    shape's buffers), no profile scratch, the packed metadata, no hooks, then the call's
    arguments and the constexprs; a launcher without those fields goes through compiled.run."""
    from types import SimpleNamespace

    from runtime_cuda.torch_dist import tile_store
    launches, made = [], []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda n, dtype, device: made.append((n, device)) or real_empty(n, dtype=dtype))
    launcher = SimpleNamespace(launch=lambda *a: launches.append(a), global_scratch_size=64, global_scratch_align=128,
                               profile_scratch_size=0, num_ctas=1, launch_cooperative_grid=False, launch_pdl=False)
    compiled = SimpleNamespace(run=launcher, function=77, packed_metadata=(8, 1, 1000))
    kept, dev = {}, torch.device("cuda", 1)
    run = tile_store._direct(compiled, 132, ("bf16", 4), dev, kept, ("scratch", "k", 132))
    run("A", "B", 5)
    run("A2", "B", 6)
    scratch = kept[("scratch", "k", 132)]
    assert made == [(132 * 64, dev)] and scratch.numel() == 132 * 64
    assert launches[0][:3] == (132, 1, 1) and launches[0][3] == 1001
    assert launches[0][4:13] == (77, False, False, scratch, None, (8, 1, 1000), None, None, None)
    assert launches[0][13:] == ("A", "B", 5, "bf16", 4) and launches[1][13:] == ("A2", "B", 6, "bf16", 4)
    # Another launch of the same name (a _Shape made again) takes the kept scratch.
    tile_store._direct(compiled, 132, ("bf16", 4), dev, kept, ("scratch", "k", 132))("A", "B", 5)
    assert len(made) == 1 and launches[-1][7] is scratch
    # A launcher this was not written against: the call goes through compiled.run.
    ran = []
    old = SimpleNamespace(run=lambda *a: ran.append(a), function=77, packed_metadata=(8, 1, 1000),
                          launch_metadata=lambda grid, stream, *args: "meta")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=55))
    tile_store._direct(old, 132, ("bf16",), dev, {}, ("scratch",))("A", 5)
    assert ran == [(132, 1, 1, 55, 77, (8, 1, 1000), "meta", None, None, "A", 5, "bf16")]


def test_the_bench_times_paths_in_turn_each_under_its_own_peer_tiles(monkeypatch):
    """bench_fused.Timer.devices: warm-ups first, then rounds taken in turn (A B A B ...), each
    path's calls under its GC3_FUSED_PEER_TILES (None: as it is), put back after; a missing path
    (None) answers None."""
    from types import SimpleNamespace

    from runtime_cuda.torch_dist import bench_fused
    monkeypatch.setenv("GC3_FUSED_PEER_TILES", "store")
    timer = bench_fused.Timer(SimpleNamespace(), calls=2, rounds=3, warmup=1)
    monkeypatch.setattr(timer, "_sync", lambda: None)
    monkeypatch.setattr(timer, "_max", lambda v: v)

    class Event:
        def __init__(self, **kw):
            pass

        def record(self):
            self.at = len(seen)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.at - self.at) / 1000.0
    monkeypatch.setattr(torch.cuda, "Event", Event)
    seen = []
    a = lambda: seen.append(("a", os.environ.get("GC3_FUSED_PEER_TILES")))    # noqa: E731
    b = lambda: seen.append(("b", os.environ.get("GC3_FUSED_PEER_TILES")))    # noqa: E731
    got = timer.devices([a, None, b], [None, None, "copy-engine"])
    assert got == [1.0, None, 1.0]
    warm, rounds = seen[:2], seen[2:]
    assert warm == [("a", "store"), ("b", "copy-engine")]
    assert rounds == [("a", "store")] * 2 + [("b", "copy-engine")] * 2 + [("a", "store")] * 2 + \
        [("b", "copy-engine")] * 2 + [("a", "store")] * 2 + [("b", "copy-engine")] * 2
    assert os.environ["GC3_FUSED_PEER_TILES"] == "store"


def test_a_capture_that_fails_ends_and_leaves_no_graph(monkeypatch):
    """cudadriver.graph: where what it captures raises, the capture is ended, its graph given
    back, and the error goes on to the caller (the copy plan then queues call by call)."""
    from types import SimpleNamespace

    from runtime_cuda.core import cudadriver
    done = []
    ok = "success"
    cb = SimpleNamespace(
        CUresult=SimpleNamespace(CUDA_SUCCESS=ok), CUstream=type("CUstream", (), {}),
        CUstreamCaptureMode=SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1),
        cuStreamBeginCapture=lambda s, mode: done.append("begin") or (ok,),
        cuStreamEndCapture=lambda s: done.append("end") or (ok, "captured"),
        cuGraphDestroy=lambda g: done.append(("destroy", g)) or (ok,))
    monkeypatch.setattr(cudadriver, "driver", lambda *a: cb)
    origin = cb.CUstream()

    def fails():
        raise RuntimeError("cuStreamWaitValue32 failed: not capturable")
    with pytest.raises(RuntimeError, match="not capturable"):
        cudadriver.graph(origin, fails)
    assert done == ["begin", "end", ("destroy", "captured")]


def test_the_bench_row_puts_every_value_under_its_header():
    """gc3 bench --fused's table: a cell under every header, gc3's own sequential path (auto's
    other choice) beside seq-nccl's, n/a where a path did not run."""
    from types import SimpleNamespace

    from runtime_cuda.torch_dist import bench_fused as bf
    case = SimpleNamespace(op="gemm_ar", G=2, M=256, K=28672, N=8192)
    v = {"seq_nccl_us": 148.0, "seq_gc3_us": 166.0, "auto_us": 157.3, "fused_us": 156.8, "gemm_us": 94.5,
         "comm_nccl_us": 58.9}
    head, cells = bf.header().split(), bf.row(case, v, "fused", "ok").split()
    assert len(head) == len(cells)
    got = dict(zip(head, cells))
    assert (got["seq_nccl"], got["seq_gc3"], got["auto"], got["symm"]) == ("148.0", "166.0", "157.3", "n/a")
    assert got["seq/auto"] == "0.94x" and got["path"] == "fused"


def test_the_tune_times_a_close_call_again_and_keeps_each_paths_faster_median():
    """bench_fused.timed_again_if_close: a decision within RETIME_WITHIN is timed once more, each
    path keeping its lower median (one slow round of the sequential path no longer decides);
    a clear one is timed once."""
    from types import SimpleNamespace

    from runtime_cuda.torch_dist import bench_fused as bf
    runs = iter([[166.3, 161.8, 182.0], [132.4, 152.9, 169.3]])
    calls = []
    timer = SimpleNamespace(devices=lambda fns, modes: calls.append((fns, modes)) or next(runs))
    got = bf.timed_again_if_close(timer, ["seq", "one", "one"], [None, "store", "copy-engine"])
    assert got == [132.4, 152.9, 169.3] and len(calls) == 2
    assert calls[1] == (["seq", "one", "one"], [None, "store", "copy-engine"])
    assert bf._faster(min(got[1:]), got[0]) == "sequential"
    runs = iter([[200.0, 150.0, 140.0]])
    calls.clear()
    assert bf.timed_again_if_close(timer, ["seq", "one", "one"], [None, "store", "copy-engine"]) == [200.0, 150.0, 140.0]
    assert len(calls) == 1
