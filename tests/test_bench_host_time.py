"""scripts/bench_host_time.py on the CPU: the catalog it serves its calls from
names one LL candidate per collective (out of place where the library
has one), and the drop-in loads it
whole (the timing itself needs a GPU: see the script's docstring)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench_host_time as bht  # noqa: E402


@pytest.mark.parametrize("nranks", [2, 4])
def test_catalog_has_one_ll_candidate_per_collective(tmp_path, nranks):
    from runtime_cuda.nccl.catalog import check_config

    chosen = bht.write_catalog(tmp_path, nranks)
    assert set(chosen) == set(bht.COLLS)
    good, problems = check_config(tmp_path / "catalog.json")
    assert problems == [] and {c.name: c.program.inplace for c in good} == dict(chosen.values())
    for c in good:
        assert c.program.proto == "LL" and c.ranks == nranks
        assert c.program.inplace == (c.collective == "allreduce")   # the library's allreduces are in place
