"""`simulate()`: load a program, run it on numpy buffers, check and time it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Union

import numpy as np

from .. import limits
from ..dtypes import dtype_info, mismatches, reduce_op
from ..errors import LayoutError, SimulationError, SizeError
from ..ir import Program
from ..ir.layout import Layout, layout_for
from .reference import COLLECTIVES, from_postcondition, make_inputs
from .reference import reference as builtin_reference
from ..ir.xml_io import from_xml, read_xml
from ..units import parse_size
from .cost_config import DEFAULT as DEFAULT_COST, CostConfig, preset
from .cost_model import Schedule, Timing, format_time, predict
from .executor import Executed, Simulator, hasdep_warnings, static_errors
from .memory import RankMemory
from .races import Race
from .footprint import CHECK_SLICE, ENV as MAX_BYTES_ENV, estimate, format_bytes, max_bytes

DEFAULT_SIZE = 1 << 20


class _Quiet:
    """What `simulate` reports progress to when nobody listens."""

    def phase(self, name: str, total: Optional[int] = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass
class Mismatch:
    rank: int
    index: int
    expected: object
    got: object


@dataclass
class Result:
    outputs: List[np.ndarray]
    ok: bool
    errors: List[str]
    predicted_time: Optional[float]
    # Everything below is detail for reports and tests.
    program: Optional[Program] = None
    inputs: List[np.ndarray] = field(default_factory=list)
    expected: Optional[List[Optional[np.ndarray]]] = None
    wrong: int = 0
    first_wrong: Optional[Mismatch] = None
    races: List[Race] = field(default_factory=list)
    races_more: int = 0              # races found beyond those listed in `races`
    deadlock: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    layout: Optional[Layout] = None
    timing: Optional[Timing] = None
    records: List[Executed] = field(default_factory=list)
    dtype: str = "float32"
    op: str = "sum"
    slots: int = 0
    aliased: bool = False
    seed: int = 0
    unproven: bool = False           # run with unproven=True and nothing to check the outputs against

    def summary(self) -> str:
        return format_summary(self)

    def draw_timeline(self, path) -> Path:
        from .timeline import draw
        if self.timing is None:
            raise SimulationError("no timeline: the run did not complete (deadlock or error)")
        return draw(self.records, self.timing, path, title=f"{self.program.name}: predicted timeline")


def program_root(obj) -> int:
    """The root a traced GC3Program's collective declares; 0 for anything else."""
    root = getattr(getattr(obj, "collective", None), "root", None)
    return 0 if root is None else int(root)


def load_program(obj) -> Program:
    """An ir.Program, an XML path, XML text, or a traced GC3Program or ChunkDAG (lowered here)."""
    if isinstance(obj, Program):
        return obj
    if isinstance(obj, (bytes, bytearray)):
        return from_xml(bytes(obj))
    if isinstance(obj, Path):
        return read_xml(obj)
    if isinstance(obj, str):
        return from_xml(obj) if obj.lstrip().startswith("<") else read_xml(obj)
    if hasattr(obj, "ops") and hasattr(obj, "collective"):
        from ..toolchain import lower  # the compiler is only needed for DSL programs
        return lower(obj)
    raise SimulationError(f"cannot simulate a {type(obj).__name__}: pass an ir.Program, an XML path or text, "
                          "or a GC3Program or ChunkDAG")


def _element_count(size, count, itemsize: int) -> int:
    if count is not None:
        if int(count) < 0:
            raise LayoutError(f"count={count} is negative")
        if int(count) * itemsize > limits.MAX_BYTES:
            raise LayoutError(f"count={count} elements of {itemsize} bytes is more than gc3.limits.MAX_BYTES="
                              f"{limits.MAX_BYTES} bytes")
        return int(count)
    nbytes = DEFAULT_SIZE if size is None else parse_size(size)
    if nbytes % itemsize:
        raise LayoutError(f"size {nbytes} bytes is not a whole number of {itemsize}-byte elements")
    return nbytes // itemsize


