"""Whether GPU tests can run here, decided from a device probe.

A GPU test that skips on a machine that has GPUs hides a broken setup (a
driver/toolkit mismatch, a device in a bad state) behind a green run, so
only the two "there is nothing to run on" answers skip: CuPy not installed
(or unable to load its CUDA libraries, which CuPy reports as ImportError),
and the CUDA runtime saying there is no device or no usable driver. Every
other error is raised so that the run fails with the probe's message.

The decision is separated from the probe so that it can be tested on a
machine without CuPy (tests/test_gpu_availability.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

# cudaError_t codes that mean "no GPU on this machine", not "GPU broken".
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
NO_GPU_STATUSES = {
    CUDA_ERROR_INSUFFICIENT_DRIVER: "cudaErrorInsufficientDriver",
    CUDA_ERROR_NO_DEVICE: "cudaErrorNoDevice",
}


class GpuProbeError(RuntimeError):
    """The CUDA probe failed in a way that does not mean "no GPU here"."""


@dataclass(frozen=True)
class GpuAvailability:
    ndev: int
    reason: str  # why there are no devices, when ndev == 0

    def skip_reason(self, needs: int) -> Optional[str]:
        """Why a test needing `needs` devices must skip, or None to run it."""
        if self.ndev >= needs:
            return None
        if self.ndev == 0:
            return f"needs a CUDA GPU ({self.reason})"
        return f"needs >= {needs} CUDA GPUs (found {self.ndev})"


def cupy_probe() -> int:
    import cupy
    return int(cupy.cuda.runtime.getDeviceCount())


def cupy_runtime_error_type() -> Optional[type]:
    try:
        import cupy
    except ImportError:
        return None
    return cupy.cuda.runtime.CUDARuntimeError


def decide(probe: Callable[[], int], runtime_error: Optional[type]) -> GpuAvailability:
    """Run `probe` (returns the device count) and classify the outcome.

    `runtime_error` is the exception type the CUDA runtime raises (CuPy's
    CUDARuntimeError, whose `.status` is the cudaError_t code); only its
    no-device and no-driver codes count as "no GPU". Raises GpuProbeError
    for anything else.
    """
    try:
        ndev = probe()
    except ImportError as e:
        return GpuAvailability(0, f"cupy not importable: {e}")
    except Exception as e:
        status = getattr(e, "status", None)
        if runtime_error is not None and isinstance(e, runtime_error) and status in NO_GPU_STATUSES:
            return GpuAvailability(0, f"CUDA runtime: {NO_GPU_STATUSES[status]} ({status})")
        raise GpuProbeError(
            f"probing CUDA devices failed with {type(e).__name__}: {e}; this is not "
            "'no device' or 'no driver', so GPU tests are not skipped: fix the setup "
            "(or deselect them with -m 'not gpu and not multigpu')") from e
    if not isinstance(ndev, int) or ndev < 0:
        raise GpuProbeError(f"probing CUDA devices returned {ndev!r}, not a device count")
    if ndev == 0:
        return GpuAvailability(0, "CUDA runtime reports 0 devices")
    return GpuAvailability(ndev, "")


def probe_cupy() -> GpuAvailability:
    return decide(cupy_probe, cupy_runtime_error_type())
