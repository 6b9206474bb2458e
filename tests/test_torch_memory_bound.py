"""The memory-bound torch operators (ops.py: fused_gemv_all_reduce,
fused_embedding_bag_all_to_all, fused_all_reduce_epilogue) and their benchmark:
CPU tests of the measured choice's routing, the flattened embedding-bag CSR, the
epilogue's arguments and arithmetic, the record lines and the grid; the GPU
program (tests/gpu_programs/torch_memory_bound.py) on gloo, and on ranks sharing
one GPU."""
import json
import os
import types
from pathlib import Path

import pytest

from runtime_cuda.fused import choice

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "gpu_programs" / "torch_memory_bound.py"
try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None
pytestmark = pytest.mark.skipif(torch is None, reason="torch not installed")


# --- routing: only a table entry saying "fused" (or the caller) reaches runtime_cuda.fused -----------------------
class FakeGroup:
    """A two-rank group the fused path would accept (the refusal is patched away)."""
    _comm = object()

    def size(self):
        return 2

    def _cuda(self, tensors, what):
        return None         # CPU tensors: no communicator, so no machine catalog but GC3_CONFIG's


@pytest.fixture
def routed(tmp_path, monkeypatch):
    """(use(entries), ran): runs the operators on FakeGroup with their fused kernels' launches
    and the sequential paths replaced by recorders; `ran` lists which ran."""
    from runtime_cuda.torch_dist import ops

    ran = []
    monkeypatch.delenv("GC3_FUSED", raising=False)
    monkeypatch.setattr(ops, "_refusal", lambda *a, **k: "")
    monkeypatch.setattr(ops, "_gemv_fused", lambda pg, x, w, repeat=None: (ran.append("gemv_allreduce"),
                                                              x.new_zeros(x.shape[0], w.shape[1]), "")[1:])
    monkeypatch.setattr(ops, "_ebag_fused", lambda pg, t, i, o, n: (ran.append("embedding_bag_alltoall"), t, "")[1:])
    # The epilogue's fused path calls the kernels itself (no runtime_cuda.fused entry point).
    monkeypatch.setattr(ops, "epilogue_fused", lambda *a, **k: (ran.append("allreduce_epilogue"), (a[0], ""))[1])
    for fn in ("gemv_sequential", "embedding_bag_sequential", "epilogue_sequential"):
        monkeypatch.setattr(ops, fn, lambda *a, _fn=fn, **k: ran.append(_fn))

    def use(entries):
        choice.forget()          # the same file, rewritten: forget what it decided
        path = tmp_path / "catalog.json"
        path.write_text(json.dumps({"version": 1, "algorithms": [], "fused": {"entries": entries}}))
        monkeypatch.setattr(choice, "catalog_path", lambda: path)
    return use, ran


def entry(op, shape, path, dtype="bfloat16", gpus=2):
    return {"op": op, "gpus": gpus, "dtype": dtype, "shape": shape, "path": path}


def calls(ops):
    x, w = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16)
    tables = torch.zeros(2, 10, 8)
    indices, offsets = torch.zeros(2, 12, dtype=torch.int32), torch.zeros(2, 5, dtype=torch.int32)
    e = torch.zeros(4, 16, dtype=torch.bfloat16)
    return {
        "gemv_allreduce": lambda **kw: ops.fused_gemv_all_reduce(x, w, FakeGroup(), **kw),
        "gemv vector": lambda **kw: ops.fused_gemv_all_reduce(x[0], w, FakeGroup(), **kw),
        "embedding_bag_alltoall": lambda **kw: ops.fused_embedding_bag_all_to_all(tables, indices, offsets,
                                                                                  FakeGroup(), **kw),
        "allreduce_epilogue": lambda **kw: ops.fused_all_reduce_epilogue(e, FakeGroup(), 0.5, **kw),
    }


# The shape each call above looks up: this rank's K, samples per rank (B / ranks), x's bytes.
MEASURED = [entry("gemv_ar", {"b": 3, "K": 64, "N": 128}, "fused"),
            entry("gemv_ar", {"b": 1, "K": 64, "N": 128}, "sequential"),
            entry("ebag_a2a", {"T": 2, "rows": 10, "dim": 8, "pooling": 3, "samples": 2}, "fused", "float32"),
            entry("ar_epilogue", {"bytes": 4 * 16 * 2}, "fused")]