def simulate(program_or_xml, size=None, dtype: Optional[str] = None, op: str = "sum", seed: int = 0,
             slots: Optional[int] = None, inplace: Optional[bool] = None,
             reference: Union[None, Callable, Sequence] = None, *, count: Optional[int] = None,
             root: Optional[int] = None, inputs: Optional[Sequence[np.ndarray]] = None,
             interleave_seed: Optional[int] = None, detect_races: bool = True,
             cost: Union[str, CostConfig] = DEFAULT_COST, unproven: bool = False, progress=None) -> Result:
    """Execute `program_or_xml` on every rank's numpy buffers and check it.

    size: bytes of each rank's input buffer (int or "1MiB"); or `count`
    elements.  inplace: None runs as the program declares; an in-place
    program is always run on aliased buffers (called out of place, the input
    is first copied into the output, as MSCCL does).  reference: for custom
    collectives, a callable `(inputs, op, nranks) -> outputs` or the expected
    outputs themselves (None entries are not checked).  root: of broadcast/
    reduce; None takes a traced GC3Program's own root (XML records none: 0).
    dtype: None is float32, or a fused program's own (whose operator also
    fixes the size: its output's elements; its inputs are made from `seed`).
    unproven: a custom collective with no postcondition and no `reference` runs
    (every check but the outputs': structure, deadlock, races) instead of failing;
    `Result.unproven` then says its outputs were not checked.
    progress: an object with phase(name, total) and advance(n) (gc3.cli's Progress).
    Refuses (SizeError) a run whose estimated memory (`footprint.estimate`) is
    over GC3_SIM_MAX_BYTES before allocating anything.
    """
    progress = progress or _Quiet()
    if root is None:
        root = program_root(program_or_xml)
    prog = load_program(program_or_xml)
    spec = prog.compute
    if spec is not None:
        # The operator's shapes and dtype are in the IR: the call is the one it describes.
        if dtype is not None and dtype_info(dtype).name != spec.dtype:
            raise SimulationError(f"{prog.name} is a fused {spec.op} in {spec.dtype}; it cannot run as {dtype}")
        if op != "sum" or inputs is not None or reference is not None:
            raise SimulationError(f"{prog.name} is a fused {spec.op}: it sums, and makes its own inputs and "
                                  f"reference (op, inputs and reference cannot be given)")
        want = spec.call_elems(prog.ngpus)
        asked = None if size is None and count is None else \
            _element_count(size, count, dtype_info(spec.dtype).np.itemsize)
        if asked is not None and asked != want:
            raise SizeError(f"{prog.name} is a fused {spec.op} whose output holds {want} elements; "
                            f"a size of {asked} elements was asked for")
        size, count, dtype = None, want, spec.buffer_dtype
    epi = prog.epilogue
    if epi is not None and (spec is not None or op != "sum"):
        raise SimulationError(f"{prog.name} carries the epilogue {epi}: it runs as a sum (its epilogue says the rest, "
                              f"avg included) and not with a compute operator" if spec is None else
                              f"{prog.name}: an epilogue on a compute-fused program is not simulated yet")
    info = dtype_info("float32" if dtype is None else dtype)
    ufunc = reduce_op(op)
    nranks = prog.ngpus
    in_elems = _element_count(size, count, info.np.itemsize)
    slots = limits.FIFO_SLOTS[prog.proto] if slots is None else int(slots)
    if slots < 1:
        raise SimulationError(f"slots={slots}: a FIFO needs at least one slot")
    aliased = bool(prog.inplace or inplace)
    result = Result(outputs=[], ok=False, errors=[], predicted_time=None, program=prog, dtype=info.name, op=op,
                    slots=slots, aliased=aliased, seed=seed)

    ids = sorted(g.id for g in prog.gpus)
    if not prog.ranks_complete():
        result.errors.append(f"program declares ngpus={nranks} but has <gpu> ids {ids}")
        return result
    layouts = {r: layout_for(prog, in_elems, r) for r in range(nranks)}
    result.layout = layouts[0]
    need = estimate(prog, [layouts[r] for r in range(nranks)], info.np.itemsize, aliased=aliased, slots=slots,
                    detect_races=detect_races, op=op)
    limit = max_bytes()
    if need.total > limit:
        raise SizeError(f"simulating {nranks} ranks at {format_bytes(in_elems * info.np.itemsize)} per rank needs "
                        f"about {format_bytes(need.total)} of memory ({need.describe()}), more than "
                        f"{MAX_BYTES_ENV}={format_bytes(limit)} (default gc3.limits.MAX_SIMULATED_BYTES); "
                        f"use a smaller --size or --count, or raise {MAX_BYTES_ENV}")
    progress.phase("drawing inputs")
    compute_inputs = None
    if spec is not None:
        from .compute import make_compute_inputs
        from .compute import initial_buffer
        compute_inputs = make_compute_inputs(spec, nranks, seed)
        # The caller gives no chunk data (the buffer starts as poison, so a read before a compute step
        # shows), except to an operator that reads chunks (agemm: the rank's A rows).
        inputs = [initial_buffer(spec, compute_inputs[r], r, nranks, in_elems, layouts[r].cs, info.np)
                  for r in range(nranks)]
    elif inputs is None:
        inputs = make_inputs(prog.coll, nranks, in_elems, info.name, seed, op=op)
    else:
        inputs = [np.asarray(x, dtype=info.np) for x in inputs]
        bad = [r for r, x in enumerate(inputs) if x.shape != (in_elems,)]
        if len(inputs) != nranks or bad:
            raise SimulationError(f"inputs must be {nranks} arrays of {in_elems} elements")
    result.inputs = list(inputs)
    memories = {r: RankMemory(layouts[r], r, info.np, inputs[r], aliased) for r in range(nranks)}
    if compute_inputs is not None:
        for r in range(nranks):
            memories[r].compute_inputs = compute_inputs[r]
    epilogue_inputs = None
    if epi is not None:
        from ..ir.epilogue import make_inputs as make_epilogue_inputs
        epilogue_inputs = make_epilogue_inputs(epi, layouts[0].out_elems, info.name, nranks, seed)
        for r in range(nranks):
            memories[r].epilogue_inputs = epilogue_inputs[r]

    errs = static_errors(prog, memories)
    if errs:
        result.errors.extend(errs)
        return result
    result.warnings.extend(hasdep_warnings(prog))

    progress.phase("executing", total=sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks))
    run = Simulator(prog, memories, ufunc, slots, interleave_seed=interleave_seed, detect_races=detect_races,
                    on_step=progress.advance).run()
    progress.phase("checking against numpy")
    result.records = run.records
    result.races = run.races
    result.races_more = run.races_truncated
    result.deadlock = run.deadlock
    result.outputs = [memories[r].output() for r in range(nranks)]
    if op == "avg" and prog.coll in ("allreduce", "reducescatter", "reduce"):
        # A plain program run with avg sums; the division is a second pass over the output,
        # as the NCCL drop-in does it (a program that fuses it carries the avg epilogue).
        from ..ir.epilogue import avg_divide
        result.outputs = [avg_divide(o, nranks) for o in result.outputs]
    if epi is not None:
        from ..ir.epilogue import out_dtype
        result.outputs = [o.astype(out_dtype(epi, info.name)) for o in result.outputs]
    result.errors.extend(run.errors)
    if run.deadlock:
        result.errors.append(f"deadlock: no threadblock can progress; {len(run.deadlock)} blocked:\n  "
                             + "\n  ".join(run.deadlock))
    result.errors.extend(str(r) for r in run.races)
    if run.races_truncated:
        result.errors.append(f"... and {run.races_truncated} more race(s)")

    if not aliased:
        for r in range(nranks):
            changed = _changed(memories[r].arrays["i"], inputs[r])
            if changed.size:
                result.warnings.append(f"rank {r}: the out-of-place call modified its input buffer "
                                       f"({changed.size} element(s), first at index {changed[0]})")

    if compute_inputs is not None:
        _check_fused(result, prog, compute_inputs, layouts[0].chunks_per_block)
    else:
        _check(result, prog, inputs, op, root, reference, epilogue_inputs, unproven)

    if run.completed:
        progress.phase("predicting time")
        cfg = preset(cost) if isinstance(cost, str) else cost
        L = layouts[0]
        result.timing = predict(run.records, proto=prog.proto, coll=prog.coll, nranks=nranks,
                                chunk_bytes=L.cs * info.np.itemsize,
                                size_bytes=max(L.in_elems, L.out_elems) * info.np.itemsize, config=cfg,
                                itemsize=info.np.itemsize, slots=slots, spans=True, compute=prog.compute)
        result.predicted_time = result.timing.total_s
    result.ok = not result.errors
    return result


