"""`gc3 tune --quick` measured end to end on one GPU: two processes share it,
so NCCL cannot run; the catalog records "NCCL unavailable", is marked never
to be shipped, passes `gc3 catalog check`, and the drop-in serves what it
says -- and serves another algorithm when the catalog says another."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")]
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
       "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}


def mpirun(args, extra=None, timeout=300):
    env = dict(os.environ, **ENV, **(extra or {}), PYTHONPATH=str(ROOT))
    proc = subprocess.run(["mpirun", "-np", "2", sys.executable, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def served(catalog, nbytes):
    rc, out = mpirun([ROOT / "tests" / "gpu_programs" / "dropin_served.py", nbytes], {"GC3_CONFIG": str(catalog)})
    assert rc == 0, out[-4000:]
    line = next(l for l in out.splitlines() if l.startswith("SERVED"))
    assert line.endswith("wrong=0"), line
    return line.split()[1]


def test_quick_tune_on_one_gpu_and_the_dropin_serves_its_choice(tmp_path):
    pytest.importorskip("mpi4py")
    from runtime_cuda.commands import cli

    out = tmp_path / "catalog.json"
    t0 = time.monotonic()
    rc, text = mpirun(["-m", "runtime_cuda", "tune", "--quick", "-o", out], timeout=200)
    took = time.monotonic() - t0
    assert rc == 0, text[-6000:]
    assert took < 120, f"gc3 tune --quick took {took:.0f} s on one GPU (budget 120 s)\n{text[-3000:]}"
    assert "s left" in text and "NOT SHIPPABLE" in text, text[-3000:]
    catalog = json.loads(out.read_text())
    prov = catalog["provenance"]
    assert prov["measured"] is True and prov["timer"] == "measured" and prov["shippable"] is False
    assert prov["time"] == "eager us per call", prov["time"]   # two processes share the GPU: no graphs
    assert prov["nccl"].startswith("NCCL unavailable") and "never be shipped" in prov["not_shippable"]
    # the GPUs it was measured on, as the drop-in's default finds catalogs: two ranks on one GPU
    assert prov["fingerprint"].startswith("2x") and prov["fingerprint"].endswith("|SELF-all"), prov["fingerprint"]
    assert {e["collective"] for e in catalog["algorithms"]} >= {"allreduce", "allgather", "reducescatter"}
    check = CliRunner().invoke(cli(), ["catalog", "check", str(out)])
    assert check.exit_code == 0, check.output

    nbytes = 64 << 10
    entry = next(e for e in catalog["algorithms"] if e["collective"] == "allreduce" and e["inplace"]
                 and e["min_bytes"] <= nbytes and (e["max_bytes"] is None or nbytes <= e["max_bytes"]))
    assert served(out, nbytes) == entry["name"]
    # Another catalog that gives this call to another in-place allreduce candidate.
    from gc3.ir.xml_io import write_xml
    from runtime_cuda.nccl import tune

    cands, _ = tune.candidates("allreduce", 2, 1, tune.QUICK)
    other = next(c for c in cands if c.inplace and c.label != entry["name"])
    write_xml(other.program, tmp_path / f"{other.label}.xml")
    alt = tmp_path / "alt.json"
    alt.write_text(json.dumps({"version": 1, "algorithms": [
        {"file": f"{other.label}.xml", "collective": "allreduce", "ranks": 2, "inplace": True, "name": other.label}]}))
    assert served(alt, nbytes) == other.label != entry["name"]
