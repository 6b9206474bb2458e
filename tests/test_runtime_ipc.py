"""One process per GPU (mpirun, CUDA IPC): every 2-rank sample, checked on
data by runtime_cuda.ranks.ipc_check, plus a broken program ending in the timeout
error on both processes."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gc3.ir.xml_io import read_xml

ROOT = Path(__file__).resolve().parent.parent
TWO_RANK = [p for p in sorted((ROOT / "tests" / "data" / "msccl").glob("*.xml")) + sorted((ROOT / "ir_samples").glob("*.xml"))
            if read_xml(p).ngpus == 2]


def _ipc_check(args, timeout):
    """Run runtime_cuda.ranks.ipc_check with 2 processes; its output and IPC-CHECK lines."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    proc = subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable,
         "-m", "runtime_cuda.ranks.ipc_check", *map(str, args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, out[-4000:]
    return out, [l for l in out.splitlines() if l.startswith("IPC-CHECK")]


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_two_processes_two_gpus_every_two_rank_sample():
    pytest.importorskip("mpi4py")
    assert TWO_RANK, "no 2-rank sample found"
    out, lines = _ipc_check(TWO_RANK, timeout=600)
    assert len(lines) == len(TWO_RANK), out[-4000:]
    assert all(" 0 wrong" in l for l in lines), out[-4000:]
    timeouts = [l for l in out.splitlines() if l.startswith("IPC-TIMEOUT")]
    assert len(timeouts) == 2 and all("timed out" in l or "gave up" in l for l in timeouts), out[-4000:]
    # a set-up failure on rank 1 alone is raised on both ranks, naming rank 1
    setup = [l for l in out.splitlines() if l.startswith("IPC-SETUP")]
    assert len(setup) == 2 and all("set-up failed while allocating" in l and "rank 1:" in l for l in setup), out[-4000:]


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_two_processes_256mib_per_rank(tmp_path):
    """The ring (Simple), the one-shot (LL, at the most ir_samples/index.json
    recommends it for) and an alltoall at 256 MiB per rank in float32 and an
    uneven count near it in bfloat16: `ipc_check --large`."""
    pytest.importorskip("mpi4py")
    from gc3.compiler.pipeline import lower
    from gc3.dsl.program import run_script
    from gc3.ir.xml_io import write_xml

    a2a = tmp_path / "alltoall_direct_2r_Simple_i8.xml"
    write_xml(lower(run_script(str(ROOT / "gc3" / "algorithms" / "alltoall_direct.py"), ["2"]), instances=8,
                    protocol="Simple"), a2a)
    paths = [ROOT / "ir_samples" / "allreduce_ring_2r_inplace_Simple_i64_unfused.xml",   # serves 256 MiB
             ROOT / "ir_samples" / "allreduce_oneshot_2r_LL_i16.xml", a2a]
    out, lines = _ipc_check(["--large", *paths], timeout=300)
    assert len(lines) == len(paths), out[-4000:]
    assert all(" 0 wrong" in l for l in lines), out[-4000:]
    # 256 MiB per rank of float32 and nearly as much bfloat16, on both ranks
    ring = next(l for l in lines if "allreduce_ring_2r" in l)
    assert int(ring.split(": ")[1].split()[0]) >= 2 * (2 * (64 << 20) - 1), ring
