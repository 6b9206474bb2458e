"""The GEMM fusions on a real GPU (tests/gpu_programs/fused_gemm_check.py):
every operator on 2 and 4 virtual ranks and on 2 processes sharing the GPU
through CUDA IPC, bf16 against float64 references, poisoned outputs, random
per-rank delays, non-default streams, back-to-back calls, skewed A2A splits,
odd row counts; also under CUDA_DEVICE_MAX_CONNECTIONS=1, with both ways of
releasing a flag, on the sequential path, and the watchdog: a wait that can
never end raises within GC3_FUSED_TIMEOUT instead of hanging."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "gpu_programs" / "fused_gemm_check.py"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1"}
OK = ", 0 wrong"


def run(args, extra_env=None, mpi=0, timeout=180):
    env = dict(os.environ, **MPI_ENV)
    for var in ("GC3_FUSED", "GC3_FUSED_RELEASE", "GC3_FUSED_WAIT", "GC3_FUSED_TIMEOUT", "GC3_DEBUG",
                "GC3_FUSED_PARTIALS", "CUDA_DEVICE_MAX_CONNECTIONS"):
        env.pop(var, None)
    env.update(extra_env or {})
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(CHECK), *map(str, args)]
    if mpi:
        exe = shutil.which("mpirun")
        assert exe, "mpirun is not on PATH: the multi-process GPU tests need Open MPI"
        cmd = [exe, "-np", str(mpi)] + cmd
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("n", [2, 4])
def test_virtual_ranks(n):
    rc, out = run(["--virtual", n, "--rounds", 3, "--seed", n])
    assert rc == 0 and OK in out, out[-6000:]


def test_virtual_ranks_with_16_bit_partials():
    """GC3_FUSED_PARTIALS=input: GEMM+RS/AR partials cross in bf16 and are still within the
    references' tolerance (one more rounding per partial than fp32 partials)."""
    rc, out = run(["--virtual", 4, "--rounds", 2, "--seed", 5], {"GC3_FUSED_PARTIALS": "input"})
    assert rc == 0 and OK in out, out[-6000:]


def test_virtual_ranks_under_one_device_connection():
    rc, out = run(["--virtual", 4, "--rounds", 2], {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "GC3_FUSED_TIMEOUT": "20"})
    assert rc == 0 and OK in out, out[-6000:]


def test_kernel_released_flags_and_the_sequential_path():
    rc, out = run(["--virtual", 2, "--rounds", 2, "--fused", "0"], {"GC3_FUSED_RELEASE": "kernel"})
    assert rc == 0 and OK in out and "release=kernel" in out, out[-6000:]


def test_small_m_runs_sequential_and_says_so():
    rc, out = run(["--virtual", 2, "--rounds", 1, "--m", 64], {"GC3_DEBUG": "INFO"})
    assert rc == 0 and OK in out, out[-6000:]
    assert "gemm_reduce_scatter M=64" in out and "sequential (32 rows per chunk < GC3_FUSED_MIN_ROWS" in out, out[-4000:]


def test_two_processes_sharing_the_gpu():
    rc, out = run(["--rounds", 3], mpi=2, timeout=240)
    assert rc == 0 and out.count(OK) == 2, out[-6000:]


def test_two_processes_under_one_device_connection():
    rc, out = run(["--rounds", 1], {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "GC3_FUSED_TIMEOUT": "20"}, mpi=2, timeout=240)
    assert rc == 0 and out.count(OK) == 2, out[-6000:]


def test_the_check_can_fail():
    rc, out = run(["--virtual", 2, "--rounds", 1, "--corrupt"])
    assert rc == 1 and "MISMATCH" in out, out[-4000:]


@pytest.mark.parametrize("connections", [None, "1"])
def test_a_flag_never_set_raises_within_the_timeout(connections):
    env = {"GC3_FUSED_TIMEOUT": "2"}
    if connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    rc, out = run(["--never-set"], env, timeout=60)
    assert rc == 0 and "WATCHDOG OK" in out and "chunk 3, rank 0" in out, out[-4000:]


