"""Every class that stands for cupy.cuda.nccl.NcclCommunicator keeps cupy's whole method set,
with cupy's parameters, and answers cupy's questions about itself correctly, whatever it takes
from the shared base (runtime_cuda/nccl/surface.py): the drop-in, the host-staged MPI stand-in
for NCCL, and, for the part the drop-in asks of the NCCL communicator it holds, the fallback
where there is no NCCL.  The reference is written out here, not read from the code, so that a
base class that shadows, drops or re-spells a method fails here."""
import inspect
import sys
from pathlib import Path

import pytest

from runtime_cuda.nccl import communicator as cm
from runtime_cuda.nccl.call import Call
from runtime_cuda.nccl.constants import NCCL_FLOAT32
from runtime_cuda.nccl.fallback import NoFallback, Refusing
from runtime_cuda.nccl.hoststaged import HostStagedNccl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_nccl_dispatch import PAIRS, stand_in_comm  # noqa: E402

# cupy.cuda.nccl.NcclCommunicator's methods (cupy_backends/cuda/libs/nccl.pyx) and their
# parameters after self, in cupy's order and spelling (sendbuff/recvbuff for broadcast alone).
CUPY = {
    "allReduce": ("sendbuf", "recvbuf", "count", "datatype", "op", "stream"),
    "reduce": ("sendbuf", "recvbuf", "count", "datatype", "op", "root", "stream"),
    "broadcast": ("sendbuff", "recvbuff", "count", "datatype", "root", "stream"),
    "bcast": ("buff", "count", "datatype", "root", "stream"),
    "reduceScatter": ("sendbuf", "recvbuf", "recvcount", "datatype", "op", "stream"),
    "allGather": ("sendbuf", "recvbuf", "count", "datatype", "stream"),
    "send": ("sendbuf", "count", "datatype", "peer", "stream"),
    "recv": ("recvbuf", "count", "datatype", "peer", "stream"),
    "device_id": (),
    "rank_id": (),
    "size": (),
    "check_async_error": (),
    "destroy": (),
    "abort": (),
}
# What the drop-in calls on the NCCL communicator it holds besides the collectives.
HANDLE = ("device_id", "check_async_error", "destroy", "abort")
# The drop-in's broadcast and reduce also take the array form (arrays.ArrayCollectives), so they
# take any arguments and hand cupy's pointer form to these.
EITHER_FORM = {"broadcast": "_pointer_broadcast", "reduce": "_pointer_reduce"}
# gc3's one addition to the pointer methods (cupy has no all-to-all).
EXTENSIONS = {"allToAll": ("sendbuf", "recvbuf", "count", "datatype", "stream")}


def params(fn):
    """Parameter names after self; fails on anything cupy's methods do not have (defaults,
    keyword-only or variadic parameters)."""
    ps = list(inspect.signature(fn).parameters.values())[1:]
    for p in ps:
        assert p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty, f"{fn.__qualname__}: {p}"
    return tuple(p.name for p in ps)


class _OneProcess:
    """The mpi4py calls HostStagedNccl's constructor makes."""

    def Get_rank(self):
        return 1

    def Get_size(self):
        return 3


class _Exchange:
    rank, size = 1, 2


@pytest.mark.parametrize("method", sorted(CUPY))
def test_the_host_staged_stand_in_has_cupys_method(method):
    assert params(getattr(HostStagedNccl, method)) == CUPY[method]


@pytest.mark.parametrize("method", sorted(set(CUPY) | set(EXTENSIONS)))
def test_the_drop_in_has_cupys_method(method):
    fn = getattr(cm.NcclCommunicator, method)
    if method in EITHER_FORM:
        assert str(inspect.signature(fn)) == "(self, *args, **kwargs)"
        fn = getattr(cm.NcclCommunicator, EITHER_FORM[method])
    assert params(fn) == {**CUPY, **EXTENSIONS}[method]


@pytest.mark.parametrize("method", HANDLE)
def test_the_fallback_without_nccl_stands_in_for_the_nccl_communicator(method):
    assert params(getattr(Refusing, method)) == CUPY[method]


@pytest.mark.parametrize("cls", [cm.NcclCommunicator, HostStagedNccl, Refusing])
def test_comm_is_a_read_only_property_as_in_cupy(cls):
    assert isinstance(inspect.getattr_static(cls, "comm"), property)


def test_the_host_staged_stand_in_reports_its_own_rank_size_and_device():
    host = HostStagedNccl(_OneProcess(), 4)
    assert (host.rank_id(), host.size(), host.device_id(), host.comm) == (1, 3, 4, 0)
    assert (host.check_async_error(), host.destroy(), host.abort()) == (None, None, None)


def test_the_host_staged_bcast_is_an_in_place_broadcast():
    host = HostStagedNccl(_OneProcess(), 0)
    seen = []
    host.broadcast = lambda *args: seen.append(args)
    assert host.bcast(0x10, 7, NCCL_FLOAT32, 2, 0x77) is None
    assert seen == [(0x10, 0x10, 7, NCCL_FLOAT32, 2, 0x77)]


def test_the_refusing_fallback_reports_its_device_and_refuses_every_call():
    refusing = Refusing(5, "ranks share one GPU")
    assert (refusing.device_id(), refusing.comm) == (5, 0)
    assert (refusing.check_async_error(), refusing.destroy(), refusing.abort()) == (None, None, None)
    with pytest.raises(NoFallback, match="ranks share one GPU"):
        refusing.run(Call("send", 1, 0, 4, NCCL_FLOAT32, None, 0, 2, 0, 1))


def test_the_drop_in_without_nccl_reports_the_exchanges_rank_and_size(monkeypatch):
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    comm = cm.NcclCommunicator.without_nccl(_Exchange(), 3, "ranks share one GPU")
    assert (comm.rank_id(), comm.size(), comm.device_id(), comm.comm) == (1, 2, 3, 0)
    comm.check_async_error()
    comm.destroy()


class _NcclComm:
    """A raw NCCL communicator that records what the drop-in forwards to it."""

    comm = 0xC0FFEE

    def __init__(self):
        self.log = []

    def device_id(self):
        return 6

    def __getattr__(self, name):
        return lambda *args: self.log.append((name,) + args)


class _Backend:
    def __init__(self, log):
        self.log = log

    def check(self, cand, call):
        return None

    def check_async_error(self):
        self.log.append("backend check")

    def close(self):
        self.log.append("backend close")

    def abandon(self):
        self.log.append("backend abandon")


def test_the_drop_in_forwards_the_handle_and_lifecycle_to_nccl_and_its_backend(monkeypatch):
    monkeypatch.setenv("GC3_XML_FILES", str(PAIRS))
    nccl = _NcclComm()
    comm = stand_in_comm(nccl, 4, 2, lambda *a: _Backend(nccl.log))
    assert (comm.rank_id(), comm.size(), comm.device_id(), comm.comm) == (2, 4, 6, 0xC0FFEE)
    comm.check_async_error()
    comm.destroy()
    comm.abort()
    assert nccl.log == [("check_async_error",), "backend check", "backend close", ("destroy",),
                        "backend abandon", ("abort",)]
