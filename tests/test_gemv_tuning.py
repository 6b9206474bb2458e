"""The gemv opcode's tunables (runtime_cuda.core.module.GEMV_TUNABLES) on the CPU: their defaults come
from prims_compute.cuh, overrides from the environment or the caller reach the compute builds only,
bad values are refused by name, and every tested level of the opcode harness compiles (nvcc), the
defaults without register spills."""
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from gc3.errors import InputError
from runtime_cuda.core import module


def test_defaults_are_read_from_the_kernel_and_are_a_tested_level():
    defaults = module.gemv_defaults()
    assert set(defaults) == set(module.GEMV_TUNABLES)
    assert defaults in module.GEMV_LEVELS
    for name, values in module.GEMV_TUNABLES.items():   # the tested settings take every value
        assert sorted({level[name] for level in module.GEMV_LEVELS}) == list(values), name


def test_overrides_reach_compute_builds_only_and_the_caller_wins(monkeypatch):
    for name in module.GEMV_TUNABLES:
        monkeypatch.delenv(name, raising=False)
    assert not [o for o in module.options("bfloat16", "sum", "Simple", compute=True) if "INFLIGHT" in o]
    monkeypatch.setenv("GC3_CMP_INFLIGHT", "256")
    assert "-DGC3_CMP_INFLIGHT=256" in module.options("bfloat16", "sum", "Simple", compute=True)
    assert not [o for o in module.options("bfloat16", "sum", "Simple") if "INFLIGHT" in o]
    assert module.gemv_tuning({"GC3_CMP_INFLIGHT": 64, "GC3_CMP_MMA_INFLIGHT": 256}) == (
        ("GC3_CMP_INFLIGHT", 64), ("GC3_CMP_MMA_INFLIGHT", 256))
    # A default, however it is set, is the default build.
    assert module.gemv_tuning({"GC3_CMP_INFLIGHT": module.gemv_defaults()["GC3_CMP_INFLIGHT"]}) == ()


def test_bad_tunables_are_refused_by_name(monkeypatch):
    monkeypatch.setenv("GC3_CMP_MMA_INFLIGHT", "100")
    with pytest.raises(InputError, match=r"environment variable GC3_CMP_MMA_INFLIGHT='100': expected one of"):
        module.gemv_tuning()
    monkeypatch.setenv("GC3_CMP_MMA_INFLIGHT", "lots")
    with pytest.raises(InputError, match="GC3_CMP_MMA_INFLIGHT='lots'"):
        module.options("float32", "sum", "Simple", compute=True)
    monkeypatch.delenv("GC3_CMP_MMA_INFLIGHT")
    with pytest.raises(InputError, match="gemv tunable 'GC3_UNROLL': expected one of"):
        module.gemv_tuning({"GC3_UNROLL": 4})
    with pytest.raises(InputError, match="gemv tunable GC3_CMP_INFLIGHT=True"):
        module.gemv_tuning({"GC3_CMP_INFLIGHT": True})


def _nvcc(src, dtype, tune, cubin):
    opts = [o for o in module.options(dtype, "sum", "Simple", compute=True, tune=tune) if o.startswith("-D")]
    mode = ["-cubin", "-Xptxas", "-v"] if cubin else ["--ptx"]
    return subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", *mode, *opts, str(src), "-o", "/dev/null"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_every_level_of_the_opcode_compiles_and_the_defaults_do_not_spill(tmp_path, monkeypatch):
    for name in module.GEMV_TUNABLES:
        monkeypatch.delenv(name, raising=False)
    src = tmp_path / "gemv.cu"
    src.write_text(module.source("gemv_opcode.cu"))
    # The 16-bit types share their code (fp16 differs from bf16 in the mma's operand type only), and
    # fp32's CUDA-core passes are bf16's at other widths: every level for bf16, the last for fp32.
    jobs = [("bfloat16", tune, tune == module.gemv_defaults()) for tune in module.GEMV_LEVELS]
    jobs.append(("float32", module.GEMV_LEVELS[-1], False))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: _nvcc(src, *j), jobs))
    for (dtype, tune, cubin), r in zip(jobs, results):
        assert r.returncode == 0, f"{dtype} {tune}: {r.stderr[-3000:]}"
        if cubin:
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
            assert spills and all(s == ("0", "0") for s in spills), f"{dtype} defaults spill: {r.stderr[-2000:]}"
