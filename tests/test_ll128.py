"""LL128 (runtime_cuda/kernels/prims_ll128.cuh): every algorithm compiles and
simulates with it, the host's slot and tile geometry fits whole 128-byte
lines, no protocol is ever substituted; on the GPU, every collective runs
bit-exact on virtual ranks (2/4/8) and on 2 processes sharing one GPU."""
import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gc3 import limits
from gc3.cli import main as cli
from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.errors import GC3Error, RuntimeTimeoutError
from gc3.ir.xml_io import write_xml

ROOT = Path(__file__).resolve().parent.parent
ALGOS = ROOT / "gc3" / "algorithms"
EVERY_ALGORITHM = sorted(ALGOS.glob("[!_]*.py")) + sorted((ALGOS / "fused").glob("[!_]*.py"))


# --- CPU ---------------------------------------------------------------------

@pytest.mark.parametrize("path", EVERY_ALGORITHM, ids=lambda p: p.relative_to(ALGOS).as_posix())
def test_every_algorithm_compiles_and_simulates_with_ll128(path, tmp_path):
    out = tmp_path / f"{path.stem}.xml"
    run = CliRunner().invoke(cli, ["compile", str(path), "--protocol", "LL128", "-o", str(out)])
    assert run.exit_code == 0, run.output
    assert 'proto="LL128"' in out.read_text()
    # A fused program's size is fixed by its compute step: simulate its own.
    count = [] if path.parent.name == "fused" else ["--count", "840"]
    sim = CliRunner().invoke(cli, ["simulate", str(out), *count])
    assert sim.exit_code == 0 and "OK" in sim.output, sim.output


def test_no_protocol_is_substituted():
    from runtime_cuda.core import abi
    from runtime_cuda.core.launcher import runtime_protocol

    for p in ("Simple", "LL", "LL128"):
        assert runtime_protocol(p) == p
        assert runtime_protocol("Simple", p) == p
    assert set(abi.PROTO) == {"Simple", "LL", "LL128"} and len(set(abi.PROTO.values())) == 3
    with pytest.raises(GC3Error, match="protocol 'LL64' is not implemented by the CUDA runtime"):
        runtime_protocol("LL64")


