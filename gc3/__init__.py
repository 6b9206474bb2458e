"""gc3: programmable GPU collective communication.

    from gc3 import GC3Program, chunk, parallelize, Check
    from gc3 import gemv, embedding_bag, gemm     # compute producers, under a fused collective

The names are resolved lazily so that `import gc3.ir.xml_io` (used by the
runtime) does not pay for the DSL, networkx or matplotlib.

How it is built (one folder per stage, in the order a chunk goes through them):
dsl/ -> compiler/ -> ir/ -> verify/, simulator/; cli/ is the `gc3` command.
`lower` is toolchain.py's: the compiler's lowering, with the epilogue placed by
the verifier's symbolic run.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "GC3Program": "gc3.dsl.program",
    "chunk": "gc3.dsl.program",
    "gemv": "gc3.dsl.program",
    "embedding_bag": "gc3.dsl.program",
    "gemm": "gc3.dsl.program",
    "parallelize": "gc3.dsl.program",
    "Check": "gc3.dsl.program",
    "int_args": "gc3.dsl.program",
    "lower": "gc3.toolchain",
    "simulate": "gc3.simulator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gc3' has no attribute {name!r}")
