"""First-use tuning on a GPU: with GC3_AUTOTUNE=1 the first communicator measures a
catalog for its GPUs (two processes sharing one GPU here) and caches it; the next
process finds it by the GPUs' fingerprint, serves from it without tuning again, and
its call is served by the entry the cached catalog names."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "gpu_programs" / "dropin_served.py"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")]
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
       "PYTHONUNBUFFERED": "1"}
# Within the smallest sizes, which even a budget cut short measures (20 s on two processes sharing
# one GPU reached 2 KiB).
NBYTES = 1024


def run(cache: Path):
    env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT), GC3_CACHE_DIR=str(cache), GC3_AUTOTUNE="1",
               GC3_AUTOTUNE_S="20", GC3_AUTOTUNE_MAX_BYTES="16K", GC3_DEBUG="INFO")
    for var in ("GC3_CONFIG", "GC3_XML_FILES", "MSCCL_XML_FILES"):
        env.pop(var, None)
    proc = subprocess.run(["mpirun", "-np", "2", sys.executable, str(PROGRAM), str(NBYTES)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    lines = out.splitlines()
    machine = next(l for l in lines if l.startswith("MACHINE"))
    served = next(l for l in lines if l.startswith("SERVED")).split()     # SERVED <route> wrong=<n>
    return dict([f.split("=", 1) for f in machine.split()[1:]] + [("route", served[1]), served[2].split("=")]), out


def test_a_catalog_tuned_on_first_use_is_picked_up_by_the_next_process(tmp_path):
    pytest.importorskip("mpi4py")
    cache = tmp_path / "cache"
    first, out = run(cache)
    assert "GC3_AUTOTUNE: measuring a catalog for GPUs" in out and "GC3_AUTOTUNE: cached" in out, out[-4000:]
    assert first["origin"] == "cached" and first["wrong"] == "0", first
    path = Path(first["path"])
    assert path.is_file() and cache in path.parents
    catalog = json.loads(path.read_text())
    prov = catalog["provenance"]
    assert prov["measured"] is True and prov["fingerprint"].startswith("2x") and prov["fingerprint"].endswith(
        "|SELF-all"), prov.get("fingerprint")
    assert prov["command"].startswith("GC3_AUTOTUNE=1"), prov["command"]

    second, out = run(cache)
    assert "GC3_AUTOTUNE: measuring" not in out, "the second process tuned again instead of loading the cache"
    assert (second["origin"], second["path"]) == ("cached", str(path)) and second["wrong"] == "0", second
    entry = next((e for e in catalog["algorithms"] if e["collective"] == "allreduce" and e["inplace"]
                  and e["min_bytes"] <= NBYTES and (e["max_bytes"] is None or NBYTES <= e["max_bytes"])), None)
    # Sizes the budget left unmeasured are NCCL's: the call goes where the catalog says either way.
    assert second["route"] == (entry["name"] if entry else "NCCL"), (second, entry, catalog["algorithms"])