def test_a_missing_peer_is_named_within_the_timeout():
    rc, out = run(["--stuck", "--timeout", 3], mpi=2, timeout=90)
    assert rc == 0 and "WATCHDOG OK" in out and "from rank 1" in out, out[-4000:]


def test_driver_stream_waits():
    """GC3_FUSED_WAIT=driver (cuStreamWaitValue32, watched by the host thread), where cuda.bindings imports."""
    probe = subprocess.run([sys.executable, "-c", "from cuda.bindings import driver"], capture_output=True)
    if probe.returncode:
        pytest.skip("cuda.bindings does not import here: the driver's stream memory operations are unavailable")
    rc, out = run(["--virtual", 2, "--rounds", 2], {"GC3_FUSED_WAIT": "driver", "GC3_FUSED_RELEASE": "driver"})
    assert rc == 0 and OK in out and "release=driver, wait=driver" in out, out[-6000:]


def _traced(op: str, n: int, fused: bool, late_rank=None):
    """One traced call of `op` on n virtual ranks at a shape where each GEMM chunk takes
    ~100 us (M = K = N = 4096, bf16), after a warm-up call; rank `late_rank`'s stream is
    held 2 ms before it.  Returns (trace, what is wrong with the result or None)."""
    import cupy
    from runtime_cuda.fused import VirtualGemmGroup, all_gather_gemm, gemm_reduce_scatter, gemm_signal
    from runtime_cuda.fused import gemm_reference as ref
    M = K = N = 4096
    rows = M if op == "rs" else M // n
    A = [ref.matrix(n, r, "a", (rows, K), "bfloat16") for r in range(n)]
    B = [ref.matrix(n, r, "b", (K, N), "bfloat16") for r in range(n)]
    users = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
    g = VirtualGemmGroup(n, trace=True)
    try:
        cupy.cuda.Device().synchronize()
        run = gemm_reduce_scatter if op == "rs" else all_gather_gemm
        run(A, B, g, stream=users, fused=fused)
        g.synchronize()
        if late_rank is not None:
            gemm_signal.spin(users[late_rank].ptr, 0.002)
        out = run(A, B, g, stream=users, fused=fused)
        g.synchronize()
        if op == "rs":
            full, bad = ref.reduce_scatter_ref(A, B), []
            for r in range(n):
                bad.append(ref.mismatch(out[r], full[r * M // n:(r + 1) * M // n], "bfloat16", f"rank {r}"))
        else:
            bad = [ref.mismatch(out[r], ref.all_gather_ref(A, B[r]), "bfloat16", f"rank {r}") for r in range(n)]
        return g.trace, next((b for b in bad if b), None)
    finally:
        g.close()


@pytest.mark.parametrize("n", [2, 4])
def test_device_timestamps_show_gemm_rs_overlap(n):
    """%globaltimer stamps: on every rank the first transfer starts before the last GEMM
    chunk ends (fused); the sequential path fails the same assertion (it can fail)."""
    for fused in (True, False):
        trace, bad = _traced("rs", n, fused)
        assert bad is None, bad
        starts_early = [min(trace.times("transfer start", r)) < max(trace.times("gemm end", r)) for r in range(n)]
        assert starts_early == [fused] * n, f"fused={fused}:\n{trace.format()}"


@pytest.mark.parametrize("n", [2, 4])
def test_device_timestamps_show_ag_gemm_overlap(n):
    """AG+GEMM with rank 1 late by 2 ms: fused, rank 0 finishes GEMM chunks of the blocks it
    has before rank 1's block arrives; sequential, its one GEMM ends after every arrival."""
    for fused in (True, False):
        trace, bad = _traced("ag", n, fused, late_rank=1)
        assert bad is None, bad
        computes_early = min(trace.times("gemm end", 0)) < max(trace.times("transfer end", peer=0))
        assert computes_early == fused, f"fused={fused}:\n{trace.format()}"
