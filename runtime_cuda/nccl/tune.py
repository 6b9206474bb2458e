"""The half of `gc3 tune` that needs no GPU: candidates, sizes, choice, catalog.

    candidates(coll, ranks, nodes, grid)  the algorithm library (`library`) crossed
                                          with instances, protocols and chunk counts
    tune(..., timer)                      for every size, the fastest candidate as
                                          `timer` says; NCCL where the timer says it
                                          is faster still
    write_catalog(...)                    the catalog the drop-in loads (schema:
                                          runtime_cuda/nccl/catalog.py), its IRs
                                          beside it, and a "provenance" object
    merge_catalogs(paths, out)            one catalog from several tunes of the same
                                          GPUs, each of other collectives

How times are obtained is the `Timer`'s business alone: `ModelTimer` asks the
simulator's cost model (no GPU; `gc3 tune --model-only`), and a timer that
measures on GPUs through the drop-in (`tune_gpu`) plugs in unchanged.

Sizes are nccl-tests' "size" (the larger user buffer), as the catalog's
min_bytes/max_bytes are.  Each grid size is served by its fastest candidate;
neighbouring sizes with the same winner form one range, and a range ends
halfway (geometrically) to the next grid size with another winner.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from gc3 import limits
from gc3.errors import GC3Error, InputError, TooManyThreadblocks
from gc3.ir import PROTOCOLS, Program

from . import library
from .call import COLLECTIVES, ROOTED, Call
from .constants import DTYPE_CODES, ITEMSIZE
from .perf import element_count, nccl_count
from .sizes import format_size

DTYPE = "float32"   # the dtype candidates are timed with by default (--dtype); entries serve every dtype
COST = "h200"       # the cost-model preset a tune prices with, or rules candidates out by, unless told
ROOT = 0            # broadcast/reduce IRs are built for this root (other roots go to NCCL)


@dataclass(frozen=True)
class Grid:
    """What is crossed with each algorithm of the library."""
    instances: Tuple[int, ...]
    protocols: Tuple[str, ...]
    pipeline_chunks: Tuple[int, ...]    # chunk counts of pipelined algorithms (the others use 1)
    # Instance counts at which Simple programs are also compiled without instruction fusion,
    # where fusion changes them: an rrcs puts a channel's sends and receives in one block, and
    # unfused they get one each.  2x H200: the 64-instance unfused 2-rank ring beats the fused
    # one from 256 MiB (1 GiB: 2979 against 3111 us) and loses to 64 MiB
    # (measured/ring_unfused_2xh200_2026-11-24.txt).  The cost model prices both
    # alike (the link bounds them), so only a measured tune tells them apart.
    unfused_instances: Tuple[int, ...] = ()


# 64 instances: on 2x H200 the 64-channel Simple programs beat NCCL from 1-2 MiB up (1.1-1.7x,
# measured/sweep_2xh200_2026-11-22_rows.txt), and a grid without them cannot find that.
# 16: the LL programs that beat NCCL at 64-256 KiB there have 16 (4 and 64 both lose).
FULL = Grid(instances=(1, 2, 4, 8, 16, 32, 64), protocols=PROTOCOLS, pipeline_chunks=(1, 4, 16),
            unfused_instances=(16, 32, 64))
QUICK = Grid(instances=(1, 4, 16, 64), protocols=("Simple", "LL"), pipeline_chunks=(4,), unfused_instances=(64,))
UNFUSED = "unfused"             # the label's suffix of a candidate compiled without instruction fusion
_FUSED_TYPES = frozenset({"rcs", "rrcs", "rrs"})
SIZE_RANGE = (1 << 10, 1 << 30)       # 1 KiB .. 1 GiB
SIZE_FACTOR, QUICK_SIZE_FACTOR = 4, 64
# Up to this size a measured tune ranks gc3's candidates by their time per call in a 100-call CUDA
# graph, among those whose eager time per call plus that beats NCCL's.  There, eager calls
# are bound by the host's time to issue them, which is nearly the same for every gc3 candidate and
# varies by several µs from one timing to the next: eager timing picked interpreter programs that
# took twice a kernel's time in a graph, and the sum of both still chose differently from one tune
# to the next (measured/tune_rank_2x4xH100_2026-11-27.txt); a graph's replay shows the GPU's time
# and repeats within a few percent.  Above it, calls are bound by the GPU and eager time says it.
GRAPH_MAX = limits.SMALL_ALLREDUCE_MAX_BYTES
# Timed rounds of eager calls behind a score, the median taken: one round above GRAPH_MAX, where
# the tune's budget goes to big calls; more below, where a round costs microseconds and one call
# the host delays by tens of them moves a round's mean more than kernels differ in a graph.
ROUNDS, GRAPH_ROUNDS = 1, 3


@dataclass(frozen=True)
class Variant:
    """One variant tune times (an algorithm compiled with given arguments, instances and
    protocol; not catalog.Candidate, which is an entry calls select from), or one of the dedicated
    small-message kernels (`kernel` for `kernel_collective`; `program` None): those serve in-place
    and out-of-place calls alike, up to gc3.limits.SMALL_ALLREDUCE_MAX_BYTES."""
    label: str                 # its name in the catalog and its file name (label.xml)
    algorithm: str
    argv: Tuple[int, ...]
    instances: int
    protocol: str
    program: Optional[Program]  # verified by the simulator's run in ModelTimer, proven before writing
    root: Optional[int]
    kernel: Optional[str] = None
    fusion: bool = True        # False: compiled without instruction fusion
    kernel_collective: str = "allreduce"

    @property
    def collective(self) -> str:
        return self.kernel_collective if self.kernel else self.program.coll

    @property
    def inplace(self) -> bool:
        return True if self.kernel else self.program.inplace

    def serves(self, inplace: bool) -> bool:
        """Whether it serves calls of this placement as it is (no copy of the input first)."""
        return bool(self.kernel) or self.inplace == inplace


def kernel_candidates(coll: str, ranks: int, nodes: int) -> List[Variant]:
    """The small-message kernels for `coll` (gc3.limits.SMALL_KERNELS), inside one
    node (they address every peer's memory directly)."""
    if nodes != 1:
        return []
    return [Variant(f"{k}_{coll}_{ranks}r", k, (), 1, limits.small_kernel_protocol(k), None, None, kernel=k,
                    kernel_collective=coll)
            for k in limits.SMALL_KERNELS.get(coll, ())]


def label(alg: library.Algorithm, values: Dict[str, int], instances: int, protocol: str, fusion: bool = True) -> str:
    """ir_samples' naming: allreduce_ring_4r_Simple_i2 (out of place), reducescatter_ring_4r_inplace_Simple, .._2x4_..;
    plus _c<C> for a pipelined algorithm's chunk count, _unfused without instruction fusion."""
    where = f"{values['nodes']}x{values['gpus']}" if alg.multinode else f"{values['ranks']}r"
    parts = [alg.name, where] + (["inplace"] if values.get("inplace") else []) + [protocol]
    if alg.pipelined:
        parts.append(f"c{values['chunks']}")
    if instances > 1:
        parts.append(f"i{instances}")
    if not fusion:
        parts.append(UNFUSED)
    return "_".join(parts)


Spec = Tuple[str, library.Algorithm, Dict[str, int], int, str, bool]


def specs(coll: str, ranks: int, nodes: int, grid: Grid) -> List[Spec]:
    """(label, algorithm, arguments by name, instances, protocol, fusion) of every candidate
    for `coll`; an unfused one right after its fused twin, so that a tie keeps the fused."""
    out = []
    for alg in library.ALGORITHMS.values():
        if alg.collective != coll or not alg.fits(ranks, nodes):
            continue
        fixed = {"ranks": ranks, "nodes": nodes, "gpus": ranks // nodes, "root": ROOT}
        choices: Dict[str, Sequence[int]] = {
            "chunks": grid.pipeline_chunks if alg.pipelined else (1,), "inplace": (0, 1)}
        # instances and channels stay at the file's defaults: lower(instances=) sets the former
        names = [p for p in alg.params if p not in ("instances", "channels")]
        combos: List[Dict[str, int]] = [{}]
        for p in names:
            combos = [dict(c, **{p: v}) for c in combos for v in (choices[p] if p in choices else (fixed[p],))]
        for values in combos:
            for proto in grid.protocols:
                for k in grid.instances:
                    out.append((label(alg, values, k, proto), alg, values, k, proto, True))
                    if proto == "Simple" and k in grid.unfused_instances:
                        out.append((label(alg, values, k, proto, False), alg, values, k, proto, False))
    return out


def candidates(coll: str, ranks: int, nodes: int, grid: Grid) -> Tuple[List[Variant], List[str]]:
    """The candidates that compile, and one line per one that does not (too many
    threadblocks for the runtime's limits at that instance count, ...).  An
    instance count with too many threadblocks is replaced by the largest power of
    two that fits, when the grid does not have that one already: the widest
    direct programs at 4+ ranks stop at 16, which a grid of 1, 4, 64 would miss."""
    good, skipped = [], []
    todo = specs(coll, ranks, nodes, grid)
    names = {s[0] for s in todo}
    fused_types: Dict[str, bool] = {}      # fused twin's label -> whether it has fused instructions
    while todo:
        name, alg, values, k, proto, fusion = todo.pop(0)
        argv = alg.argv(**values)
        twin = label(alg, values, k, proto)
        if not fusion and not fused_types.get(twin, False):
            continue       # fusion changed nothing (or the twin did not compile): the same program
        try:
            traced, prog = library.compile_program(alg.name, argv, k, proto, fusion=fusion)
        except TooManyThreadblocks as exc:
            skipped.append(f"{name}: {exc}")
            fit = 1 << ((exc.max_tbs // exc.per_instance).bit_length() - 1) if exc.max_tbs >= exc.per_instance else 0
            wider = label(alg, values, fit, proto, fusion)
            if fit and wider not in names:
                names.add(wider)
                todo.insert(0, (wider, alg, values, fit, proto, fusion))
            continue
        except GC3Error as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if fusion:
            fused_types[name] = any(st.type in _FUSED_TYPES for g in prog.gpus for tb in g.threadblocks
                                    for st in tb.steps)
        root = traced.collective.root
        good.append(Variant(name, alg.name, argv, k, proto, dataclasses.replace(prog, name=name), root,
                              fusion=fusion))
    return good, skipped


def call_elems(coll: str, nbytes: int, ranks: int, dtype: str = DTYPE) -> int:
    """Elements of each rank's input buffer for a call of nccl-tests size `nbytes`
    (the gc3 layout's in_elems) in `dtype`, by the drop-in's own rules."""
    code = DTYPE_CODES[dtype]
    count = nccl_count(coll, element_count(coll, nbytes, ITEMSIZE[code], ranks), ranks)
    return Call(coll, 0, 0, count, code, None, 0, ranks, 0).in_elems


# --- how long a candidate takes -------------------------------------------------------

class Timer(Protocol):
    """Where times come from.  Sizes are nccl-tests' size in bytes; times are seconds per call.
    A timer that measures small calls another way than large ones also has `measure(nbytes)`, a
    key of how that size is timed: `choose` bounds a size's times by a smaller size's only where
    the keys agree; `parts(label, coll, nbytes, inplace)`, the halves a time was summed from
    (label None: NCCL's), which the provenance shows; and `rank(cand, nbytes, inplace, t)`, the
    key gc3's candidates are ordered by where it is not their time `t` (which still decides
    against NCCL's)."""

    # True when `time` includes the runtime's copy of the input before an in-place IR serves an
    # out-of-place call; otherwise in-place IRs serve out-of-place calls only for collectives
    # that have no out-of-place algorithm (allreduce), where the copy is the same for all.
    prices_inplace_copy: bool

    def time(self, cand: Variant, nbytes: int, inplace: bool) -> Optional[float]:
        """The candidate's time for a call of `nbytes` (in place or not); None: it cannot serve it."""

    def baseline(self, coll: str, nbytes: int, inplace: bool) -> Optional[float]:
        """NCCL's time for the same call; None when not measured."""

    def provenance(self) -> Dict[str, object]:
        """What the catalog's "provenance" says about these times."""


class ModelTimer:
    """The simulator's cost model (`gc3 simulate --cost`): each candidate runs
    once on the CPU (data checked against numpy), then is re-timed per size."""

    prices_inplace_copy = True

    def __init__(self, cost: str, ranks: int, nodes: int = 1, dtype: str = DTYPE):
        from gc3.simulator.cost_config import preset
        # gpus_per_node decides which link each connection uses (NVLink inside a node)
        self.config = preset(cost, gpus_per_node=ranks // nodes)
        self.cost, self.ranks, self.dtype = cost, ranks, dtype
        self._timed: Dict[str, object] = {}
        self._times: Dict[Tuple[str, int], Optional[float]] = {}   # without the input copy: placement-free

    def _timed_program(self, cand: Variant):
        from gc3.simulator import TimedProgram
        if cand.label not in self._timed:
            self._timed[cand.label] = TimedProgram(cand.program, dtype=self.dtype)
        return self._timed[cand.label]

    def time(self, cand: Variant, nbytes: int, inplace: bool) -> Optional[float]:
        key = (cand.label, nbytes)
        if cand.kernel and key not in self._times:
            from gc3.simulator.small_allreduce import small_kernel_seconds
            self._times[key] = small_kernel_seconds(cand.collective, cand.kernel, nbytes, self.ranks, self.config)
        if key not in self._times:
            elems = call_elems(cand.collective, nbytes, self.ranks, self.dtype)
            try:
                t = self._timed_program(cand).timing(count=elems, cost=self.config).total_s if elems else None
            except GC3Error:       # this size does not split into the program's chunks
                t = None
            self._times[key] = t
        t = self._times[key]
        if t is not None and not inplace and not cand.serves(False):
            # The runtime copies the input into the output first (as MSCCL does), then runs it in place.
            from gc3.simulator.cost_model import input_copy_seconds
            elems = call_elems(cand.collective, nbytes, self.ranks, self.dtype)
            t += input_copy_seconds(elems * ITEMSIZE[DTYPE_CODES[self.dtype]], self.config)
        return t

    def baseline(self, coll: str, nbytes: int, inplace: bool) -> Optional[float]:
        return None

    def provenance(self) -> Dict[str, object]:
        cfg = self.config
        calibration = cfg.calibration if cfg.calibrated else f"UNCALIBRATED: {cfg.calibration}"
        if cfg.measured_ranks and cfg.measured_ranks != self.ranks:
            calibration += f"; {self.ranks} ranks extrapolated from {cfg.measured_ranks}"
        return {"timer": "cost model", "cost_model": {"preset": self.cost, "name": cfg.name,
                                                      "calibration": calibration},
                "measured": False, "nccl": "not measured (model only)"}


# --- choosing ----------------------------------------------------------------------------

@dataclass
class Choice:
    nbytes: int
    winner: Optional[Variant]       # None: NCCL (or no candidate serves this size)
    time_s: Optional[float]         # the winner's (NCCL's when it won)
    nccl_s: Optional[float]
    timed: int                      # candidates timed at this size (the rest were pruned)
    unmeasured: bool = False        # the time budget ran out before this size: NCCL, untimed
    ruled_out: int = 0              # candidates the prior (cost model) left untimed at this size
    # Where NCCL won: gc3's best loser by the same rank and its time, so the provenance says by how
    # much (None: nothing of gc3's was timed here, or gc3 won).
    runner_up: Optional[Tuple[Variant, float]] = None


# A measured tune times, at each size, only the candidates the cost model predicts within this
# factor of its fastest prediction (and at least its PRIOR_KEEP fastest): the model's median error
# is a few per cent where it is calibrated, but it prices a program's fused and unfused forms alike
# and extrapolates rank counts, so the margin is wide.
PRIOR_RATIO, PRIOR_KEEP = 2.0, 4


@dataclass(frozen=True)
class Prior:
    """A timer's say on which candidates are worth timing with another (`gc3 tune --prior`: the
    cost model's, before measuring): at a size, those it predicts within `ratio` x of its fastest
    prediction, at least its `keep` fastest, and every candidate it cannot price.  It must answer
    alike on every rank (the cost model is deterministic), so the ranks time the same candidates."""
    timer: "Timer"
    ratio: float = PRIOR_RATIO
    keep: int = PRIOR_KEEP

    def shortlist(self, cands: Sequence[Variant], nbytes: int, inplace: bool) -> List[Variant]:
        """`cands` worth timing at `nbytes`, in their own order."""
        predicted = [self.timer.time(c, nbytes, inplace) for c in cands]
        priced = sorted((t, i) for i, t in enumerate(predicted) if t is not None)
        if not priced:
            return list(cands)
        fastest = {i for _, i in priced[:self.keep]}
        limit = self.ratio * priced[0][0]
        return [c for i, (c, t) in enumerate(zip(cands, predicted)) if t is None or t <= limit or i in fastest]

    def provenance(self) -> Dict[str, object]:
        return {"ratio": self.ratio, "keep": self.keep, **self.timer.provenance()}


def choose(cands: Sequence[Variant], sizes: Sequence[int], timer: Timer, inplace: bool,
           coll: str, done: Callable[[Choice], None] = lambda choice: None,
           out_of_time: Callable[[], bool] = lambda: False, prior: Optional[Prior] = None) -> List[Choice]:
    """The fastest of `cands` at each size (by the timer's rank: the graph time where it has
    one) among those no slower than NCCL there (by their whole time), else NCCL.  Sizes go
    up, and a candidate's time at a smaller size bounds its time at this one from below (a
    call does not get faster as it grows), so candidates whose bound is already slower than
    the best found, or than NCCL, are not timed: the slow protocols at large sizes cost nothing.
    With a `prior`, only its shortlist at each size is timed at all.
    Once `out_of_time()` (asked before each size; under mpirun every rank must get
    the same answer) the remaining sizes go to NCCL untimed."""
    bound: Dict[str, float] = {}
    out = []
    measure, measured_as = getattr(timer, "measure", lambda nbytes: None), None
    rank = getattr(timer, "rank", lambda cand, nbytes, inplace, t: t)
    for nbytes in sorted(sizes):
        if measure(nbytes) != measured_as:      # timed another way from here: the last times bound nothing
            bound.clear()
            measured_as = measure(nbytes)
        if out_of_time():
            out.append(Choice(nbytes, None, None, None, 0, unmeasured=True))
            done(out[-1])
            continue
        # NCCL first: a candidate that loses to it takes no part in the ranking, so where the
        # graph-time best loses on the whole (its eager time) the next one that wins still can.
        nccl = timer.baseline(coll, nbytes, inplace)
        best: Optional[Tuple[float, float, Variant]] = None     # (rank key, time, candidate)
        lost: Optional[Tuple[float, float, Variant]] = None     # the same, of those slower than NCCL
        timed = 0
        here = prior.shortlist(cands, nbytes, inplace) if prior is not None else list(cands)
        for cand in sorted(here, key=lambda c: bound.get(c.label, 0.0)):   # stable: grid order breaks ties
            low = bound.get(cand.label, 0.0)   # bounds its rank key, and so its time (the key's whole)
            if (best is not None and low >= best[0]) or (nccl is not None and low > nccl):
                break
            t = timer.time(cand, nbytes, inplace)
            timed += 1
            if t is None:
                continue
            key = bound[cand.label] = rank(cand, nbytes, inplace, t)
            if nccl is not None and t > nccl:
                if lost is None or key < lost[0]:
                    lost = (key, t, cand)
                continue
            if best is None or key < best[0]:
                best = (key, t, cand)
        ruled_out = len(cands) - len(here)
        if best is None:
            out.append(Choice(nbytes, None, nccl, nccl, timed, ruled_out=ruled_out,
                              runner_up=None if lost is None else (lost[2], lost[1])))
        else:
            out.append(Choice(nbytes, best[2], best[1], nccl, timed, ruled_out=ruled_out))
        done(out[-1])
    return out


def ranges(choices: Sequence[Choice]) -> List[Tuple[int, Optional[int], Optional[Variant]]]:
    """(min_bytes, max_bytes, winner) runs: contiguous from 0 to unbounded (None);
    a boundary between grid sizes a < b lies at sqrt(a*b)."""
    out: List[Tuple[int, Optional[int], Optional[Variant]]] = []
    for i, c in enumerate(choices):
        name = c.winner.label if c.winner else None
        if out and (out[-1][2].label if out[-1][2] else None) == name:
            continue
        if out:
            edge = math.isqrt(choices[i - 1].nbytes * c.nbytes)
            lo, _, w = out[-1]
            out[-1] = (lo, edge, w)
            out.append((edge + 1, None, c.winner))
        else:
            out.append((0, None, c.winner))
    return out


def served_ranges(choices: Sequence[Choice]) -> List[Tuple[int, Optional[int], Optional[Variant]]]:
    """`ranges`, with a small-message kernel's range ending at the largest size it
    serves and the next range taking over from there."""
    out = []
    resume = None
    for lo, hi, cand in ranges(choices):
        lo, resume = (lo if resume is None else resume), None
        if cand is not None and cand.kernel:
            hi = limits.SMALL_ALLREDUCE_MAX_BYTES if hi is None else min(hi, limits.SMALL_ALLREDUCE_MAX_BYTES)
            resume = hi + 1
        out.append((lo, hi, cand))
    return out


@dataclass
class Tuned:
    """What `tune` found for one collective: per placement ("inplace"/"outofplace"), the choices."""
    collective: str
    candidates: List[Variant]
    skipped: List[str]
    choices: Dict[str, List[Choice]] = field(default_factory=dict)


PLACEMENTS = (("inplace", True), ("outofplace", False))


class Budget:
    """`gc3 tune --time-budget`, shared out over the (collective, placement) tables in
    turn: each gets an equal share of what is left when it starts, so what a quick
    table leaves passes on, and no collective loses every size to a slow one before
    it.  `agree(spent)` makes the ranks of a measured tune take one answer (rank 0's)."""

    def __init__(self, seconds: float, agree: Callable[[bool], bool] = lambda spent: spent,
                 clock: Callable[[], float] = time.monotonic):
        self.seconds, self.agree, self.clock = seconds, agree, clock
        self.end = clock() + seconds
        self.deadline = self.end

    def start_table(self, tables_left: int) -> None:
        now = self.clock()
        self.deadline = now + max(self.end - now, 0.0) / max(tables_left, 1)

    def out_of_time(self) -> bool:
        return self.agree(self.seconds > 0 and self.clock() > self.deadline)


def bar(done: int, total: int, width: int = 20) -> str:
    """A text progress bar: `done` of `total` as #s in `width` cells, and the percentage."""
    frac = min(max(done / total, 0.0), 1.0) if total > 0 else 1.0
    full = int(frac * width)
    return f"{'#' * full}{'.' * (width - full)} {frac * 100:3.0f}%"


def tune(ranks: int, nodes: int, collectives: Sequence[str], sizes: Sequence[int], grid: Grid, timer: Timer,
         progress: Callable[[str], None] = lambda line: None, budget: Optional[Budget] = None,
         prior: Optional[Prior] = None) -> List[Tuned]:
    """`progress` gets a line per collective, and one per (collective, placement,
    size) decided with the time left (at the pace so far).  What the `budget`
    cuts off (see `choose`) is NCCL's in the catalog and listed as unmeasured;
    what the `prior` rules out at a size is never timed there."""
    budget = budget or Budget(0)
    out = []
    begin = time.monotonic()
    steps, total = [0], len(collectives) * len(PLACEMENTS) * len(sizes)

    def decided(coll: str, place: str, c: Choice) -> None:
        steps[0] += 1
        spent = time.monotonic() - begin
        left = spent / steps[0] * (total - steps[0])
        what = c.winner.label if c.winner else ("NCCL (time budget spent, not measured)" if c.unmeasured else "NCCL")
        at = f" {c.time_s * 1e6:.1f} us" if c.time_s is not None else ""
        if c.runner_up is not None:
            at += f" (gc3's best: {c.runner_up[0].label} {c.runner_up[1] * 1e6:.1f} us)"
        progress(f"[{steps[0]}/{total}] {bar(steps[0], total)} {coll} {place} {format_size(c.nbytes)}: {what}{at} "
                 f"({c.timed} timed); {spent:.0f} s spent, about {left:.0f} s left")

    for ci, coll in enumerate(collectives):
        start = time.monotonic()
        cands, skipped = candidates(coll, ranks, nodes, grid)
        cands += kernel_candidates(coll, ranks, nodes)
        tuned = Tuned(coll, cands, skipped)
        for pi, (place, inplace) in enumerate(PLACEMENTS):
            budget.start_table((len(collectives) - ci) * len(PLACEMENTS) - pi)
            own = [c for c in cands if c.serves(inplace)]
            if not inplace and (timer.prices_inplace_copy or not [c for c in own if not c.kernel]):
                own = own + [c for c in cands if not c.serves(False)]     # the runtime copies the input first
            if own:
                tuned.choices[place] = choose(own, sizes, timer, inplace, coll,
                                              lambda c, coll=coll, place=place: decided(coll, place, c),
                                              budget.out_of_time, prior)
            else:
                total -= len(sizes)
        ruled_out = sum(ch.ruled_out for cs in tuned.choices.values() for ch in cs)
        progress(f"{coll}: {len(cands)} candidates compiled, {len(skipped)} skipped, "
                 f"{sum(ch.timed for cs in tuned.choices.values() for ch in cs)} timings"
                 + (f" ({ruled_out} ruled out by the prior)" if prior is not None else "")
                 + f", {time.monotonic() - start:.1f} s")
        out.append(tuned)
    return out


# --- the catalog -----------------------------------------------------------------------

def entries(results: Sequence[Tuned], ranks: int, file_of: Callable[[Variant], str]) -> List[dict]:
    """Catalog entries, in-place ranges of a collective before its out-of-place
    ones: an in-place IR listed for out-of-place calls also matches in-place
    calls of its range, and the drop-in takes the first entry that serves a
    call, so the in-place ranges (which cover every size wherever an in-place
    candidate exists) must come first."""
    out = []
    for t in results:
        per_place = {}
        for place, inplace in PLACEMENTS:
            per_place[place] = []
            for lo, hi, cand in served_ranges(t.choices.get(place, [])):
                if cand is None:
                    continue       # NCCL serves these sizes
                if cand.kernel:
                    per_place[place].append({"kernel": cand.kernel, "collective": t.collective, "ranks": ranks,
                                             "inplace": inplace, "outofplace": not inplace, "min_bytes": lo,
                                             "max_bytes": hi, "name": cand.label})
                    continue
                entry = {"file": file_of(cand), "collective": t.collective, "ranks": ranks,
                         "inplace": cand.inplace, "outofplace": not inplace, "protocol": cand.protocol,
                         "min_bytes": lo, "max_bytes": hi, "name": cand.label}
                if t.collective in ROOTED:
                    entry["root"] = cand.root if cand.root is not None else ROOT
                per_place[place].append(entry)
        # An in-place range that the out-of-place table gives to the same IR serves both: one entry.
        # (A kernel's entries name the placement they serve in "inplace" too.)
        def twin(e: dict) -> dict:
            return dict(e, outofplace=True, **({"inplace": False} if "kernel" in e else {}))
        both = [e for e in per_place["inplace"] if twin(e) in per_place["outofplace"]]
        for e in both:
            per_place["outofplace"].remove(twin(e))
            e["outofplace"] = True
        out += per_place["inplace"] + per_place["outofplace"]
    return out


def choices_record(results: Sequence[Tuned], timer: Optional[Timer] = None) -> Dict[str, Dict[str, List[dict]]]:
    """Per collective and placement, what won at each grid size and by how much, for the provenance;
    where the timer added a graph's time to the eager one, both halves of the winner's and NCCL's."""
    split = getattr(timer, "parts", lambda label, coll, nbytes, inplace: None)

    def row(coll: str, inplace: bool, c: Choice) -> dict:
        out = {"bytes": c.nbytes, "algorithm": c.winner.label if c.winner else
               ("NCCL (not measured: time budget spent)" if c.unmeasured else "NCCL"),
               "time_us": None if c.time_s is None else round(c.time_s * 1e6, 3),
               "nccl_us": None if c.nccl_s is None else round(c.nccl_s * 1e6, 3)}
        if c.runner_up is not None:
            out.update(best_gc3=c.runner_up[0].label, best_gc3_us=round(c.runner_up[1] * 1e6, 3))
        sides = ([("", c.winner.label)] if c.winner else []) + [("nccl_", None)] + \
            ([("best_gc3_", c.runner_up[0].label)] if c.runner_up is not None else [])
        for prefix, label in sides:
            halves = split(label, coll, c.nbytes, inplace)      # None: NCCL's side
            if halves is not None:
                out.update({f"{prefix}eager_us": round(halves[0], 3), f"{prefix}graph_us": round(halves[1], 3)})
        return out

    return {t.collective: {place: [row(t.collective, place == "inplace", c) for c in cs]
                           for place, cs in t.choices.items()}
            for t in results}


def write_catalog(results: Sequence[Tuned], out: Path, ranks: int, provenance: Dict[str, object],
                  ir_dir: Optional[Path] = None) -> dict:
    """Prove every chosen IR (gc3.verify), write it as <label>.xml into `ir_dir`
    (default: beside `out`) and the catalog JSON to `out`; return the catalog."""
    from gc3.ir.xml_io import to_xml
    from gc3.verify import verify

    out = Path(out)
    ir_dir = Path(ir_dir) if ir_dir is not None else out.parent
    ir_dir.mkdir(parents=True, exist_ok=True)
    written: Dict[str, str] = {}

    def file_of(cand: Variant) -> str:
        if cand.label not in written:
            verify(cand.program)
            path = ir_dir / f"{cand.label}.xml"
            path.write_text(to_xml(cand.program))
            written[cand.label] = os.path.relpath(path, out.parent)   # the loader reads it relative to the JSON
        return written[cand.label]

    catalog = {"version": 1, "provenance": provenance, "algorithms": entries(results, ranks, file_of)}
    out.write_text(json.dumps(catalog, indent=2) + "\n")
    return catalog


def provenance(timer: Timer, ranks: int, nodes: int, sizes: Sequence[int], grid: Grid,
               results: Sequence[Tuned], command: str, prior: Optional[Prior] = None) -> Dict[str, object]:
    pruned = {} if prior is None else {"prior": dict(prior.provenance(), ruled_out=sum(
        c.ruled_out for t in results for cs in t.choices.values() for c in cs))}
    return {"command": command, **timer.provenance(), **pruned, "ranks": ranks, "nodes": nodes,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "dtype": getattr(timer, "dtype", DTYPE), "root": ROOT, "sizes": list(sizes), "grid": dataclasses.asdict(grid),
            "choices": choices_record(results, timer),
            "unmeasured": [f"{t.collective} {place} {c.nbytes}" for t in results
                           for place, cs in t.choices.items() for c in cs if c.unmeasured]}


class MergeError(InputError):
    """A catalog that cannot join a merge; `source` is the file to blame."""

    def __init__(self, source: object, message: str):
        super().__init__(message)
        self.source = str(source)


# What must agree between merged catalogs, beyond the GPUs: a catalog serves one shape of communicator.
_SAME = ("ranks", "nodes", "dtype", "measured")


def _tune_catalog(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MergeError(path, f"cannot read it as a JSON catalog: {exc}") from None
    prov = data.get("provenance") if isinstance(data, dict) else None
    if not isinstance(prov, dict) or not isinstance(prov.get("choices"), dict) or not prov["choices"] \
            or not isinstance(data.get("algorithms"), list) or data.get("version", 1) != 1:
        raise MergeError(path, 'not a catalog written by `gc3 tune` (version 1, "algorithms" and provenance '
                               '"choices"): only those say which collectives they tuned')
    return data


def _machine(prov: dict) -> Tuple[str, object]:
    """What the times were taken on.  A model-only catalog has no GPUs: its cost-model preset
    stands in for them, as two presets price the same candidate differently."""
    from .machine import fingerprint_of_provenance
    if not prov.get("measured"):
        return "cost model", (prov.get("cost_model") or {}).get("preset")
    return "fingerprint", fingerprint_of_provenance(prov)


def merge_catalogs(paths: Sequence[Path], out: Path, ir_dir: Optional[Path] = None) -> dict:
    """Merge catalogs that `gc3 tune` wrote for the same GPUs and communicator, each tuning
    collectives the others did not, into `out`, their IRs copied into `ir_dir` (default: beside
    `out`); return the catalog.  Everything is read and checked before anything is written."""
    paths, out = [Path(p) for p in paths], Path(out)
    ir_dir = Path(ir_dir) if ir_dir is not None else out.parent
    cats = [_tune_catalog(p) for p in paths]
    provs = [c["provenance"] for c in cats]
    first, p0 = paths[0], provs[0]
    for path, prov in zip(paths[1:], provs[1:]):
        for key in _SAME:
            if prov.get(key) != p0.get(key):
                raise MergeError(path, f'"{key}" is {prov.get(key)!r} but {first} has {p0.get(key)!r}: '
                                       "a merged catalog must hold times of one communicator shape")
        what, mine = _machine(prov)
        theirs = _machine(p0)[1]
        if prov.get("measured") and (mine is None or theirs is None):
            raise MergeError(path if mine is None else first,
                             "its provenance does not say which GPUs it was measured on, so it cannot be "
                             "shown to share them with the other catalogs")
        if mine != theirs:
            raise MergeError(path, f"{what} {mine} but {first} has {theirs}: times of different "
                                   "machines do not compare")
    owner: Dict[str, Path] = {}
    for path, prov in zip(paths, provs):
        for coll in prov["choices"]:
            if coll in owner:
                raise MergeError(path, f"{coll} was tuned by both {owner[coll]} and {path}: "
                                       "each collective must come from one catalog")
            owner[coll] = path
    fused = [(p, c["fused"]) for p, c in zip(paths, cats) if "fused" in c]
    if len(fused) > 1:
        raise MergeError(fused[1][0], f'both {fused[0][0]} and {fused[1][0]} carry a "fused" section; '
                                      "at most one may")

    copies: Dict[Path, bytes] = {}      # destination -> content
    algorithms = []
    for path, cat in zip(paths, cats):
        for i, e in enumerate(cat["algorithms"]):
            coll = e.get("collective", "allreduce" if "kernel" in e else None) if isinstance(e, dict) else None
            if owner.get(coll) != path:
                raise MergeError(path, f"algorithms[{i}] serves {coll!r}, which its provenance \"choices\" "
                                       "does not list")
            if "file" in e:
                src = path.parent / str(e["file"])
                try:
                    data = src.read_bytes()
                except OSError as exc:
                    raise MergeError(path, f"algorithms[{i}]: cannot read {src}: {exc.strerror or exc}") from None
                dest = ir_dir / src.name
                if copies.setdefault(dest, data) != data:
                    raise MergeError(path, f"algorithms[{i}]: {src} and another catalog's IR of the same name "
                                           f"differ; both would be {dest}")
                e = dict(e, file=os.path.relpath(dest, out.parent))   # the loader reads it relative to the JSON
            algorithms.append(e)

    prov = dict(p0, choices={k: v for p in provs for k, v in p["choices"].items()},
                unmeasured=[u for p in provs for u in p.get("unmeasured", [])],
                command=" + ".join(str(p.get("command", "?")) for p in provs),
                parts=[{"file": os.path.relpath(path, out.parent), "command": p.get("command"),
                        "date": p.get("date"), "collectives": list(p["choices"]), "sizes": p.get("sizes"),
                        "grid": p.get("grid")} for path, p in zip(paths, provs)])
    dates = [p["date"] for p in provs if isinstance(p.get("date"), str)]
    if dates:
        prov["date"] = max(dates)      # tune writes ISO 8601 in UTC: text order is time order
    if any(p.get("shippable") is False for p in provs):
        prov["shippable"] = False
        prov["not_shippable"] = "; ".join(f"{path}: {p.get('not_shippable', 'not shippable')}"
                                          for path, p in zip(paths, provs) if p.get("shippable") is False)
    rejected = {k: v for p in provs for k, v in (p.get("rejected") or {}).items()}
    if rejected:
        prov["rejected"] = rejected
    priors = [p["prior"] for p in provs if isinstance(p.get("prior"), dict)]
    if priors:
        prov["prior"] = dict(priors[0], ruled_out=sum(q.get("ruled_out", 0) for q in priors))

    catalog = {"version": 1, "provenance": prov, "algorithms": algorithms, **({"fused": fused[0][1]} if fused else {})}
    def replace(path: Path, data: bytes) -> None:
        # A drop-in starting meanwhile reads the old file or the new one, never half of one.
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    ir_dir.mkdir(parents=True, exist_ok=True)
    for dest, data in copies.items():
        if not (dest.is_file() and dest.read_bytes() == data):
            replace(dest, data)
    replace(out, (json.dumps(catalog, indent=2) + "\n").encode())
    return catalog


def projection(path: Path, place: str = "outofplace") -> List[str]:
    """The README's projection table of a `gc3 tune --model-only` catalog (`gc3 catalog
    projection`): its provenance, then per collective (one placement) each run of one
    chosen algorithm as a size range, its predicted time at the range's first and last
    size and the busbw that implies at the last (nccl-tests' factor).  Nothing in it is
    measured: a measured catalog is refused, as is a file tune did not write."""
    from gc3.units import bus_factor

    try:
        prov = json.loads(Path(path).read_text())["provenance"]
        choices, ranks, nodes = prov["choices"], prov["ranks"], prov["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a catalog written by gc3 tune ({type(exc).__name__}: {exc})") from None
    if prov.get("measured", True):
        raise InputError(f"{path}: a measured catalog; this summarizes cost-model projections only")
    model = prov.get("cost_model", {})
    out = [f"# PROJECTION (cost model, not measured): {ranks} ranks on {nodes} node(s), {place}, "
           f"preset {model.get('preset')} ({model.get('name')})",
           f"# {model.get('calibration')}; busbw at the last size of each range",
           f"{'collective':13} {'sizes':>13}  {'algorithm':44} {'predicted us':>16} {'busbw':>9}"]
    for coll, places in choices.items():
        picks = places.get(place)
        if picks is None:
            out.append(f"{coll:13} {'all':>13}  no candidate: NCCL")
            continue
        runs: List[list] = []
        for pick in picks:
            if runs and runs[-1][0] == pick["algorithm"]:
                runs[-1][1].append(pick)
            else:
                runs.append([pick["algorithm"], [pick]])
        for alg, ps in runs:
            first, last = ps[0], ps[-1]
            sizes = format_size(first["bytes"]) + (f"-{format_size(last['bytes'])}" if len(ps) > 1 else "")
            if last["time_us"] is None:
                out.append(f"{coll:13} {sizes:>13}  {alg or 'NCCL'}")
                continue
            times = f"{first['time_us']:.1f}" + (f"-{last['time_us']:.1f}" if len(ps) > 1 else "")
            bw = last["bytes"] / (last["time_us"] * 1e-6) / 1e9 * bus_factor(coll, ranks)
            out.append(f"{coll:13} {sizes:>13}  {alg or 'NCCL':44} {times:>16} {bw:6.0f} GB/s")
    return out


def summary(results: Sequence[Tuned]) -> List[str]:
    """One line per chosen range, for the terminal."""
    lines = []
    for t in results:
        for place, _ in PLACEMENTS:
            chosen = t.choices.get(place)
            if not chosen:
                lines.append(f"{t.collective:13} {place:10}  no candidate: NCCL")
                continue
            for lo, hi, cand in served_ranges(chosen):
                inside = [c for c in chosen if c.nbytes >= lo and (hi is None or c.nbytes <= hi)]
                times = ", ".join(f"{format_size(c.nbytes)} {c.time_s * 1e6:.1f} us" for c in inside
                                  if c.time_s is not None)
                span = f"{'>' + format_size(lo - 1) if lo else '0 B'}..{'inf' if hi is None else format_size(hi)}"
                lines.append(f"{t.collective:13} {place:10} {span:>22}  {cand.label if cand else 'NCCL'}  ({times})")
    return lines


def applicable(ranks: int, nodes: int, collectives: Sequence[str]) -> List[str]:
    """The collectives of `collectives` that have an algorithm for this many ranks."""
    return [c for c in collectives
            if any(a.collective == c and a.fits(ranks, nodes) for a in library.ALGORITHMS.values())]


def check_shape(ranks: int, nodes: int) -> None:
    from gc3 import limits
    if not 2 <= ranks <= limits.MAX_RANKS:
        raise InputError(f"--ranks {ranks}: expected 2..{limits.MAX_RANKS} (gc3.limits.MAX_RANKS)")
    if nodes < 1 or ranks % nodes:
        raise InputError(f"--nodes {nodes}: must divide --ranks {ranks} (ranks = nodes x GPUs per node)")


__all__ = ["COLLECTIVES", "FULL", "QUICK", "Budget", "Variant", "Choice", "Grid", "ModelTimer", "Prior", "Timer",
           "Tuned", "applicable", "candidates", "choose", "merge_catalogs", "ranges", "tune", "write_catalog"]
