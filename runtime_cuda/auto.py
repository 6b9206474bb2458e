"""Swap gc3 in under code that imports `cupy.cuda.nccl` and cannot change.

With GC3_NCCL=1 in the environment, importing this module replaces
`cupy.cuda.nccl.NcclCommunicator`, `groupStart` and `groupEnd` by gc3's
(`runtime_cuda.nccl`); without it, importing does nothing.  The one-line hook,
placed before the program creates its communicators:

    import runtime_cuda.auto  # noqa: F401

or, for a script you cannot edit at all:

    GC3_NCCL=1 python -m runtime_cuda.auto your_script.py args...

Code that looks the names up through the module (`nccl.NcclCommunicator(...)`,
`cupyx.distributed`) sees the swap whenever it runs; a name bound earlier by
`from cupy.cuda.nccl import NcclCommunicator` keeps NCCL's, so put the hook first.
The replaced originals are kept in `cupy.cuda.nccl._gc3_originals`; gc3's
fallback uses them, so NCCL still serves whatever gc3 does not.
"""
from __future__ import annotations

import runpy
import sys

from gc3 import settings

SWAPPED = ("NcclCommunicator", "groupStart", "groupEnd")


def enabled(env=None) -> bool:
    return settings.get("GC3_NCCL", env)


def install() -> bool:
    """Replace the names in cupy.cuda.nccl (idempotent); False when cupy has no NCCL."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        return False
    if not getattr(nccl, "available", True):
        return False
    from . import nccl as gc3_nccl
    if not hasattr(nccl, "_gc3_originals"):
        nccl._gc3_originals = {name: getattr(nccl, name) for name in SWAPPED + ("get_unique_id",)}
    for name in SWAPPED:
        setattr(nccl, name, getattr(gc3_nccl, name))
    return True


def uninstall() -> None:
    """Put cupy.cuda.nccl back as it was."""
    from cupy.cuda import nccl
    saved = getattr(nccl, "_gc3_originals", None)
    if saved is None:
        return
    for name in SWAPPED:
        setattr(nccl, name, saved[name])
    del nccl._gc3_originals


if enabled():
    install()

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: GC3_NCCL=1 python -m runtime_cuda.auto SCRIPT [ARGS...]")
    if not enabled():
        print("runtime_cuda.auto: GC3_NCCL is not 1; running the script on NCCL unchanged", file=sys.stderr)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
