"""Stand-ins for CuPy, its streams and a one-rank MPI communicator, backed by
numpy, for testing the benchmarks' host logic on a machine without a GPU."""
import sys
import types

import numpy as np


class DevArray(np.ndarray):
    """A numpy array with CuPy's `.data.ptr`."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


class FakeStream:
    """A stream that records which one is current, as CuPy's `use()` does."""
    current = None

    def __init__(self, ptr):
        self.ptr = ptr

    def use(self):
        FakeStream.current = self
        return self

    def synchronize(self):
        pass


class FakeEvent:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class OneRankMpi:
    """mpi4py's COMM_WORLD of a single process."""
    rank, size = 0, 1

    def Barrier(self):
        pass

    def allreduce(self, x, op=None):
        return x

    def allgather(self, x):
        return [x]


def install(monkeypatch):
    """Put numpy-backed `cupy` and `mpi4py` modules in sys.modules (undone by monkeypatch)."""
    cupy = types.ModuleType("cupy")
    cupy.__getattr__ = lambda name: getattr(np, name)
    cupy.empty = lambda n, dtype: np.empty(n, dtype).view(DevArray)
    FakeStream.current = FakeStream(0)
    cupy.cuda = types.SimpleNamespace(Event=FakeEvent, get_elapsed_time=lambda a, b: 1.0,
                                      get_current_stream=lambda: FakeStream.current)
    mpi = types.ModuleType("mpi4py")
    mpi.MPI = types.SimpleNamespace(MAX="max", SUM="sum")
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "mpi4py", mpi)
    return cupy