def test_a_measured_fused_entry_sends_the_call_to_runtime_cuda_fused(routed):
    from runtime_cuda.torch_dist import ops
    use, ran = routed
    use(MEASURED)
    for name, call in calls(ops).items():
        ran.clear()
        call()
        want = "gemv_sequential" if name == "gemv vector" else name     # b=1 was measured sequential
        assert ran == [want], name


def test_unmeasured_shapes_and_other_machines_run_the_sequential_path(routed):
    from runtime_cuda.torch_dist import ops
    use, ran = routed
    use([dict(e, gpus=4) for e in MEASURED] + [dict(MEASURED[0], dtype="float16"),
                                               dict(MEASURED[3], shape={"bytes": 16})])
    for call in calls(ops).values():
        call()
    assert ran == ["gemv_sequential", "gemv_sequential", "embedding_bag_sequential", "epilogue_sequential"]


def test_the_caller_and_the_environment_force_a_path(routed, monkeypatch):
    from runtime_cuda.torch_dist import ops
    use, ran = routed
    use(MEASURED)
    for call in calls(ops).values():
        call(path="sequential")
    assert all(r.endswith("_sequential") for r in ran) and len(ran) == 4
    ran.clear()
    use([])
    for call in calls(ops).values():
        call(path="fused")
    assert ran == ["gemv_allreduce", "gemv_allreduce", "embedding_bag_alltoall", "allreduce_epilogue"]
    ran.clear()
    monkeypatch.setenv("GC3_FUSED", "1")
    calls(ops)["allreduce_epilogue"]()
    assert ran == ["allreduce_epilogue"]


def test_the_pooling_the_caller_gives_is_the_shape_looked_up(routed):
    from runtime_cuda.torch_dist import ops
    use, ran = routed
    use([entry("ebag_a2a", {"T": 2, "rows": 10, "dim": 8, "pooling": 8, "samples": 2}, "fused", "float32")])
    tables, indices, offsets = torch.zeros(2, 10, 8), torch.zeros(2, 12, dtype=torch.int32), torch.zeros(2, 5)
    ops.fused_embedding_bag_all_to_all(tables, indices, offsets.int(), FakeGroup(), pooling=8)
    ops.fused_embedding_bag_all_to_all(tables, indices, offsets.int(), FakeGroup())     # ceil(12 / 4) = 3
    assert ran == ["embedding_bag_alltoall", "embedding_bag_sequential"]
    for bad in (0, 2, 2.5, True):          # 2: 12 indices do not fit 4 bags of 2
        with pytest.raises(ValueError, match="pooling="):
            ops.fused_embedding_bag_all_to_all(tables, indices, offsets.int(), FakeGroup(), pooling=bad)


