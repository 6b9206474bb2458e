"""Runs a collective on the GPU with reference data and counts wrong elements
against gc3.reference (used by the tests and `gc3 run`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from gc3.dtypes import dtype_info, mismatches
from gc3.ir import Program
from gc3.layout import Layout, layout_for
from gc3.reference import make_inputs, reference
from gc3.simulator.memory import poison_value


@dataclass
class CheckResult:
    checked: int = 0            # elements compared
    wrong: int = 0
    first: Optional[str] = None  # where the first wrong element is

    def add(self, other: "CheckResult") -> None:
        self.checked += other.checked
        self.wrong += other.wrong
        self.first = self.first or other.first


def storage_dtype(dtype: str) -> np.dtype:
    """What a device array of `dtype` is made of (CuPy has no bfloat16)."""
    info = dtype_info(dtype)
    return np.dtype(np.uint16) if info.name == "bfloat16" else info.np


def host_buffers(L: Layout, rank: int, data: np.ndarray, inplace: bool) -> Tuple[np.ndarray, slice, slice]:
    """(allocation, input slice, output slice) for one rank, the output
    poisoned so that any element the schedule misses is visible."""
    poison = np.array(poison_value(data.dtype)).astype(data.dtype)
    if not inplace:
        buf = np.concatenate([data, np.full(L.out_elems, poison, dtype=data.dtype)])
        return buf, slice(0, L.in_elems), slice(L.in_elems, L.in_elems + L.out_elems)
    base, off = L.inplace_offset(rank)
    if base == "i":
        return data.copy(), slice(0, L.in_elems), slice(off, off + L.out_elems)
    buf = np.full(L.out_elems, poison, dtype=data.dtype)
    buf[off:off + L.in_elems] = data
    return buf, slice(off, off + L.in_elems), slice(0, L.out_elems)


def compare(rank: int, got: np.ndarray, expected: Optional[np.ndarray], dtype: str) -> CheckResult:
    if expected is None:
        return CheckResult()
    bad = mismatches(got, expected, dtype)
    first = None
    if bad.size:
        i = int(bad[0])
        first = f"rank {rank} output[{i}] = {got[i]!r}, expected {expected[i]!r} ({bad.size} wrong on this rank)"
    return CheckResult(checked=got.size, wrong=int(bad.size), first=first)


def reference_case(prog: Program, in_elems: int, dtype: str, op: str, seed: int = 0):
    inputs = make_inputs(prog.coll, prog.ngpus, in_elems, dtype, seed=seed, op=op)
    return inputs, reference(prog.coll, inputs, op, prog.ngpus)


def device_buffers(group, inputs: Sequence[np.ndarray], in_elems: int, dtype: str, inplace: bool):
    """Per rank of the group: (input view, output view) of one device
    allocation laid out by `host_buffers`."""
    import cupy

    ins, outs = [], []
    for r in group.tables.ranks:
        host, si, so = host_buffers(layout_for(group.prog, in_elems, r), r, inputs[r], inplace)
        dev = cupy.asarray(host.view(storage_dtype(dtype)))
        ins.append(dev[si])
        outs.append(dev[so])
    return ins, outs


def run_checked(group, in_elems: int, dtype: str, op: str, inplace: bool, seed: int = 0,
                repeat: int = 1) -> CheckResult:
    """Checked calls on a launch group (virtual ranks or this process's rank):
    `repeat` times, from fresh buffers each time (FIFO counters and progress
    flags carry over between calls).  Every process draws all ranks' inputs
    from the same seed and checks its own ranks."""
    prog = group.prog
    inputs, expected = reference_case(prog, in_elems, dtype, op, seed)
    res = CheckResult()
    for _ in range(repeat):
        ins, outs = device_buffers(group, inputs, in_elems, dtype, inplace)
        group(ins, outs, op=op, dtype=dtype)
        group.check()
        res = CheckResult()
        for r, out in zip(group.tables.ranks, outs):
            res.add(compare(r, out.get().view(dtype_info(dtype).np), expected[r], dtype))
    return res


def geometry(prog: Program) -> Tuple[int, int]:
    """(blocks in the input buffer, chunks per block): in_elems must be a
    multiple of the first; in_elems = blocks * chunks * k gives k lanes per chunk."""
    from gc3.layout import blocks_of

    g = prog.gpus[0]
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    c = g.i_chunks // bi if g.i_chunks else (g.o_chunks // bo if g.o_chunks else max(prog.nchunksperloop, 1))
    return bi, c
