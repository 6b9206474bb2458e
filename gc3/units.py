"""What the user passed and where: the user's file:line of a DSL call, and int arguments checked once."""
from __future__ import annotations

import operator
import os
import sys
from functools import lru_cache
from typing import Optional, Type

from .errors import TraceError

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


def as_int(value, what: str, low: int = 0, where: Optional[str] = None,
           error: Type[Exception] = TraceError, high: Optional[int] = None, limit: str = "") -> int:
    """`value` as an int in [low, high] (numpy ints welcome, bools not), or `error`
    naming the call site (and `limit`, the gc3.limits name of `high`)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low:
        raise error(f"{where or user_location()}: {what} must be an int >= {low}, got {value!r}")
    if high is not None and number > high:
        raise error(f"{where or user_location()}: {what}={number} is more than "
                    f"{'gc3.limits.' + limit + '=' if limit else ''}{high}")
    return number


def strict_int(text, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """An integer written in ASCII digits with an optional leading '-' (no '_',
    spaces, '+' or other scripts' digits, which Python's int() would take), within
    [low, high]; ValueError saying what was expected otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"expected an integer, got {text!r}")
    if isinstance(text, int):
        number = text
    else:
        s = str(text)
        digits = s[1:] if s.startswith("-") else s
        if not digits or not (digits.isascii() and digits.isdigit()) or len(digits) > 30:
            raise ValueError("expected an integer of ASCII digits")
        number = int(s)
    if (low is not None and number < low) or (high is not None and number > high):
        lo = "" if low is None else f"{low} <= "
        hi = "" if high is None else f" <= {high}"
        raise ValueError(f"out of range: expected {lo}value{hi}")
    return number


def env_number(name: str, raw: str, low, high, kind=int):
    """Environment variable `name`'s value `raw` as an int (strict ASCII digits)
    or a finite float in [low, high]; InputError naming the variable otherwise."""
    from .errors import InputError
    try:
        if kind is int:
            return strict_int(raw.strip(), low, high)
        value = float(raw)
        if not low <= value <= high:   # also refuses nan
            raise ValueError(f"out of range: expected {low} <= value <= {high}")
        return value
    except ValueError as exc:
        raise InputError(f"environment variable {name}={raw!r}: {exc}") from None