# --- the flattened CSR -------------------------------------------------------------------------------------------
def random_bags(seed, T, rows, dim, B, most=4, pad=3, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    tables = torch.randn(T, rows, dim, generator=g).to(dtype)
    counts = torch.randint(0, most + 1, (T, B), generator=g)
    offsets = torch.cat([torch.zeros(T, 1, dtype=torch.long), counts.cumsum(1)], 1)
    nnz = int(offsets[:, -1].max()) + pad
    indices = torch.randint(0, rows, (T, nnz), generator=g)
    indices[torch.arange(nnz) >= offsets[:, -1:]] = -7        # no bag's: anything may be there
    return tables, indices, offsets


def per_table(tables, indices, offsets, mode):
    return torch.cat([torch.nn.functional.embedding_bag(indices[t, :int(offsets[t, -1])], tables[t],
                                                        offsets[t, :-1], mode=mode)
                      for t in range(tables.shape[0])], dim=1)


@pytest.mark.parametrize("seed, T, rows, dim, B, most, pad", [
    (1, 3, 7, 4, 6, 3, 3), (2, 1, 5, 8, 4, 2, 0), (3, 8, 50, 16, 32, 6, 10), (4, 2, 3, 2, 5, 0, 1)])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_one_embedding_bag_over_the_flattened_tables_equals_a_loop_over_them(seed, T, rows, dim, B, most, pad, mode,
                                                                              index_dtype):
    from runtime_cuda.torch_dist import ops
    tables, indices, offsets = random_bags(seed, T, rows, dim, B, most, pad)
    want = per_table(tables, indices, offsets, mode)
    got = ops.embedding_bag_pool(tables, indices.to(index_dtype), offsets.to(index_dtype), mode)
    assert got.shape == (B, T * dim) and got.is_contiguous()
    assert torch.equal(got, want)


def test_the_flat_csr_offsets_every_table_and_never_reads_past_its_bags():
    from runtime_cuda.torch_dist import ops
    indices = torch.tensor([[1, 2, 9, 9], [0, 3, 1, -1]], dtype=torch.int32)
    offsets = torch.tensor([[0, 1, 2], [0, 3, 3]], dtype=torch.int32)
    flat, off = ops.flat_bags(indices, offsets, rows=5)
    assert flat.dtype == off.dtype == torch.int64
    assert flat.tolist() == [1, 2, 0, 0, 5 + 0, 5 + 3, 5 + 1, 5 + 0]
    assert off.tolist() == [0, 1, 2, 4 + 0, 4 + 3, 4 + 3]


# --- the epilogue --------------------------------------------------------------------------------------------------
X = torch.zeros(4, 8) if torch is not None else None


@pytest.mark.parametrize("kwargs, words", [
    ({"x": torch.zeros(4, 8, dtype=torch.int32) if torch else None}, "x must be a floating-point tensor"),
    ({"x": [1.0]}, "x must be a floating-point tensor"),
    ({"scale": float("inf")}, "scale must be a finite number"),
    ({"scale": True}, "scale must be a finite number"),
    ({"scale": "2"}, "scale must be a finite number"),
    ({"out_dtype": torch.int8 if torch else None}, "out_dtype must be a floating-point"),
    ({"out_dtype": "bfloat16"}, "out_dtype must be a floating-point"),
    ({"bias": torch.zeros(4) if torch else None}, r"bias has shape \(4,\), expected \(8,\)"),
    ({"bias": torch.zeros(1, 8) if torch else None}, r"bias has shape \(1, 8\)"),
    ({"bias": [0.0] * 8}, "bias must be a tensor"),
    ({"residual": torch.zeros(8, 4) if torch else None}, r"residual has shape \(8, 4\), expected \(4, 8\)"),
    ({"residual": torch.zeros(4, 8, dtype=torch.float16) if torch else None},
     "residual has dtype torch.float16, expected x's torch.float32$"),
    ({"bias": torch.zeros(8, dtype=torch.float16) if torch else None, "out_dtype": torch.bfloat16 if torch else None},
     "bias has dtype torch.float16, expected x's torch.float32 or out_dtype torch.bfloat16"),
    ({"x": torch.tensor(1.0) if torch else None, "bias": torch.zeros(1) if torch else None}, "bias has shape"),
    ({"bias": torch.zeros(8, device="meta") if torch else None}, "bias is on meta"),
])
def test_the_epilogue_names_the_argument_that_does_not_fit(kwargs, words):
    from runtime_cuda.torch_dist import ops
    args = dict({"x": X, "scale": None, "bias": None, "residual": None, "out_dtype": None}, **kwargs)
    with pytest.raises(ValueError, match=words):
        ops.fused_all_reduce_epilogue(args.pop("x"), FakeGroup(), **args)


@pytest.fixture(scope="module")
def gloo_one(tmp_path_factory):
    """A one-rank gloo group: the operators' sequential paths on the CPU."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("scale", [None, 0.25])
@pytest.mark.parametrize("terms", ["", "bias", "residual", "bias+residual"])
@pytest.mark.parametrize("dtype, out_dtype", [(torch.float32, None), (torch.float32, torch.bfloat16),
                                              (torch.bfloat16, None), (torch.bfloat16, torch.float32)]
                         if torch else [])
def test_the_epilogue_is_the_torch_arithmetic_and_leaves_x_alone(gloo_one, scale, terms, dtype, out_dtype):
    from runtime_cuda.torch_dist import ops
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 8, generator=g).to(dtype)
    bias = torch.randn(8, generator=g).to(dtype) if "bias" in terms else None
    residual = torch.randn(6, 8, generator=g).to(out_dtype or dtype) if "residual" in terms else None
    before = x.clone()
    got = ops.fused_all_reduce_epilogue(x, gloo_one, scale, bias, residual, out_dtype)
    want = x.double() * (1 if scale is None else scale)
    want = want + (0 if bias is None else bias.double()) + (0 if residual is None else residual.double())
    assert torch.equal(x, before) and got.dtype == (out_dtype or dtype) and got.shape == x.shape
    # at most two roundings of the narrower type, against float64
    ulp = 2 ** -7 if torch.bfloat16 in (dtype, out_dtype) else 2 ** -22
    assert float((got.double() - want).abs().max()) <= 2 * ulp * float(want.abs().max()), (got, want)


class _KeptGroup:
    """Stands in for the small kernels' group a fused epilogue call kept: records its launches."""

    def __init__(self):
        self.log = []

    def run_ptrs(self, *args, **kwargs):
        self.log.append((args, kwargs))


def test_a_repeated_epilogue_call_is_one_launch_of_what_its_first_call_kept(gloo_one, monkeypatch):
    """A call whose key the group kept goes straight to the kept launch with x's address, a new
    output and torch's current stream; any change the key covers (a term's address, the scale,
    the output type, the forced path, GC3_FUSED) or a strided x takes the full path (here the
    sequential one: gloo's CPU tensors)."""
    from runtime_cuda.torch_dist import ops
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0x77, raising=False)
    g = torch.Generator().manual_seed(9)
    x, bias = torch.randn(8, 8, generator=g), torch.randn(8, generator=g)
    group, words = _KeptGroup(), [[1, 2, 3]]
    kept = (group, 64, "float32", "float32", torch.float32, "oneshot", words, 0)
    # The group a gc3 call keeps its launches on (a Python object, as Gc3ProcessGroup is); its
    # full path is the sequential one on the gloo group.
    pg = types.SimpleNamespace(_gc3_epilogue_repeats={ops._epilogue_key(x, 0.5, bias, None, None, None): kept})
    sequential = ops.epilogue_sequential
    monkeypatch.setattr(ops, "epilogue_sequential", lambda x, _pg, *a: sequential(x, gloo_one, *a))
    out = ops.fused_all_reduce_epilogue(x, pg, 0.5, bias)
    assert out.shape == x.shape and out.dtype == torch.float32 and out.data_ptr() != x.data_ptr()
    assert group.log == [(((x.data_ptr(),), (out.data_ptr(),), 64, "float32", "sum", 0x77),
                          {"kind": "oneshot", "epilogue": words, "out_dtype": "float32"})]
    want = x * 0.5 + bias
    other_bias = bias.clone()
    for call in (lambda: ops.fused_all_reduce_epilogue(x, pg, 0.5, other_bias),
                 lambda: ops.fused_all_reduce_epilogue(x, pg, 0.25, bias),
                 lambda: ops.fused_all_reduce_epilogue(x, pg, 0.5, bias, out_dtype=torch.bfloat16),
                 lambda: ops.fused_all_reduce_epilogue(x, pg, 0.5, bias, path="sequential"),
                 lambda: ops.fused_all_reduce_epilogue(x.t().contiguous().t(), pg, 0.5, bias)):
        got = call()
        assert len(group.log) == 1 and got.shape == x.shape
    monkeypatch.setenv("GC3_FUSED", "0")
    got = ops.fused_all_reduce_epilogue(x, pg, 0.5, bias)
    assert len(group.log) == 1 and torch.allclose(got, want)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        ops.fused_all_reduce_epilogue(x, pg, [0.5], bias)   # unhashable: the checks say why


