"""`gc3 fuzz` (runtime_cuda/commands/fuzz.py) as a user meets it on any machine: its options,
a bad one refused with exit 2 naming it, and, where there is no GPU, exit 2 in one line
saying so rather than a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gc3(*args):
    out = subprocess.run([sys.executable, "-m", "runtime_cuda", "fuzz", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def _gpu():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def test_help_lists_the_options():
    rc, out = gc3("--help")
    assert rc == 0 and "usage: gc3 fuzz" in out and "--mode" in out and "--time-budget" in out


@pytest.mark.parametrize("args, says", [(("--colls", "allreduce,nope"), "unknown collective nope"),
                                        (("--dtypes", "float128"), "unknown dtype or op"),
                                        (("--calls", "-1"), "counts must be positive"),
                                        (("--mode", "threads"), "invalid choice")])
def test_bad_options_exit_2_naming_what(args, says):
    rc, out = gc3(*args)
    assert rc == 2 and says in out, out


def test_without_a_gpu_it_says_so_in_one_line():
    if _gpu():
        pytest.skip("this machine has a GPU: the fuzz would run")
    rc, out = gc3("--calls", "5")
    assert rc == 2, out
    assert out.strip().splitlines() == [out.strip()] and "needs CUDA GPUs" in out, out
