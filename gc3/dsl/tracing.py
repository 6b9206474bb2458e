"""The tracing state and the buffer names: what `program.py` and `chunk_ref.py` share.

The only global of the DSL is here: the program being traced, and (inside
`program.run_script`) the list of programs a script traced.
"""
from __future__ import annotations

from enum import Enum
from typing import List, Optional

from ..errors import TraceError
from ..units import user_location


class Buffer(str, Enum):
    """msccl-tools' buffer names, so ported programs can say Buffer.input."""
    input = "i"
    output = "o"
    scratch = "s"


_BUFFER_NAMES = {"i": "i", "in": "i", "input": "i", "o": "o", "out": "o", "output": "o",
                 "s": "s", "sc": "s", "scratch": "s"}


def canonical_buffer(buffer, where: str) -> str:
    """'in'/'input' -> 'i', 'out'/'output' -> 'o', 'sc'/'scratch' -> 's'; other names are named scratch."""
    if isinstance(buffer, Enum):
        buffer = buffer.value
    if not isinstance(buffer, str) or not buffer:
        raise TraceError(f"{where}: buffer {buffer!r} must be a non-empty string")
    return _BUFFER_NAMES.get(buffer, buffer)


class _Tracing:
    def __init__(self):
        self.current = None                    # the GC3Program being traced
        self.recorded: Optional[List] = None   # the GC3Programs a script traced; set by run_script


_tracing = _Tracing()


def _current(what: str) -> "GC3Program":
    if _tracing.current is None:
        raise TraceError(f"{user_location()}: {what} called outside a `with GC3Program(...)` block")
    return _tracing.current