class _KeptComm:
    """Stands in for the communicator an epilogue above the kernels' limit kept: records its allreduces."""

    def __init__(self):
        self.log = []

    def allReduce(self, *args):
        self.log.append(("allReduce",) + args)


def test_a_repeated_large_epilogue_is_the_allreduce_into_a_buffer_kept_per_stream_then_the_pass(monkeypatch):
    """Above the small kernels' limit a repeat is the group's allreduce of x into a buffer kept per
    (stream, shape, dtype), so the communicator sees the same addresses every call, then the pass
    from that buffer into a new output; another stream gets a buffer of its own."""
    import types

    from runtime_cuda.fused import epilogue as fe
    from runtime_cuda.nccl.constants import DTYPE_CODES, NCCL_SUM
    from runtime_cuda.torch_dist import ops
    streams = [0x77]
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: streams[0], raising=False)
    capturing = [False]
    monkeypatch.setattr(ops, "_capturing", lambda: capturing[0])
    comm = _KeptComm()
    monkeypatch.setattr(fe, "run_pass", lambda *args: comm.log.append(("run_pass",) + args))
    x, bias = torch.randn(16, 8), torch.randn(8)
    kept = (comm, 128, "float32", "bfloat16", torch.bfloat16, ops._ALLREDUCE_THEN_PASS,
            lambda *args: comm.log.append(("pass",) + args), 0)
    pg = types.SimpleNamespace(_gc3_epilogue_repeats={
        ops._epilogue_key(x, 0.5, bias, None, torch.bfloat16, None): kept})
    outs = [ops.fused_all_reduce_epilogue(x, pg, 0.5, bias, out_dtype=torch.bfloat16) for _ in range(2)]
    streams[0] = 0x78
    outs.append(ops.fused_all_reduce_epilogue(x, pg, 0.5, bias, out_dtype=torch.bfloat16))
    assert [o.dtype for o in outs] == [torch.bfloat16] * 3 and all(o.shape == x.shape for o in outs)
    reduces, passes = comm.log[0::2], comm.log[1::2]
    assert [r[0] for r in reduces] == ["allReduce"] * 3 and [p[0] for p in passes] == ["pass"] * 3
    ys = [r[2] for r in reduces]
    assert all(r[1] == x.data_ptr() and r[3:6] == (128, DTYPE_CODES["float32"], NCCL_SUM) for r in reduces)
    assert [r[-1] for r in reduces] == [0x77, 0x77, 0x78]
    assert ys[0] == ys[1] != ys[2] and x.data_ptr() not in ys          # kept per stream, never x itself
    # The kept pass, packed once, not the per-call one.
    assert [p[1:] for p in passes] == [(y, o.data_ptr(), s) for y, o, s in zip(ys, outs, (0x77, 0x77, 0x78))]
    # A call under a CUDA graph capture has a key of its own (the full path refuses the allreduce
    # and pass there): it goes on to the checks.
    capturing[0] = True
    monkeypatch.setattr(ops, "_epilogue_arguments", lambda *a: (_ for _ in ()).throw(_FullPath()))
    with pytest.raises(_FullPath):
        ops.fused_all_reduce_epilogue(x, pg, 0.5, bias, out_dtype=torch.bfloat16)
    assert len(comm.log) == 6


