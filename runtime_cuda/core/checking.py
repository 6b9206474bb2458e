"""Runs a collective on the GPU with reference data and counts wrong elements
against gc3.simulator.reference (used by the tests and `gc3 run`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from gc3.dtypes import dtype_info, mismatches
from gc3.ir import Program
from gc3.ir.layout import Layout, layout_for
from gc3.simulator.reference import make_inputs, reference
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
    if _same_bits(got, expected):
        # make_inputs' data reduce exactly, so a correct result is bit-identical;
        # the tolerance test (float64 copies of both) runs only when it is not.
        return CheckResult(checked=got.size)
    bad = mismatches(got, expected, dtype)
    first = None
    if bad.size:
        i = int(bad[0])
        first = f"rank {rank} output[{i}] = {got[i]!r}, expected {expected[i]!r} ({bad.size} wrong on this rank)"
    return CheckResult(checked=got.size, wrong=int(bad.size), first=first)


def _same_bits(got: np.ndarray, expected: np.ndarray) -> bool:
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return False
    bits = np.dtype(f"u{got.dtype.itemsize}")
    return bool(np.array_equal(got.view(bits), expected.view(bits)))


def reference_case(prog: Program, in_elems: int, dtype: str, op: str, seed: int = 0):
    inputs = make_inputs(prog.coll, prog.ngpus, in_elems, dtype, seed=seed, op=op)
    return inputs, reference(prog.coll, inputs, op, prog.ngpus)


def device_buffers(group, inputs: Sequence[np.ndarray], in_elems: int, dtype: str, inplace: bool):
    """Per rank of the group: (input view, output view) of one device
    allocation laid out by `host_buffers`."""
    import cupy

    ins, outs = [], []
    for r in group.ranks:
        host, si, so = host_buffers(layout_for(group.prog, in_elems, r), r, inputs[r], inplace)
        with cupy.cuda.Device(group.rank_device(r)):
            dev = cupy.asarray(host.view(storage_dtype(dtype)))
        ins.append(dev[si])
        outs.append(dev[so])
    return ins, outs


def run_checked(group, in_elems: int, dtype: str, op: str, inplace: bool, seed: int = 0,
                repeat: int = 1, case=None) -> CheckResult:
    """Checked calls on a launch group (virtual ranks or this process's rank):
    `repeat` times, from fresh buffers each time (FIFO counters and progress
    flags carry over between calls).  Every process draws all ranks' inputs
    from the same seed and checks its own ranks.  `case`: (inputs, expected)
    to use instead of `reference_case`'s (an IR with no postcondition: the
    simulator's buffers)."""
    prog = group.prog
    inputs, expected = reference_case(prog, in_elems, dtype, op, seed) if case is None else case
    import cupy

    res = CheckResult()
    for _ in range(repeat):
        ins, outs = device_buffers(group, inputs, in_elems, dtype, inplace)
        group(ins, outs, op=op, dtype=dtype)
        group.check()
        res = CheckResult()
        for r, out in zip(group.ranks, outs):
            with cupy.cuda.Device(group.rank_device(r)):
                got = out.get()
            res.add(compare(r, got.view(dtype_info(dtype).np), expected[r], dtype))
    return res


def geometry(prog: Program) -> Tuple[int, int]:
    """(blocks in the input buffer, chunks per block): in_elems must be a
    multiple of the first; in_elems = blocks * chunks * k gives k lanes per chunk."""
    from gc3.ir.layout import blocks_of

    g = prog.gpus[0]
    bi, bo = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    c = g.i_chunks // bi if g.i_chunks else (g.o_chunks // bo if g.o_chunks else max(prog.nchunksperloop, 1))
    return bi, c


# The largest size the GPU suite checks, per rank (nccl-tests' size: the larger buffer).
LARGE_BYTES = 256 << 20


def recommended_max_bytes(path) -> Optional[int]:
    """The largest size the catalog beside `path` (ir_samples/index.json)
    recommends the program for, or None where it sets no bound."""
    import json
    from pathlib import Path

    index = Path(path).with_name("index.json")
    if not index.is_file():
        return None
    entries = json.loads(index.read_text()).get("algorithms", [])
    # An IR may be listed more than once (its in-place and out-of-place ranges): the widest bound.
    tops = [e.get("max_bytes") for e in entries if e.get("file") == Path(path).name]
    return None if not tops or None in tops else max(tops)


def large_cases(prog: Program, nbytes: int) -> List[Tuple[int, str, bool]]:
    """(in_elems, dtype, inplace) of the large-size checks: `nbytes` per rank
    in float32 as the program prefers to be called, and a count just below it
    that does not divide evenly (short last chunks, an odd lane count) in
    bfloat16 the other way round."""
    from .perf import in_elems_for

    bi, c = geometry(prog)
    k = max(in_elems_for(prog, nbytes, 4) // (bi * c), 1)
    even = bi * c * k
    m = max(in_elems_for(prog, nbytes, 2) // (bi * c) - 2, 1) | 1
    uneven = bi * (c * m + c - 1) if c > 1 else bi * m
    return [(even, "float32", prog.inplace), (uneven, "bfloat16", not prog.inplace)]


def fused_case(prog: Program, seed: int = 0):
    """A fused IR's seeded compute inputs (every rank's, values exact in the dtype, as the
    simulator makes them) and per rank (expected output, per-element tolerance): the unfused
    operator then its collective, gc3/simulator/compute.py's reference."""
    from gc3.simulator.compute import fused_reference, make_compute_inputs

    inputs = make_compute_inputs(prog.compute, prog.ngpus, seed)
    lay = layout_for(prog, prog.compute.out_elems, 0)
    return inputs, fused_reference(prog.compute, inputs, lay.chunks_per_block, prog.coll)


def fused_buffers(group, inputs):
    """Per rank of the group: its compute inputs on its device, in the operator's order, and a
    poisoned output buffer of the operator's size (NaN bits: never equal to any result)."""
    import cupy

    spec = group.prog.compute
    dt = storage_dtype(spec.dtype)
    ins, outs = [], []
    for r in group.ranks:
        with cupy.cuda.Device(group.rank_device(r)):
            ins.append([cupy.asarray(np.ascontiguousarray(inputs[r][name]).view(storage_dtype(spec.input_dtype(name))))
                        for name in spec.names])
            outs.append(cupy.full(spec.out_elems, np.array(np.nan, dtype_info(spec.dtype).np).view(dt).item(),
                                  dtype=dt))
    return ins, outs


def run_fused(group, ins, outs, stream=None) -> None:
    """One call of a fused program: the output buffers double as the (unused or in-place) inputs."""
    ptrs = [o.data.ptr for o in outs]
    group.run_ptrs(ptrs, ptrs, group.prog.compute.out_elems, group.prog.compute.dtype, "sum", stream,
                   compute=[[a.data.ptr for a in per_rank] for per_rank in ins])


def run_fused_checked(group, seed: int = 0, repeat: int = 1, stream=None) -> CheckResult:
    """Checked calls of a fused IR (virtual ranks or this process's rank): seeded compute
    inputs, poisoned outputs, each rank's result within the simulator's bound of the unfused
    reference (NaN -- an element never written -- counts as wrong)."""
    import cupy

    inputs, pairs = fused_case(group.prog, seed)
    dtype = group.prog.compute.dtype
    res = CheckResult()
    for _ in range(repeat):
        ins, outs = fused_buffers(group, inputs)
        run_fused(group, ins, outs, stream)
        group.check()
        res = CheckResult()
        for r, out in zip(group.ranks, outs):
            with cupy.cuda.Device(group.rank_device(r)):
                got = out.get().view(dtype_info(dtype).np).astype(np.float64)
            expected, tol = pairs[r]
            bad = np.flatnonzero(~(np.abs(got - expected) <= tol))
            first = None
            if bad.size:
                i = int(bad[0])
                first = f"rank {r} output[{i}] = {got[i]!r}, expected {expected[i]!r} ({bad.size} wrong on this rank)"
            res.add(CheckResult(checked=got.size, wrong=int(bad.size), first=first))
    return res
