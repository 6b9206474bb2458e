"""Where in the user's program a DSL call was made, for error messages and `Op.where`."""
from __future__ import annotations

import os
import sys
from functools import lru_cache

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_location() -> str:
    """'file.py:line' of the innermost stack frame outside the gc3 package."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _internal(filename):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>:0"


@lru_cache(maxsize=None)
def _internal(filename: str) -> bool:
    return filename.startswith("<frozen") or os.path.abspath(filename).startswith(_PACKAGE_DIR)
