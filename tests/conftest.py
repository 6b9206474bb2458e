import os
import shutil
import tempfile

import pytest

from gpu_availability import GpuProbeError, probe_cupy

# (marker, devices it needs)
_GPU_MARKERS = (("gpu", 1), ("multigpu", 2))


_CACHE_DIR = []


def pytest_configure(config):
    # The NCCL catalog caches verification verdicts; tests keep theirs out of ~/.cache.
    _CACHE_DIR.append(tempfile.mkdtemp(prefix="gc3-test-cache-"))
    os.environ["GC3_CACHE_DIR"] = _CACHE_DIR[-1]


def pytest_unconfigure(config):
    # ... and leave nothing behind in /tmp once the session is over.
    while _CACHE_DIR:
        shutil.rmtree(_CACHE_DIR.pop(), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if any(m in it.keywords for m, _ in _GPU_MARKERS)]
    if not gpu_items:
        return  # a CPU-only selection does not depend on the CUDA setup
    try:
        avail = probe_cupy()
    except GpuProbeError as e:
        raise pytest.UsageError(str(e)) from e
    for item in gpu_items:
        for marker, needs in _GPU_MARKERS:
            if marker in item.keywords:
                reason = avail.skip_reason(needs)
                if reason is not None:
                    item.add_marker(pytest.mark.skip(reason=reason))
