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
                "CUDA_DEVICE_MAX_CONNECTIONS"):
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