class _FullPath(Exception):
    pass


def test_gemv_and_embedding_bag_sequential_paths_on_one_rank(gloo_one):
    from runtime_cuda.torch_dist import ops
    x, w = torch.randn(3, 16), torch.randn(16, 5)
    assert torch.allclose(ops.fused_gemv_all_reduce(x, w, gloo_one), x @ w)
    assert ops.fused_gemv_all_reduce(x[0], w, gloo_one).shape == (5,)
    tables, indices, offsets = random_bags(9, 3, 11, 4, 6)
    got = ops.fused_embedding_bag_all_to_all(tables, indices, offsets, gloo_one, "mean")
    assert torch.equal(got, per_table(tables, indices, offsets, "mean").view(1, 6, 12))


# --- the benchmark's memory-bound section --------------------------------------------------------------------------
def test_the_memory_bound_grid_is_the_issue_grid_and_quick_is_a_third():
    from runtime_cuda.torch_dist import bench_fused as bf
    sizes = {op: len(bf.memory_grid([op], quick=False)) for op in bf.MEMORY_OPS}
    assert sizes == {"gemv_ar": 4 * 3, "ebag_a2a": 2 ** 5, "ar_epilogue": 13 * 2}
    full = bf.memory_grid(bf.MEMORY_OPS, quick=False)
    assert len(bf.memory_grid(bf.MEMORY_OPS, quick=True)) == -(-len(full) // 3)
    epilogue = [dict(d)["bytes"] for op, d, _, _ in full if op == "ar_epilogue"]
    assert min(epilogue) == 16 << 10 and max(epilogue) == 64 << 20
    biggest = max(dict(d)["T"] * dict(d)["rows"] * dict(d)["dim"] * dt.itemsize
                  for op, d, dt, _ in full if op == "ebag_a2a")
    assert round(biggest / 1e9, 1) == 13.3
    assert {(dt, out) for op, _, dt, out in full if op == "ar_epilogue"} == {
        (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)}
    with pytest.raises(ValueError, match="unknown memory-bound op"):
        bf.memory_grid(["gemv_xx"], quick=False)
    assert bf._split_ops(["gemm_rs", "gemv_ar", "ag_gemm", "ar_epilogue"]) == (["gemm_rs", "ag_gemm"],
                                                                                ["gemv_ar", "ar_epilogue"])


@pytest.mark.parametrize("op, dims, dtype, out_dtype, shape_text, table_shape", [
    ("gemv_ar", (("b", 8), ("K", 28672), ("N", 8192)), "bfloat16", None,
     "b=8 K=28672 N=8192 dtype=bfloat16", {"b": 8, "K": 7168, "N": 8192}),
    ("ebag_a2a", (("T", 26), ("rows", 1000000), ("dim", 128), ("pooling", 32), ("samples", 8192)), "float32", None,
     "T=26 rows=1000000 dim=128 pooling=32 samples=8192 dtype=float32",
     {"T": 26, "rows": 1000000, "dim": 128, "pooling": 32, "samples": 8192}),
    ("ar_epilogue", (("bytes", 1 << 20),), "float32", "bfloat16",
     "bytes=1048576 out_dtype=bfloat16 dtype=float32", {"bytes": 1 << 20}),
])
def test_the_record_line_of_each_memory_bound_op(op, dims, dtype, out_dtype, shape_text, table_shape):
    from runtime_cuda.torch_dist import bench_fused as bf
    case = bf.MemoryCase(op, dims, getattr(torch, dtype), out_dtype and getattr(torch, out_dtype), 4,
                         torch.device("cpu"))
    text = bf.memory_line(case, {"fused_us": 12.34, "seq_nccl_us": 20.0}, "sequential", "ok", "4xH100")
    assert text.startswith(f"fused op={op} gpus=4 {shape_text} auto_us=")
    fields = dict(cell.split("=", 1) for cell in text.split()[1:])
    assert set(bf.FIELDS) <= set(fields) and fields["fused_us"] == "12.3" and fields["symm_us"] == "n/a"
    assert fields["path"] == "sequential" and fields["check"] == "ok" and fields["hw"] == "4xH100"
    assert case.table_shape() == table_shape
    row = bf.memory_row(case, {"fused_us": 10.0, "seq_nccl_us": 20.0}, "fused", "ok")
    assert shape_text in row and "2.00x" in row and row.split()[-2:] == ["fused", "ok"]


@pytest.mark.parametrize("op, dims, dtype, out_dtype", [
    ("gemv_ar", (("b", 3), ("K", 64), ("N", 24)), "bfloat16", None),
    ("ebag_a2a", (("T", 3), ("rows", 40), ("dim", 8), ("pooling", 4), ("samples", 6)), "float32", None),
    ("ebag_a2a", (("T", 2), ("rows", 40), ("dim", 8), ("pooling", 1), ("samples", 4)), "bfloat16", None),
    ("ar_epilogue", (("bytes", 4096),), "float32", "bfloat16"),
])
def test_the_benchmark_reference_agrees_with_the_sequential_path_and_catches_a_wrong_result(gloo_one, op, dims,
                                                                                             dtype, out_dtype):
    from runtime_cuda.torch_dist import bench_fused as bf
    case = bf.MemoryCase(op, dims, getattr(torch, dtype), out_dtype and getattr(torch, out_dtype), 1,
                         torch.device("cpu"))
    job = bf.Job(0, 1, torch.device("cpu"), gloo_one, None, "cpu")
    t = bf.memory_operands(case, 0)
    seq = bf.memory_seq_call(case, t, gloo_one)()
    assert bf.memory_check(job, case, t, seq, seq) == "ok"
    part, ref = bf.memory_reference(case, 0, t)
    assert bf._error(part(seq), ref) < 2 ** -7
    wrong = seq.clone()
    wrong.view(-1)[: wrong.numel() // 2] *= -1
    assert bf.memory_check(job, case, t, wrong, seq).startswith("error(")


def test_the_cli_takes_the_memory_bound_ops():
    from runtime_cuda.commands.bench import fused_op_names
    assert fused_op_names("gemv_ar,ebag_a2a,ar_epilogue", "--ops") == ["gemv_ar", "ebag_a2a", "ar_epilogue"]
    assert {"gemv_ar", "ebag_a2a", "ar_epilogue"} <= set(fused_op_names("all", "--ops"))
    assert set(fused_op_names("all", "--ops")) <= set(choice.OPS)


# --- the GPU program --------------------------------------------------------------------------------------------
def test_the_gpu_program_checks_its_references_on_gloo(tmp_path):
    """The GPU program's sequential paths, references and negative controls on the CPU
    half of a gc3 group (gloo), two ranks."""
    from test_torch_backend import spawn_ranks
    outs = spawn_ranks([str(PROGRAM)], 2, tmp_path, dict(os.environ, PYTHONPATH=str(ROOT)), "--device", "cpu",
                       says="ALL OK rank={rank}", timeout=180)
    for needed in ("ebag_a2a garbage past the bags", "gemv_ar shifted peer fails the check",
                   "ebag_a2a shifted peer fails the check", "ar_epilogue shifted peer fails the check",
                   "ar_epilogue leaves x unchanged"):
        assert needed in outs[0], needed


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 4])
def test_the_memory_bound_operators_on_ranks_sharing_one_gpu(n, tmp_path):
    """Each memory-bound operator sequential and forced fused against fp32, bit-identical
    across ranks, the negative controls, CUDA-graph replay of the sequential path,
    back-to-back calls, and auto following the measured table."""
    pytest.importorskip("cupy")
    from test_torch_backend import spawn_ranks, tuned_catalog
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    catalog = tuned_catalog(n, tmp_path)
    data = json.loads(catalog.read_text())
    # The program's shapes: GEMV x [3, 96] @ w [96, 232]; 3 tables of 50 x 16 with bags of up to 3
    # for 4 samples per rank; the epilogue's x [rows, 64] bf16.  The program adds an unmeasured GEMV.
    data["fused"] = {"entries": [entry("gemv_ar", {"b": 3, "K": 96, "N": 232}, "fused", gpus=n),
                                 entry("ebag_a2a", {"T": 3, "rows": 50, "dim": 16, "pooling": 3, "samples": 4},
                                       "fused", gpus=n),
                                 entry("ar_epilogue", {"bytes": 37 * 64 * 2}, "fused", gpus=n),
                                 entry("ar_epilogue", {"bytes": 74 * 64 * 2}, "sequential", gpus=n)]}
    catalog.write_text(json.dumps(data))
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH_FALLBACK="0", NCCL_NVLS_ENABLE="0", GC3_TIMEOUT_S="90",
               GC3_CONFIG=str(catalog), GC3_CACHE_DIR=str(tmp_path / "cache"))
    outs = spawn_ranks([str(PROGRAM)], n, tmp_path, env, str(catalog), says="ALL OK rank={rank}", timeout=300)
    for needed in ("gemv_ar fused", "ebag_a2a fused", "ar_epilogue ring fused", "ar_epilogue fp32 cast bf16 fused",
                   "ar_epilogue same bits on every rank", "gemv_ar same bits on every rank", "ebag_a2a cuda graph replay", "gemv_ar cuda graph replay",
                   "ar_epilogue cuda graph replay", "back to back ebag_a2a", "shifted peer fails the check",
                   "auto gemv_ar fused", "auto gemv_ar sequential", "auto ebag_a2a fused", "auto ar_epilogue fused",
                   "auto ar_epilogue sequential"):
        assert needed in outs[0], f"{needed!r} did not run on rank 0:\n{outs[0][-3000:]}"


