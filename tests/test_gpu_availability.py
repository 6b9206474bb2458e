"""When GPU tests skip and when they must fail (tests/gpu_availability.py)."""
import pytest

import conftest
from gpu_availability import GpuAvailability, GpuProbeError, decide


class FakeCUDARuntimeError(Exception):
    def __init__(self, status):
        super().__init__(f"cudaError {status}")
        self.status = status


def raising(exc):
    def probe():
        raise exc
    return probe


def test_cupy_missing_skips():
    avail = decide(raising(ImportError("No module named 'cupy'")), None)
    assert avail.ndev == 0
    assert "cupy not importable" in avail.skip_reason(1)


@pytest.mark.parametrize("status,name", [(100, "cudaErrorNoDevice"), (35, "cudaErrorInsufficientDriver")])
def test_no_device_or_no_driver_skips(status, name):
    avail = decide(raising(FakeCUDARuntimeError(status)), FakeCUDARuntimeError)
    assert avail.ndev == 0
    assert name in avail.skip_reason(1)


@pytest.mark.parametrize("status", [2, 3, 46, 201, 999])
def test_other_runtime_status_fails(status):
    with pytest.raises(GpuProbeError, match=f"cudaError {status}"):
        decide(raising(FakeCUDARuntimeError(status)), FakeCUDARuntimeError)


def test_no_device_status_from_another_error_type_fails():
    # A status of 100 on something that is not the runtime's error (a driver-API
    # error, say) does not mean the same thing.
    class OtherError(Exception):
        status = 100
    with pytest.raises(GpuProbeError):
        decide(raising(OtherError()), FakeCUDARuntimeError)


def test_unexpected_exception_fails():
    with pytest.raises(GpuProbeError, match="OSError"):
        decide(raising(OSError("libcuda.so: cannot open")), FakeCUDARuntimeError)


def test_zero_devices_skips():
    avail = decide(lambda: 0, FakeCUDARuntimeError)
    assert avail.ndev == 0
    assert "0 devices" in avail.skip_reason(1)
    assert avail.skip_reason(2) is not None


def test_one_device_runs_gpu_skips_multigpu():
    avail = decide(lambda: 1, FakeCUDARuntimeError)
    assert avail.skip_reason(1) is None
    assert "found 1" in avail.skip_reason(2)


def test_two_devices_run_both():
    avail = decide(lambda: 2, FakeCUDARuntimeError)
    assert avail.skip_reason(1) is None and avail.skip_reason(2) is None


class FakeItem:
    def __init__(self, *markers):
        self.keywords = {m: True for m in markers}
        self.skips = []

    def add_marker(self, mark):
        self.skips.append(mark.kwargs["reason"])


def test_hook_marks_items_by_availability(monkeypatch):
    monkeypatch.setattr(conftest, "probe_cupy", lambda: GpuAvailability(1, ""))
    cpu, gpu, multi = FakeItem(), FakeItem("gpu"), FakeItem("multigpu")
    conftest.pytest_collection_modifyitems(None, [cpu, gpu, multi])
    assert cpu.skips == [] and gpu.skips == []
    assert multi.skips and "found 1" in multi.skips[0]


def test_hook_turns_probe_error_into_usage_error(monkeypatch):
    def broken():
        raise GpuProbeError("probing CUDA devices failed with OSError: boom")
    monkeypatch.setattr(conftest, "probe_cupy", broken)
    with pytest.raises(pytest.UsageError, match="boom"):
        conftest.pytest_collection_modifyitems(None, [FakeItem("gpu")])
    # without GPU items the probe is not consulted
    conftest.pytest_collection_modifyitems(None, [FakeItem()])
