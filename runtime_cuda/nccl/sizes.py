"""Byte sizes as people write them (nccl-tests' -b 8 -e 128M, config files' "64KiB")."""
from __future__ import annotations

from gc3.errors import GC3Error


def parse_size(value) -> int:
    """Bytes from an int or a string like '8', '128M', '64KiB' (binary units, as in
    nccl-tests; runtime_cuda.perf's reader).  ValueError names what was wrong."""
    from runtime_cuda.perf import parse_size as read_size
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"byte size must be >= 0, got {value}")
        return value
    try:
        return read_size(str(value))
    except GC3Error as exc:
        raise ValueError(str(exc)) from None


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
