"""gc3's drop-in for `cupy.cuda.nccl`.

    from runtime_cuda import nccl          # instead of: from cupy.cuda import nccl
    uid = nccl.get_unique_id()
    comm = nccl.NcclCommunicator(nranks, uid, rank)
    comm.allReduce(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)

Each call runs a gc3 algorithm when one in the catalog (GC3_XML_FILES,
MSCCL_XML_FILES, GC3_CONFIG, else the one measured on GPUs like the
communicator's; see `catalog` and `machine`) matches it, and NCCL otherwise;
GC3_DEBUG=INFO says which and why.  The communicator
and NCCL itself load on first use so that the selection logic imports without
a GPU.
"""
from importlib import import_module

from .constants import *  # noqa: F401,F403  (the NCCL_* codes, as cupy.cuda.nccl has them)
from .constants import DTYPE_NAMES, OP_NAMES  # noqa: F401

_LAZY = {
    "NcclCommunicator": "communicator", "get_unique_id": "communicator", "groupStart": "communicator",
    "groupEnd": "communicator", "get_version": "communicator", "get_build_version": "communicator",
    "NcclError": "communicator",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