class TimedProgram:
    """Predicts a program's run time at any call size without executing it at
    that size: it runs once on the smallest buffers (one element per chunk)
    and the cost model re-times that trace, whose ordering edges do not depend
    on the size, for each size asked (the calibration times programs up to
    1 GiB this way)."""

    def __init__(self, program_or_xml, dtype: str = "float32", slots: Optional[int] = None):
        self.program = load_program(program_or_xml)
        self.itemsize = dtype_info(dtype).np.itemsize
        prog = self.program
        L = layout_for(prog, 0)
        res = simulate(prog, count=L.blocks_in * L.chunks_per_block, dtype=dtype, slots=slots, detect_races=False)
        if res.timing is None or not res.ok:
            raise SimulationError(f"{prog.name}: cannot time a program that does not run correctly: "
                                  + "; ".join(res.errors[:3]))
        self.records, self.slots = res.records, res.slots
        self._schedules: dict = {}

    def timing(self, size=None, *, count: Optional[int] = None, cost: Union[str, CostConfig] = DEFAULT_COST) -> Timing:
        """`size`: bytes of each rank's input buffer (as `simulate`), or `count` elements."""
        cfg = preset(cost) if isinstance(cost, str) else cost
        prog = self.program
        L = layout_for(prog, _element_count(size, count, self.itemsize))
        key = (cfg.gpus_per_node, cfg.intra_node, cfg.inter_node)
        if key not in self._schedules:
            self._schedules[key] = Schedule.of(self.records, cfg)
        return predict(self.records, proto=prog.proto, coll=prog.coll, nranks=prog.ngpus,
                       chunk_bytes=L.cs * self.itemsize, size_bytes=max(L.in_elems, L.out_elems) * self.itemsize,
                       config=cfg, itemsize=self.itemsize, slots=self.slots, schedule=self._schedules[key],
                       compute=prog.compute)


