"""gc3: programmable GPU collective communication.

    from gc3 import GC3Program, chunk, parallelize, Check

The names are resolved lazily so that `import gc3.xml_io` (used by the
runtime) does not pay for the DSL, networkx or matplotlib.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "GC3Program": "gc3.program",
    "chunk": "gc3.program",
    "parallelize": "gc3.program",
    "Check": "gc3.program",
    "simulate": "gc3.simulator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gc3' has no attribute {name!r}")