class StandInTimer:
    """Calls each function once (so every path runs) and reports a fixed time per label."""

    def __init__(self, times, graph_times=None):
        self.times, self.seen, self.graph_times = times, [], graph_times

    def device(self, fn):
        return self._time(fn, "device")

    def host(self, fn):
        return self._time(fn, "host")

    def graph(self, fn, what):
        """None (a path no graph could hold) unless graph times were given."""
        if self.graph_times is None or fn is None:
            return None
        fn()
        self.seen.append("graph")
        return self.graph_times.pop(0)

    def _time(self, fn, kind):
        if fn is None:
            return None
        fn()
        self.seen.append(kind)
        return self.times.pop(0) if self.times else 5.0


SMALL = [("gemv_ar", (("b", 2), ("K", 32), ("N", 16)), torch.bfloat16 if torch else None, None),
         ("ebag_a2a", (("T", 2), ("rows", 30), ("dim", 4), ("pooling", 2), ("samples", 4)),
          torch.float32 if torch else None, None),
         ("ar_epilogue", (("bytes", 1024),), torch.float32 if torch else None, torch.bfloat16 if torch else None)]


def test_the_memory_bound_bench_and_tune_run_end_to_end_on_one_cpu_rank(gloo_one, tmp_path, monkeypatch):
    from runtime_cuda.torch_dist import bench_fused as bf
    monkeypatch.setattr(bf, "memory_grid", lambda ops, quick: [c for c in SMALL if c[0] in ops])
    monkeypatch.setattr(choice, "catalog_path", lambda: None)
    job = bf.Job(0, 1, torch.device("cpu"), gloo_one, gloo_one, "1xCPU")
    record, echoed = tmp_path / "fused.txt", []
    assert bf.bench_memory(job, StandInTimer([]), bf.MEMORY_OPS, False, record, echoed.append) == 0
    lines = record.read_text().splitlines()
    assert [ln.split()[1] for ln in lines] == ["op=gemv_ar", "op=ebag_a2a", "op=ar_epilogue"]
    assert all("check=ok" in ln and "path=sequential" in ln and "symm_us=n/a" in ln for ln in lines), lines
    assert echoed[0] == bf.memory_header() and len(echoed) == 4
    # tune: the faster path per shape, by the margin; the fused path is measured second
    entries = bf.tune_memory(job, StandInTimer([10.0, 9.0, 10.0, 9.9, 10.0, 5.0]), bf.MEMORY_OPS, False, print)
    assert [(e["op"], e["path"]) for e in entries] == [("gemv_ar", "fused"), ("ebag_a2a", "sequential"),
                                                       ("ar_epilogue", "fused")]
    assert entries[0]["shape"] == {"b": 2, "K": 32, "N": 16} and entries[2]["dtype"] == "float32"
    assert not any("graph_path" in e for e in entries)     # no graph could be timed: no graph decision
    bf.write_section(tmp_path / "catalog.json", entries, {"hw": "1xCPU"})
    table = choice.FusedTable.from_catalog(tmp_path / "catalog.json")
    assert table.lookup("ar_epilogue", 1, "float32", {"bytes": 1024})[0]["path"] == "fused"
    # Replayed in a graph (sequential first, then fused, for the ops a graph can hold): the GEMV
    # wins eager calls and loses replays, the epilogue wins both, the bags are not replayed.
    timer = StandInTimer([10.0, 9.0, 10.0, 9.9, 10.0, 5.0], graph_times=[10.0, 12.0, 10.0, 5.0])
    entries = bf.tune_memory(job, timer, bf.MEMORY_OPS, False, print)
    assert [(e["op"], e["path"], e.get("graph_path")) for e in entries] == [
        ("gemv_ar", "fused", "sequential"), ("ebag_a2a", "sequential", None), ("ar_epilogue", "fused", "fused")]
    assert (entries[0]["graph_sequential_us"], entries[0]["graph_fused_us"]) == (10.0, 12.0)
    bf.write_section(tmp_path / "catalog.json", entries, {"hw": "1xCPU"})
    choice.forget()
    table = choice.FusedTable.from_catalog(tmp_path / "catalog.json")
    gemv = {"b": 2, "K": 32, "N": 16}
    assert [choice.decided(table.lookup("gemv_ar", 1, "bfloat16", gemv)[0], c) for c in (False, True)] == \
        ["fused", "sequential"]


