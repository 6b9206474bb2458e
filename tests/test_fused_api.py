"""runtime_cuda.fused on the CPU (no GPU needed): the programs the API compiles for the benchmark's
shapes, their geometry as the launch path checks it, the compute-TB variants of both algorithms
(simulated, and WRONG when a compute step is shifted), and the path choice."""
import os
from pathlib import Path

import numpy as np
import pytest

from gc3 import algorithms
from gc3.compiler.pipeline import lower
from gc3.ir.xml_io import from_xml, to_xml
from gc3.simulator import simulate
from gc3.verify import verify
# The benchmark's operators and shapes: the programs below are compiled for them.
from runtime_cuda.benchmarks import fused_memory_bound as bench

mb = pytest.importorskip("runtime_cuda.fused.memory_bound")
programs = pytest.importorskip("runtime_cuda.fused.programs")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fixed_compute_tbs(monkeypatch):
    # The default asks the GPU for its SM count; the CPU tests fix it.
    monkeypatch.setenv("GC3_FUSED_COMPUTE_TBS", "16")


def _geometry_agrees(prog):
    """What LaunchGroup._compute_table checks at a call: compute steps fill whole chunks of the
    layout the operator's element count makes."""
    from runtime_cuda.core import binding, tables
    t = tables.build(prog)
    _, _, unit = prog.compute.split()
    _, shape = binding.call_shape(prog, prog.compute.out_elems, 2, "Simple", t.max_cnt)
    return t, {u * unit for u in t.chunk_units} == {shape.cs}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", bench.EBAG_DTYPES)
@pytest.mark.parametrize("t, rows, dim, pooling, b", bench.EBAG_SHAPES["full"] + bench.EBAG_SHAPES["quick"]
                         + [(8, 1 << 20, 128, 32, 5)])      # and samples per rank that split into no blocks
def test_embedding_programs_of_the_api(n, dtype, t, rows, dim, pooling, b):
    args = programs.ebag_args(n, t, rows, dim, b, pooling, 1)
    prog = programs.fused_program("embedding_bag_alltoall", args, dtype)
    assert prog.compute.ebag_dims() == (t, rows, dim, n * b * pooling, n * b)
    _, ok = _geometry_agrees(prog)
    compute_tbs = sum(any(st.info.compute for st in tb.steps) for tb in prog.gpu(0).threadblocks)
    assert ok and compute_tbs == min(16, n * args[6])


@pytest.mark.parametrize("name,args", [("gemv_allreduce", (2, 3, 40, 96, 8, 2, 3)),
                                       ("gemv_allreduce", (4, 1, 24, 64, 8, 1, 8)),
                                       ("embedding_bag_alltoall", (2, 3, 20, 8, 4, 3, 2, 1, 3)),
                                       ("embedding_bag_alltoall", (4, 2, 20, 8, 4, 2, 2, 0, 5))])
def test_compute_tb_variants_simulate_and_a_shift_is_wrong(name, args):
    prog = lower(algorithms.builder(f"fused.{name}")(*args))
    assert verify(prog).proven
    res = simulate(from_xml(to_xml(prog)))
    assert res.ok, res.errors
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.info.compute
              and st.compute.col1 + 1 <= prog.compute.split()[1])
    old = f'col0="{st.compute.col0}" col1="{st.compute.col1}"'
    bad = from_xml(to_xml(prog).replace(old, f'col0="{st.compute.col0 + 1}" col1="{st.compute.col1 + 1}"', 1))
    res = simulate(bad)
    assert not res.ok and res.wrong > 0


def test_compute_tbs_override_and_path_names(monkeypatch):
    monkeypatch.setenv("GC3_FUSED_COMPUTE_TBS", "0")
    assert programs.ebag_args(2, 8, 1 << 20, 128, 2048, 32, 1)[-1] == 0
    assert mb._path("sequential") == "sequential"
    monkeypatch.setenv("GC3_FUSED", "fast")
    with pytest.raises(ValueError, match="GC3_FUSED"):
        mb._path(None)


def test_value_types():
    assert mb.value_dtype(np.zeros(1, np.uint16), "x") == "bfloat16"
    assert mb.value_dtype(np.zeros(1, np.float16), "x") == "float16"
    with pytest.raises(ValueError, match=r"w: dtype float64; expected one of float16, bfloat16, float32"):
        mb.value_dtype(np.zeros(1, np.float64), "w")


