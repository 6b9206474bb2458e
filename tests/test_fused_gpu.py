"""The compute opcodes (gemv, ebag) and the fused operators on a real GPU:

* fused IRs on virtual ranks with the simulator's seeded inputs, checked against its
  unfused reference (runtime_cuda.core.checking.run_fused_checked), odd shapes, every float
  type, both protocols; a compute step's range shifted by one must come out wrong;
* runtime_cuda.fused's API on VirtualComm(2) and VirtualComm(4), fused and sequential,
  random data vs a float64 reference of the same inputs, poisoned outputs, a
  non-default stream;
* both operators in 2 processes sharing the GPU (tests/gpu_programs/fused_ops.py under mpirun).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _lower(name, *args, **kw):
    from gc3 import algorithms
    from gc3.compiler.pipeline import lower
    return lower(algorithms.builder(f"fused.{name}")(*args, **kw))


def _shifted(prog, by=1):
    """The IR with the first compute step whose range can move by `by` moved (kept inside the operator)."""
    from gc3.ir.xml_io import from_xml, to_xml
    _, length, _ = prog.compute.split()
    st = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps
              if st.info.compute and st.compute.col1 + by <= length)
    old = f'col0="{st.compute.col0}" col1="{st.compute.col1}"'
    return from_xml(to_xml(prog).replace(old, f'col0="{st.compute.col0 + by}" col1="{st.compute.col1 + by}"', 1))


# --- fused IRs on virtual ranks, the simulator's inputs and reference ----------------------------
GEMV_CASES = [  # (ranks, batch, K, N, chunks, variant, compute TBs, dtype)
    (2, 1, 37, 196, 2, 2, 0, "bfloat16"),       # N % 8 != 0, batch 1: element-wise weight loads
    (2, 3, 64, 520, 8, 1, 4, "float16"),        # 65-column blocks: vector loads from unaligned columns
    (4, 5, 130, 96, 4, 2, 2, "float32"),
    (4, 32, 300, 1024, 8, 2, 8, "bfloat16"),    # batch 32: passes of 8 rows with 8-byte loads
    (2, 5, 50, 100, 2, 2, 2, "bfloat16"),       # N % 8 == 4: 8-byte loads from 4-aligned columns
]
EBAG_CASES = [  # (ranks, tables, rows, dim, samples per rank, pooling, chunks, compute TBs, dtype)
    (2, 3, 50, 20, 6, 3, 2, 0, "bfloat16"),     # dim % 8 != 0: element-wise row loads
    (2, 2, 40, 16, 4, 5, 2, 3, "float32"),
    (4, 2, 64, 24, 4, 2, 1, 0, "float16"),
    (4, 3, 100, 128, 8, 4, 4, 8, "bfloat16"),
]


@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gemv_allreduce_ir_on_virtual_ranks(case):
    from runtime_cuda.core.checking import run_fused_checked
    from runtime_cuda.ranks.virtual import VirtualRanks
    *args, dtype = case
    group = VirtualRanks(_lower("gemv_allreduce", *args, dtype=dtype))
    res = run_fused_checked(group, seed=3, repeat=2)
    assert res.wrong == 0 and res.checked == args[0] * args[1] * args[3], res.first


@pytest.mark.parametrize("case", EBAG_CASES, ids=lambda c: "-".join(map(str, c)))
def test_embedding_bag_alltoall_ir_on_virtual_ranks(case):
    from runtime_cuda.core.checking import run_fused_checked
    from runtime_cuda.ranks.virtual import VirtualRanks
    *args, tbs, dtype = case
    group = VirtualRanks(_lower("embedding_bag_alltoall", *args, 0, tbs, dtype=dtype))
    res = run_fused_checked(group, seed=5, repeat=2)
    n, t, _, dim, b = args[:5]
    assert res.wrong == 0 and res.checked == n * n * b * t * dim, res.first


@pytest.mark.parametrize("proto", ["LL", "Simple"])
def test_both_operators_under_each_protocol(proto):
    from runtime_cuda.core.checking import run_fused_checked
    from runtime_cuda.ranks.virtual import VirtualRanks
    for prog in (_lower("gemv_allreduce", 2, 2, 48, 128, 4, 2, 2, dtype="bfloat16"),
                 _lower("embedding_bag_alltoall", 2, 2, 30, 16, 4, 3, 2, 0, 2, dtype="float32")):
        res = run_fused_checked(VirtualRanks(prog, proto=proto), seed=1)
        assert res.wrong == 0 and res.checked > 0, (prog.name, res.first)


@pytest.mark.parametrize("name,args", [("gemv_allreduce", (2, 1, 64, 256, 4, 2, 2)),
                                       ("embedding_bag_alltoall", (2, 2, 30, 16, 4, 3, 2, 0, 2))])
def test_a_shifted_compute_range_gives_wrong_results(name, args):
    """The mutation `gc3 simulate` calls WRONG is wrong on the GPU too: the opcode computes the
    range the step names (a test of the test: the unshifted IR passes)."""
    from runtime_cuda.core.checking import run_fused_checked
    from runtime_cuda.ranks.virtual import VirtualRanks
    prog = _lower(name, *args)
    assert run_fused_checked(VirtualRanks(prog), seed=2).wrong == 0
    res = run_fused_checked(VirtualRanks(_shifted(prog)), seed=2)
    assert res.wrong > 0, "a compute step shifted by one row/column still matched the reference"


def test_first_chunk_leaves_before_the_last_compute_chunk_ends(monkeypatch):
    """Fused, not compute-then-send, on the device: in a GC3_TRACE build (%globaltimer per step of
    each block), rank 0's first send has completed before its compute TBs finish their last gemv.
    16 column blocks on 4 compute TBs: each TB computes 4 blocks one after the other."""
    monkeypatch.setenv("GC3_TRACE", "1")
    from gc3.ir import OPCODES
    from runtime_cuda.core.checking import fused_buffers, fused_case, run_fused
    from runtime_cuda.ranks.virtual import VirtualRanks
    prog = _lower("gemv_allreduce", 2, 1, 4096, 8192, 16, 2, 4)
    group = VirtualRanks(prog)
    ins, outs = fused_buffers(group, fused_case(prog)[0])
    run_fused(group, ins, outs)          # compiles and warms up
    group.executor.clear_trace()
    run_fused(group, ins, outs)
    group.check()
    trace = group.executor.trace()
    t = group.tables
    assert t.ranks and max(len(steps) for steps in t.device_steps) < 30     # every step's stamps fit the trace

    def done(block, j):                  # one tile per chunk: step j's data is done at stamp 3 + 2j
        return int(trace[block, 3 + 2 * j])
    sends, computes = [], []
    for b, (rank, _) in enumerate(t.blocks):
        if rank != 0:
            continue
        steps = t.device_steps[b]
        sends += [done(b, j) for j, ds in enumerate(steps) if OPCODES[ds.op].send]
        gemvs = [j for j, ds in enumerate(steps) if ds.op == "gemv"]
        if gemvs:
            computes.append(done(b, gemvs[-1]))
    assert len(computes) == 4 and sends and all(sends) and all(computes)
    assert min(sends) < max(computes), (f"first send done at {min(sends)} ns, last gemv done at {max(computes)} ns: "
                                        f"compute-then-send, not fused")


def test_a_fused_call_without_compute_inputs_is_refused():
    import cupy
    from gc3.errors import GC3Error
    from runtime_cuda.ranks.virtual import VirtualRanks
    group = VirtualRanks(_lower("gemv_allreduce", 2, 1, 16, 64, 2, 2))
    out = [cupy.zeros(64, cupy.uint16) for _ in range(2)]
    with pytest.raises(GC3Error, match="needs the compute inputs"):
        group.run_ptrs([o.data.ptr for o in out], [o.data.ptr for o in out], 64, "bfloat16", "sum")
    with pytest.raises(GC3Error, match="computes in bfloat16; the call is float32"):
        group.run_ptrs([o.data.ptr for o in out], [o.data.ptr for o in out], 64, "float32", "sum",
                       compute=[(0, 0), (0, 0)])


# --- the Python API ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("path", ["fused", "sequential"])
def test_gemv_allreduce_api_on_virtual_ranks(n, dtype, path):
    import cupy
    from fused_cases import count_wrong, gemv_case, poisoned, to_host
    from runtime_cuda.fused import VirtualComm, check, gemv_allreduce
    batch, k, n_out = 3, 71, 264          # odd K, 66-column blocks
    xs, ws, want, scale = gemv_case(np.random.default_rng(n), n, batch, k, n_out, dtype)
    comm = VirtualComm(n)
    s = cupy.cuda.Stream(non_blocking=True)
    outs = [poisoned((batch, n_out), dtype) for _ in range(n)]
    for rep in range(2):   # the second call reuses the cached program and launch
        got = gemv_allreduce(xs, ws, comm, out=outs, stream=s, path=path)
        s.synchronize()
        check(comm)
        assert all(g is o for g, o in zip(got, outs))
        for r in range(n):
            wrong = count_wrong(to_host(outs[r], dtype), want, scale, dtype)
            assert wrong == 0, f"{path} rank {r} call {rep}: {wrong} of {want.size} wrong"
        for o in outs:
            o.fill(0)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("path", ["fused", "sequential"])
def test_embedding_bag_alltoall_api_on_virtual_ranks(n, dtype, path):
    import cupy
    from fused_cases import count_wrong, ebag_case, poisoned, to_host
    from runtime_cuda.fused import VirtualComm, check, embedding_bag_alltoall
    t, rows, dim, b = 3, 57, 24, 5        # nnz not a multiple of the global batch: indices padded
    tables, indices, offsets, expected = ebag_case(np.random.default_rng(10 + n), n, t, rows, dim, b, dtype)
    s = cupy.cuda.Stream(non_blocking=True)
    outs = [poisoned((n, b, t * dim), dtype) for _ in range(n)]
    comm = VirtualComm(n)
    embedding_bag_alltoall(tables, indices, offsets, comm, out=outs, stream=s, path=path)
    s.synchronize()
    check(comm)
    for p, (want, scale) in enumerate(expected):
        wrong = count_wrong(to_host(outs[p], dtype), want, scale, dtype)
        assert wrong == 0, f"{path} rank {p}: {wrong} of {want.size} wrong"


def test_api_refusals_and_bad_input():
    import cupy
    from gc3.errors import GC3Error
    from runtime_cuda.fused import VirtualComm, embedding_bag_alltoall, gemv_allreduce
    comm = VirtualComm(2)
    x = [cupy.ones((1, 8), cupy.float32)] * 2
    w = [cupy.ones((8, 64), cupy.float32)] * 2
    with pytest.raises(ValueError, match="list of 2 arrays"):
        gemv_allreduce(x[0], w, comm)
    with pytest.raises(ValueError, match=r"rank 1: x \(1, 8\) float32 and w \(9, 64\) float32 do not multiply"):
        gemv_allreduce(x, [w[0], cupy.ones((9, 64), cupy.float32)], comm)
    with pytest.raises(ValueError, match="dtype int32"):
        gemv_allreduce([a.astype(cupy.int32) for a in x], [a.astype(cupy.int32) for a in w], comm)
    tables = [cupy.ones((1, 4, 8), cupy.float32)] * 2
    off = [cupy.asarray(np.array([[0, 1, 2, 3, 4]], np.int32))] * 2
    idx = [cupy.asarray(np.array([[0, 1, 2, 3]], np.int32)), cupy.asarray(np.array([[0, 1, 4, 3]], np.int32))]
    with pytest.raises(ValueError, match=r"rank 1: indices\[0, 2\] = 4 is outside the table's 4 rows"):
        embedding_bag_alltoall(tables, idx, off, comm)
    with pytest.raises(GC3Error, match="mode 'mean'"):
        embedding_bag_alltoall(tables, [idx[0]] * 2, off, comm, mode="mean", path="fused")
    got = embedding_bag_alltoall(tables, [idx[0]] * 2, off, comm, mode="mean")    # sequential serves it
    assert float(got[0].sum()) == 2 * 2 * 8


# --- processes sharing the GPU ---------------------------------------------------------------------
def test_both_operators_in_two_processes_sharing_the_gpu():
    exe = shutil.which("mpirun")
    assert exe, "mpirun is not on PATH: the multi-process GPU tests need Open MPI"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1", GC3_TIMEOUT_S="60")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [exe, "-np", "2", sys.executable, str(ROOT / "tests" / "gpu_programs" / "fused_ops.py")]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert text.count("fused_ops ok") == 2, text[-6000:]
