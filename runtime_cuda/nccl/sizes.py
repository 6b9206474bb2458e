"""Byte sizes as people write them (nccl-tests' -b 8 -e 128M, config files' "64KiB")."""
from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_size(value) -> int:
    """Bytes from an int or a string like '8', '128M', '64KiB' (units are binary, as in nccl-tests)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"byte size must be >= 0, got {value}")
        return value
    m = _SIZE.match(str(value))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"expected a byte size like 8, 64K, 128MiB, 1G; got {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def size_bucket(nbytes: int) -> int:
    """Power-of-two bucket: bucket k holds sizes in [2**(k-1), 2**k); bucket 0 is 0 bytes."""
    return int(nbytes).bit_length()


def bucket_label(bucket: int) -> str:
    if bucket == 0:
        return "0 B"
    return f"[{format_size(1 << (bucket - 1))}, {format_size(1 << bucket)})"