def test_the_embedding_bag_kernel_is_refused_where_it_cannot_serve(monkeypatch):
    """The embedding-bag's fused path is the kernel (runtime_cuda.fused.ebag_kernel): its refusals
    send auto to the sequential path, and make a forced fused call raise, before any set-up."""
    logged = []
    monkeypatch.setattr(mb, "get_logger", lambda: type("L", (), {"info": lambda self, *a: logged.append(a[0] % a[1:])})())
    comm = mb.VirtualComm(2)
    find = lambda dim, dtype="float32": lambda: mb.ebag_kernel(comm, 2, 8, 100, dim, 16, 64, dtype)  # noqa: E731
    assert mb._kernel_group("auto", "odd", find(3)) is None
    assert logged[-1] == "odd: sequential path: rows of 3 float32 values (12 B) are not a multiple of 16 B"
    assert mb._kernel_group("auto", "ints", find(4, "int32")) is None
    assert "dtype int32" in logged[-1]
    with pytest.raises(mb.GC3Error, match="fused path cannot serve this call: a single rank"):
        mb._kernel_group("fused", "one", lambda: mb.ebag_kernel(mb.VirtualComm(1), 1, 8, 100, 4, 16, 64, "float32"))
    assert not comm.groups


def test_no_kernel_group_is_built_inside_a_capture_but_a_built_one_serves_it(monkeypatch):
    """Building a group allocates, maps peers and synchronizes, which no CUDA graph capture may
    hold: a captured first call gets the sequential path (or, forced, a clear error)."""
    from runtime_cuda.fused import epilogue as fe
    monkeypatch.setattr(mb, "get_logger", lambda: type("L", (), {"info": lambda self, *a: None})())
    comm = mb.VirtualComm(2)
    asked = []

    def capturing():
        asked.append(1)
        return True
    assert mb.gemv_kernel(comm, 2, 1, 64, 64, "bfloat16", 2, capturing) == (None, mb.IN_CAPTURE)
    assert mb.ebag_kernel(comm, 2, 1, 10, 8, 4, 4, "float32", 2, capturing) == (None, mb.IN_CAPTURE)
    assert fe.refusal(comm, "auto", 64, "bfloat16", 2, "epi", capturing) == mb.IN_CAPTURE
    with pytest.raises(mb.GC3Error, match="cannot serve this call: a first call inside CUDA graph capture"):
        fe.refusal(comm, "fused", 64, "bfloat16", 2, "epi", capturing)
    assert not comm.groups and len(asked) == 4
    built = object()
    comm.groups["gemv_kernel"] = built
    assert mb.gemv_kernel(comm, 2, 1, 64, 64, "bfloat16", 2, capturing) == (built, "")
    assert len(asked) == 4, "a built group must not cost the capture query"


def test_a_failed_group_set_up_is_given_again_without_a_second_try():
    comm, tries = mb.VirtualComm(2), []

    def fail():
        tries.append(1)
        raise mb.GC3Error("rank 1: no peer access")
    try:
        for _ in range(2):
            assert mb.group_of(comm, "k", fail) == (None, "kernel set-up failed: rank 1: no peer access")
        assert tries == [1] and not comm.groups
        assert mb.group_of(mb.VirtualComm(2), "k", lambda: "built")[0] == "built"
    finally:
        mb._failed.pop(("k", id(comm)), None)


def test_the_gemv_kernel_is_refused_where_it_cannot_serve(monkeypatch):
    """The GEMV's fused path is the kernel (runtime_cuda.fused.gemv_kernel): its refusals
    send auto to the sequential path, and make a forced fused call raise, before any set-up."""
    logged = []
    monkeypatch.setattr(mb, "get_logger", lambda: type("L", (), {"info": lambda self, *a: logged.append(a[0] % a[1:])})())
    find = lambda n, dtype: lambda: mb.gemv_kernel(mb.VirtualComm(n), n, 1, 64, 64, dtype, n)  # noqa: E731
    assert mb._kernel_group("auto", "ints", find(2, "int32")) is None
    assert "dtype int32" in logged[-1]
    assert mb._kernel_group("sequential", "asked", find(2, "bfloat16")) is None
    assert logged[-1] == "asked: sequential path: path=sequential"
    with pytest.raises(mb.GC3Error, match="single rank"):
        mb._kernel_group("fused", "one", find(1, "bfloat16"))


def test_benchmark_script_runs_operators_of_the_api_and_offers_each():
    """Every operator the benchmark times is a fused API function with its program in
    gc3.algorithms.fused, and its command line offers each of them."""
    import subprocess
    import sys

    import runtime_cuda.fused as fused

    assert bench.OPERATORS
    for name in bench.OPERATORS:
        assert callable(getattr(fused, name, None)), name
        assert f"fused.{name}" in algorithms.names("fused"), name
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_fused.py"), "--help"], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert out.returncode == 0 and "--virtual" in out.stdout and "--compute-only" in out.stdout
    assert "--op {" + ",".join(sorted(bench.OPERATORS)) + "}" in out.stdout


