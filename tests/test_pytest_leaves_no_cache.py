"""A pytest run removes the verdict cache it made for itself (conftest.py)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_pytest_run_leaves_no_cache_dir_behind(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("GC3_CACHE_DIR", None)
    # conftest makes the cache folder in every run, whatever the tests are
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_units.py::test_bus_factor_is_nccl_tests"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not list(tmp_path.glob("gc3-test-cache-*")), list(tmp_path.iterdir())