def test_ll128_slot_geometry_comes_from_limits(monkeypatch):
    from runtime_cuda.core import connections, module

    assert limits.slot_data_bytes("LL128", 256 << 10) == 2048 * 120
    opts = module.options("float32", "sum", "LL128")
    assert "-DGC3_PROTO=3" in opts
    assert f"-DGC3_LL128_LINE_BYTES={limits.LL128_LINE_BYTES}" in opts
    assert f"-DGC3_LL128_LINE_DATA_BYTES={limits.LL128_LINE_DATA_BYTES}" in opts
    monkeypatch.setenv("GC3_SLOT_BYTES_LL128", str(128 * 3 + 64))   # a line would straddle 128 bytes
    with pytest.raises(GC3Error, match="GC3_SLOT_BYTES_LL128=448: must be a positive multiple of 128"):
        connections.slot_bytes("LL128")
    monkeypatch.setenv("GC3_SLOT_BYTES_LL128", "4096")
    assert connections.slot_data_bytes("LL128") == 32 * 120


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32", "float64", "uint8"])
def test_ll128_kernel_compiles_for_every_element_size(dtype, tmp_path):
    from runtime_cuda.core import module

    src = tmp_path / "k.cu"
    src.write_text(module.source())
    opts = [o for o in module.options(dtype, "max", "LL128") if o.startswith("-D")]
    proc = subprocess.run(["nvcc", "-std=c++17", "--ptx", "-arch=sm_90", str(src), *opts, "-o", os.devnull],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- GPU: virtual ranks ------------------------------------------------------

# One program per collective and rank count, from the algorithm library.
VIRTUAL = [("allreduce_ring", (2,), 1), ("allreduce_allpairs", (4,), 2), ("allreduce_oneshot", (8,), 1),
           ("allreduce_ring", (8,), 2), ("allgather_direct", (4,), 1), ("allgather_ring", (8,), 1),
           ("reducescatter_ring", (4,), 2), ("reducescatter_direct", (8,), 1), ("alltoall_direct", (2,), 2),
           ("alltoall_direct", (8,), 1), ("broadcast_tree", (4,), 1), ("reduce_ring", (8,), 1)]
GPU_DTYPES = ["float16", "bfloat16", "float32", "int32"]


def _program(name, args, instances):
    return lower(run_script(str(ALGOS / f"{name}.py"), [str(a) for a in args]), instances=instances,
                 protocol="LL128")


def _sizes(prog):
    """Odd sizes: one lane per chunk, short and empty last chunks, a tile plus one lane."""
    from runtime_cuda.core.checking import geometry

    bi, c = geometry(prog)
    return [bi * c, bi * (2 * c - 1), bi * (c * 61 + 3), bi * (c * 70001 + c - 1)]


def _check(group, n, dtype, inplace, repeat=1):
    from runtime_cuda.core.checking import run_checked

    res = run_checked(group, n, dtype, "sum", inplace, repeat=repeat)
    assert res.checked > 0 and res.wrong == 0, f"{group.prog.name} n={n} {dtype} inplace={inplace}: {res.first}"


@pytest.mark.gpu
@pytest.mark.parametrize("name,args,instances", VIRTUAL, ids=[f"{n}{a}x{i}" for n, a, i in VIRTUAL])
def test_every_collective_runs_ll128_on_virtual_ranks(name, args, instances):
    from runtime_cuda.ranks.virtual import VirtualRanks

    group = VirtualRanks(_program(name, args, instances))
    assert group.proto == "LL128"
    for k, n in enumerate(_sizes(group.prog)):
        _check(group, n, GPU_DTYPES[k % len(GPU_DTYPES)], inplace=bool(k % 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_ll128_wraps_the_slot_ring_many_times(dtype, monkeypatch):
    """Small slots (32 lines) make every call cycle each 8-slot FIFO many
    times, and repeated calls carry the flags over: a stale flag or a
    mis-sized slot shows as wrong data or a timeout."""
    from runtime_cuda.ranks.virtual import VirtualRanks

    monkeypatch.setenv("GC3_SLOT_BYTES_LL128", "4096")
    for name, args in (("allreduce_ring", (4,)), ("alltoall_direct", (2,))):
        group = VirtualRanks(_program(name, args, 1))
        n = _sizes(group.prog)[3]
        _check(group, n, dtype, inplace=False, repeat=3)
        _check(group, n + group.prog.ngpus, dtype, inplace=True)


@pytest.mark.gpu
def test_ll128_keeps_every_payload_bit():
    """-0.0, NaNs with payloads and all-ones words pass a copy unchanged: the
    flag is a word of its own, never a sentinel value in the data."""
    import cupy

    from gc3.simulator.reference import reference
    from runtime_cuda.core.checking import device_buffers
    from runtime_cuda.ranks.virtual import VirtualRanks

    group = VirtualRanks(_program("allgather_direct", (4,), 1))
    n = 4 * 1001
    rng = np.random.default_rng(7)
    special = np.array([0x80000000, 0x7FC00001, 0xFFFFFFFF, 0xFF800000, 0x7F800001, 0], dtype=np.uint32)
    inputs = [rng.choice(np.concatenate([special, rng.integers(0, 2**32, 64, dtype=np.uint32)]), n).view(np.float32)
              for _ in range(4)]
    expected = reference("allgather", inputs, "sum", 4)
    for _ in range(3):
        ins, outs = device_buffers(group, inputs, n, "float32", inplace=False)
        group(ins, outs, op="sum", dtype="float32")
        group.check()
        for r, out in zip(group.ranks, outs):
            got = cupy.asnumpy(out).view(np.uint32)
            assert np.array_equal(got, expected[r].view(np.uint32)), f"rank {r}: payload bits changed"


@pytest.mark.gpu
def test_ll128_recv_without_send_times_out_naming_the_protocol():
    from runtime_cuda.core.checking import run_checked
    from runtime_cuda.ranks.virtual import VirtualRanks

    prog = copy.deepcopy(_program("allreduce_ring", (4,), 1))
    tb = next(t for t in prog.gpu(1).threadblocks if any(s.type == "s" for s in t.steps))
    k = next(i for i, s in enumerate(tb.steps) if s.type == "s")
    tb.steps[k].type = "nop"
    tb.steps[k].depid = tb.steps[k].deps = -1
    with pytest.raises(RuntimeTimeoutError) as exc:
        run_checked(VirtualRanks(prog, timeout=0.5), 4 * 4096, "float32", "sum", inplace=True)
    assert "LL128 data from rank" in str(exc.value) and "timed out" in str(exc.value), str(exc.value)


# --- GPU: two processes sharing one GPU (CUDA IPC) -------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_two_processes_run_ll128(tmp_path):
    pytest.importorskip("mpi4py")
    paths = []
    for name in ("allreduce_ring", "allgather_ring", "reducescatter_ring", "alltoall_direct"):
        p = tmp_path / f"{name}_2r_LL128.xml"
        write_xml(_program(name, (2,), 1), p)
        paths.append(p)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.run(["mpirun", "-np", "2", sys.executable, "-m", "runtime_cuda.ranks.ipc_check", "--quick",
                           "--proto=LL128", "--dtypes=float16,bfloat16,float32,int32", *map(str, paths)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = [l for l in out.splitlines() if l.startswith("IPC-CHECK")]
    assert len(lines) == len(paths) and all(" 0 wrong" in l for l in lines), out[-4000:]