@pytest.mark.parametrize("size", ["full", "quick"])
def test_the_gemv_kernel_serves_every_shape_the_benchmark_times(size):
    """The benchmark forces the fused path, which raises where the GEMV kernel refuses a shape:
    each of its shapes must be one the kernel serves, whether the ranks are processes or all
    virtual in one."""
    from runtime_cuda.fused.gemv_kernel import refusal

    for dtype in bench.GEMV_DTYPES:
        for batch, k, n_out in bench.GEMV_SHAPES[size]:
            for n in (2, 4, 8):
                for nlocal in (1, n):
                    assert refusal(dtype, batch, k, n_out, n, nlocal) is None, (dtype, batch, k, n_out, n, nlocal)


def test_gc3_run_refuses_a_fused_ir_in_peer_mode(tmp_path):
    from click.testing import CliRunner
    from runtime_cuda.commands import cli
    prog = lower(algorithms.builder("fused.gemv_allreduce")(2, 1, 16, 64, 2, 2))
    xml = tmp_path / "g.xml"
    xml.write_text(to_xml(prog))
    res = CliRunner().invoke(cli(), ["run", str(xml), "--mode", "peer"])
    assert res.exit_code != 0 and "runs in --mode virtual or ipc" in res.output


@pytest.mark.parametrize("name,args", [("gemv_allreduce", (2, 3, 40, 96, 8, 2, 3)),
                                       ("embedding_bag_alltoall", (2, 3, 20, 8, 4, 3, 2, 1, 3))])
def test_the_runtime_check_builds_its_reference_on_the_cpu(name, args):
    """`gc3 run FUSED.xml` and the GPU tests compare with runtime_cuda.core.checking.fused_case: its
    reference must match what the simulator accepts (a changed simulator signature broke it once,
    unseen by any CPU test)."""
    from runtime_cuda.core.checking import fused_case

    prog = programs.fused_program(name, args, "float32")
    inputs, pairs = fused_case(prog, seed=2)
    assert len(inputs) == len(pairs) == prog.ngpus
    assert all(np.all(np.isfinite(exp[np.isfinite(tol)])) for exp, tol in pairs)


def test_gemv_kernel_refusals_and_tiles():
    from runtime_cuda.fused.gemv_kernel import refusal, split_plan, tile_columns

    assert refusal("int32", 1, 8, 8, 2).startswith("dtype int32")
    assert "single rank" in refusal("bfloat16", 1, 8, 8, 1)
    assert "tile holds" in refusal("bfloat16", 1024, 8, 8, 2)
    assert "scratch" in refusal("float32", 32, 8, 65536, 2)
    assert refusal("bfloat16", 32, 28672, 8192, 4) is None
    assert tile_columns(1, 8192, 132) == 64 and tile_columns(1, 4096, 132) == 32
    assert tile_columns(32, 8192, 16) == 128          # a tile's shared memory bounds it; tiles wrap the grid
    # 16-bit types to 2 rows, the rows form: a tile is one 16-byte vector for each of 512 threads,
    # slices of at least 16 rows, a block each
    assert split_plan(1, 2048, 8192, 2, 132) == (4096, 66)
    assert split_plan(2, 2048, 8192, 2, 132) == (4096, 66)
    assert split_plan(1, 3584, 4096, 2, 132) == (4096, 132)
    assert split_plan(1, 7168, 16384, 2, 128) == (4096, 32)
    assert split_plan(3, 2048, 8192, 2, 132) == (1024, 16)    # 16-bit types from 3 rows: 64 columns a warp (mma)
    assert split_plan(8, 3584, 4096, 2, 132) == (1024, 28)    # 4 tiles, slices of at least 128 rows
    assert split_plan(5, 2048, 8193, 2, 132) == (1024, 14)    # tensor cores take any width
    assert split_plan(3, 2048, 8192, 2, 132, max_batch=2) is None
    assert split_plan(3, 2048, 8192, 4, 132) == (512, 8)      # fp32: 4 rows of 4 vectors of 4 a lane
    assert split_plan(8, 7168, 8192, 4, 132) == (256, 4)      # fp32 batch 8: 2 vectors a lane
    assert split_plan(1, 100, 8192, 2, 132) == (4096, 7)     # few rows: slices of 16
    assert split_plan(1, 100, 8192, 4, 132) == (512, 1)      # fp32: too few rows to split
    assert split_plan(1, 2048, 8192, 4, 132) == (512, 8)     # fp32: 16-byte vectors of 4
    assert split_plan(9, 2048, 8192, 2, 132) is None and split_plan(1, 2048, 8193, 2, 132) is None