def test_a_sequential_decision_is_kept_and_its_repeats_skip_the_gate(monkeypatch):
    """A call a gc3 group sends down the sequential path keeps that decision under its key: its
    repeats go straight to the sequential path, without the gate or the choice."""
    import types

    from runtime_cuda.torch_dist import ops, process_group
    monkeypatch.setattr(process_group, "Gc3ProcessGroup", types.SimpleNamespace)
    pg = types.SimpleNamespace(size=lambda: 1)          # a one-rank gc3 group: always sequential
    seen = []
    monkeypatch.setattr(ops, "epilogue_sequential", lambda x, _pg, *a: seen.append("epilogue") or x)
    monkeypatch.setattr(ops, "gemv_sequential", lambda x, w, _pg: seen.append("gemv") or x @ w)
    x, bias, w = torch.randn(4, 8), torch.randn(8), torch.randn(8, 3)
    ops.fused_all_reduce_epilogue(x, pg, 0.5, bias)
    ops.fused_gemv_all_reduce(x, w, pg)
    assert pg._gc3_epilogue_repeats[ops._epilogue_key(x, 0.5, bias, None, None, None)] is ops._SEQUENTIAL
    assert pg._gc3_gemv_repeats[ops._repeat_key(x, w, None)] is ops._SEQUENTIAL

    def gate(*a, **k):
        raise AssertionError("a repeat ran the gate")
    monkeypatch.setattr(ops, "_refusal", gate)
    seen.clear()
    ops.fused_all_reduce_epilogue(x, pg, 0.5, bias)
    ops.fused_gemv_all_reduce(x, w, pg)
    assert seen == ["epilogue", "gemv"]
    with pytest.raises(AssertionError, match="ran the gate"):   # another key: the full path
        ops.fused_all_reduce_epilogue(x, pg, 0.25, bias)
    with pytest.raises(AssertionError, match="ran the gate"):   # a strided w is never kept
        ops.fused_gemv_all_reduce(x, w.t().contiguous().t(), pg)
