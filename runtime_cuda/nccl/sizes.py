"""Byte sizes as the drop-in's log shows them, and the size buckets of selection
(sizes are read by gc3.units.parse_size)."""
from __future__ import annotations


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
