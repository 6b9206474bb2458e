import os
import tempfile

import pytest


def pytest_configure(config):
    # The NCCL catalog caches verification verdicts; tests keep theirs out of ~/.cache.
    os.environ["GC3_CACHE_DIR"] = tempfile.mkdtemp(prefix="gc3-test-cache-")


def _cuda_devices() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no cupy, no driver, or no device: all mean "no GPU here"
        return 0


def pytest_collection_modifyitems(config, items):
    ndev = _cuda_devices()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (cupy found none)")
    skip_multi = pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs (found {ndev})")
    for item in items:
        if "gpu" in item.keywords and ndev < 1:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and ndev < 2:
            item.add_marker(skip_multi)