def _changed(now: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Indices of elements whose bits differ, compared a slice at a time (bounded temporaries)."""
    bits = np.dtype(f"u{now.itemsize}") if now.itemsize in (1, 2, 4, 8) else None
    found = []
    for lo in range(0, now.size, CHECK_SLICE):
        a, b = now[lo:lo + CHECK_SLICE], before[lo:lo + CHECK_SLICE]
        if bits is not None:
            diff = a.view(bits) != b.view(bits)
        else:
            diff = (a.view(np.uint8).reshape(a.size, a.itemsize) != b.view(np.uint8).reshape(b.size, b.itemsize)).any(1)
        found.append(np.flatnonzero(diff) + lo)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _mismatches(got: np.ndarray, exp: np.ndarray, dtype) -> np.ndarray:
    """`mismatches` a slice at a time, so that its float64 copies stay small."""
    if got.shape != exp.shape or got.size <= CHECK_SLICE:
        return mismatches(got, exp, dtype)
    return np.concatenate([mismatches(got[lo:lo + CHECK_SLICE], exp[lo:lo + CHECK_SLICE], dtype) + lo
                           for lo in range(0, got.size, CHECK_SLICE)])


UNPROVEN = ("nothing was proven: a custom collective without <postcondition> says nothing about what it must "
            "compute, so its outputs were not checked (structure, deadlock and races were)")


def _check(result: Result, prog: Program, inputs, op: str, root: int, reference, epilogue_inputs=None,
           unproven: bool = False) -> None:
    nranks = prog.ngpus
    if reference is None:
        if prog.coll in COLLECTIVES:
            expected = builtin_reference(prog.coll, inputs, op, nranks, root=root)
        elif prog.postcondition is not None:     # a custom collective's IR says what it computes
            expected = from_postcondition(prog, inputs, op, result.outputs)
        elif unproven:
            result.unproven = True
            return
        else:
            result.errors.append(f"cannot check outputs: no built-in reference for collective {prog.coll!r} and "
                                 "no <postcondition> in the IR; pass reference= (or --unproven to run it "
                                 "without checking its outputs)")
            return
    elif callable(reference):
        expected = reference(list(inputs), op, nranks)
    else:
        expected = list(reference)
    if len(expected) != nranks:
        result.errors.append(f"reference gave {len(expected)} outputs for {nranks} ranks")
        return
    what = f"the {prog.coll} reference"
    if prog.epilogue is not None:
        # The unfused operator: the collective's reference, then the epilogue as a separate pass.
        from ..ir.epilogue import reference as epilogue_reference
        expected = [None if e is None else epilogue_reference(prog.epilogue, np.asarray(e), nranks,
                                                              epilogue_inputs[r])
                    for r, e in enumerate(expected)]
        what = f"the unfused reference ({prog.coll}, then {prog.epilogue})"
    result.expected = expected
    rows = []
    for r, (got, exp) in enumerate(zip(result.outputs, expected)):
        if exp is None:
            continue
        exp = np.asarray(exp, dtype=got.dtype)
        if exp.shape != got.shape:
            result.errors.append(f"rank {r}: output has {got.size} elements, reference {exp.size}")
            continue
        rows.append((r, _mismatches(got, exp, got.dtype), exp, got))
    _tally(result, rows, what)


def _tally(result: Result, rows, what: str) -> None:
    """Record (rank, indices that differ, expected, got) rows: the count, the first, one error line."""
    total = 0
    for r, bad, exp, got in rows:
        if bad.size and result.first_wrong is None:
            i = int(bad[0])
            result.first_wrong = Mismatch(r, i, exp[i].item(), got[i].item())
        total += bad.size
    result.wrong = total
    if total:
        fw = result.first_wrong
        result.errors.insert(0, f"{total} output element(s) differ from {what}; first at rank {fw.rank} index "
                                f"{fw.index}: expected {fw.expected}, got {fw.got}")


def _check_fused(result: Result, prog: Program, compute_inputs, chunks: int) -> None:
    """Every rank's output against the unfused operator (compute, then its collective), within
    the rounding bound of `gc3/simulator/compute.py`."""
    from .compute import OPERATORS, fused_reference

    if prog.coll not in OPERATORS[prog.compute.op].colls:
        result.errors.append(f"cannot check outputs: no fused reference for {prog.compute.op}+{prog.coll}")
        return
    pairs = fused_reference(prog.compute, compute_inputs, chunks, prog.coll)
    result.expected = [expected for expected, _ in pairs]
    # NaN (never written) fails `diff <= tol`, so it counts as wrong.
    # An infinite tolerance marks padding the operator leaves unspecified (never written: NaN).
    rows = [(r, np.flatnonzero(~((np.abs(got.astype(np.float64) - expected) <= tol) | np.isinf(tol))), expected,
             got)
            for r, (got, (expected, tol)) in enumerate(zip(result.outputs, pairs))]
    _tally(result, rows, f"the unfused reference ({prog.compute.op} on every rank, then {prog.coll})")


def format_summary(res: Result) -> str:
    prog = res.program
    lines = []
    if prog is None:
        return "\n".join(res.errors)
    ntb = max((len(g.threadblocks) for g in prog.gpus), default=0)
    nsteps = sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks)
    lines.append(f"algorithm  {prog.name}: {prog.coll}, {prog.ngpus} ranks, proto {prog.proto}, "
                 f"{prog.nchannels} channel(s), up to {ntb} TBs/rank, {nsteps} steps ({prog.convention} XML), "
                 f"{'in-place' if res.aliased else 'out-of-place'}")
    L = res.layout
    if L is not None:
        item = dtype_info(res.dtype).np.itemsize
        lines.append(f"size       {format_bytes(L.in_elems * item)} per rank input ({L.in_elems} x {res.dtype}), "
                     f"op {res.op}, seed {res.seed}, FIFO slots {res.slots}")
        short = "" if L.unit == L.chunks_per_block * L.cs else "; uneven: " + _uneven(L)
        lines.append(f"layout     {L.blocks_in} in / {L.blocks_out} out block(s) x {L.chunks_per_block} chunk(s), "
                     f"cs = {L.cs} elements ({format_bytes(L.cs * item)}), scratch {L.s_chunks} chunk(s){short}")
    if res.expected is not None:
        checked = sum(e.size for e in res.expected if e is not None)
        if res.wrong:
            fw = res.first_wrong
            lines.append(f"result     WRONG: {res.wrong} of {checked} element(s) differ; first at rank {fw.rank} "
                         f"index {fw.index}: expected {fw.expected}, got {fw.got}")
        elif not res.deadlock:
            lines.append(f"result     OK: all {checked} checked element(s) match the numpy reference")
    if res.unproven:
        lines.append(f"result     NOT PROVEN: {UNPROVEN}")
    nraces = len(res.races) + res.races_more
    lines.append(f"races      {nraces}" + ("" if not res.races else ":"))
    lines += [f"  {r}" for r in res.races[:8]]
    if nraces > 8:
        lines.append(f"  ... {nraces - 8} more")
    if res.deadlock:
        lines.append(f"deadlock   no threadblock can progress; {len(res.deadlock)} blocked:")
        lines += [f"  {d}" for d in res.deadlock[:24]]
        if len(res.deadlock) > 24:
            lines.append(f"  ... {len(res.deadlock) - 24} more")
    shown = {f"... and {res.races_more} more race(s)"} | {str(r) for r in res.races}
    other = [e for e in res.errors if not e.startswith("deadlock:") and e not in shown
             and not (res.wrong and e.startswith(f"{res.wrong} output"))]
    lines += [f"error      {e}" for e in other]
    lines += [f"warning    {w}" for w in res.warnings[:8]]
    if res.timing is not None:
        t = res.timing
        lines.append(f"predicted  {format_time(t.total_s)}, algbw {t.algbw_GBps:.1f} GB/s, busbw {t.busbw_GBps:.1f} GB/s "
                     f"(cost model: {t.provenance})")
    lines.append("OK" if res.ok else "FAILED")
    return "\n".join(lines)


def _uneven(L) -> str:
    """Describe the short and empty chunks of a block (layout.py's rule)."""
    full, rest = divmod(L.unit, L.cs) if L.cs else (0, 0)
    empty = L.chunks_per_block - full - (1 if rest else 0)
    parts = [f"{full} full chunk(s)"] + ([f"one of {rest} element(s)"] if rest else []) + \
        ([f"{empty} empty"] if empty else [])
    return ", ".join(parts) + " per block; padding lanes read as zero"
