"""Numbers users write, read once with one meaning everywhere (CLI, simulator,
bench, catalog): byte sizes with units, ints checked once, environment numbers;
the user's file:line of a DSL call; and nccl-tests' bus-bandwidth factor.

Sizes: K, M, G, T (and KiB, MiB, GiB, TiB) are binary, as nccl-tests reads `-b 8 -e 128M`;
KB, MB, GB, TB are decimal (1 MB = 10**6 bytes).  Case does not matter; a fraction
is fine when the bytes come out whole ("1.5M")."""
from __future__ import annotations

import operator
import os
import re
import sys
from functools import lru_cache
from typing import Optional, Type

from .errors import SizeError, TraceError
from .limits import MAX_BYTES

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The algorithm library is DSL programs like a user's: an error in one names its own line.
_LIBRARY_DIR = os.path.join(_PACKAGE_DIR, "algorithms") + os.sep


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
    path = os.path.abspath(filename)
    return filename.startswith("<frozen") or (path.startswith(_PACKAGE_DIR) and not path.startswith(_LIBRARY_DIR))


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


SIZE_UNITS = {"": 1, "b": 1,
              "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
              "t": 1 << 40, "tib": 1 << 40,
              "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}


def parse_size(value) -> int:
    """Bytes from an int or a string like 4096, "64K", "1MiB", "1.5MB" (units:
    see the module's docstring), at most gc3.limits.MAX_BYTES; SizeError (a
    ValueError too) saying what was wrong otherwise."""
    if isinstance(value, bool):
        raise SizeError(f"cannot read size {value!r}; expected a byte count")
    try:
        number = operator.index(value)      # ints, numpy ints
    except TypeError:
        number = None
    if number is not None:
        if number < 0:
            raise SizeError(f"size {number} is negative")
        value = str(number)
    # [0-9], not \d: \d takes any script's digits, which no one means in a size.
    m = re.fullmatch(r"\s*([0-9]{0,15}\.?[0-9]{1,15})\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in SIZE_UNITS:
        raise SizeError(f"cannot read size {value!r}; use e.g. 4096, 64K, 1MiB, 1.5MB or 1TiB")
    nbytes = float(m.group(1)) * SIZE_UNITS[m.group(2).lower()]
    if nbytes > MAX_BYTES:
        raise SizeError(f"size {value!r} is more than gc3.limits.MAX_BYTES={MAX_BYTES} bytes")
    if nbytes != int(nbytes):
        raise SizeError(f"size {value!r} is not a whole number of bytes")
    return int(nbytes)


def bus_factor(coll: str, nranks: int) -> float:
    """busbw = algbw * factor (nccl-tests' definition): how much data each rank
    must move relative to the buffer size for an optimal algorithm."""
    n = nranks
    if coll == "allreduce":
        return 2 * (n - 1) / n
    if coll in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0
