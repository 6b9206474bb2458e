"""Sizes and bandwidth as nccl-tests reports them, so numbers compare."""
from __future__ import annotations

import re

from gc3 import limits
from gc3.errors import GC3Error
from gc3.ir.layout import blocks_of

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    # [0-9], not \d: \d takes any script's digits, which no one means in a size.
    m = re.fullmatch(r"\s*([0-9]{1,15}(?:\.[0-9]{1,15})?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise GC3Error(f"cannot read size {text!r}; write e.g. 4096, 256KiB, 64MiB, 1GiB")
    nbytes = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if nbytes > limits.MAX_BYTES:
        raise GC3Error(f"size {text!r} is more than gc3.limits.MAX_BYTES={limits.MAX_BYTES} bytes")
    return nbytes


def in_elems_for(prog, nbytes: int, itemsize: int) -> int:
    """Input elements of a call whose larger buffer is about `nbytes` (nccl-tests' size)."""
    g = prog.gpus[0]
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    unit = max(1, nbytes // itemsize // max(bi, bo))
    return unit * bi


def bus_factor(coll: str, n: int) -> float:
    """busbw = algbw * factor (nccl-tests' definition)."""
    if coll == "allreduce":
        return 2 * (n - 1) / n
    if coll in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def nbytes_of(prog, in_elems: int, itemsize: int) -> int:
    g = prog.gpus[0]
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    return in_elems // bi * max(bi, bo) * itemsize
