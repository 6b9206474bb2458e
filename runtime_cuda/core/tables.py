"""IR -> the compact tables the interpreter kernel walks.

One row per device step (int32 fields, see GC3_ST_* in kernels/common.cuh).
Three things happen on the way:

* `nop` steps disappear: a nop only waits, so its waits move onto the next
  real step of its TB, and a wait *on* a nop becomes a wait on what the nop
  stood for (the TB's previous real step plus the nop's own waits);
* waits are reduced to one (block, device step) per other TB, the latest;
* runs of `re` steps into the same destination are fused into one pass of up
  to gc3.limits.MAX_REDUCE_FANIN sources, where nothing waits in between;
* a compute step (fused IR) gets its operands in the extras table: its range
  of the operator's split axis and the operator's dimensions
  (GC3_CMP_EXTRA_PAIRS in kernels/common.cuh);
* a step that carries the epilogue (an epilogue IR) gets GC3_F_EPILOGUE: the
  kernel applies the call's epilogue to what it stores into dst, the IR's own
  rule (gc3.ir.epilogue), so that the steps the compiler chose, and the
  semantic checker proved, are the ones that apply it.

Connections are (sender rank, receiver rank, channel); a launch group (all
ranks for virtual ranks, one rank per process) gets the send- and
receive-side connections of its own ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from gc3 import limits
from gc3.errors import FifoOrderError, IRStructureError, LimitError, NotOnDeviceError
from gc3.ir import OPCODES, ComputeArgs, Program, Step, local_input, local_output
from gc3.ir.epilogue import Epilogue
from gc3.ir.opcodes import NOT_ON_DEVICE
from gc3.verify import runtime_limits, structure

from . import abi

ConnKey = Tuple[int, int, int]          # (sender rank, receiver rank, channel)
StepRef = Tuple[int, int]               # (tb id, index into tb.steps)


@dataclass
class DeviceStep:
    """One row of the step table before packing."""
    op: str
    cnt: int
    inp: Optional[Tuple[str, int]]
    out: Optional[Tuple[str, int]]
    extras: List[Tuple[str, int]]
    waits: Dict[int, int]               # tb id -> xml step index of a real step
    origs: List[int]                    # xml step indices folded into this row
    signal: bool = False
    compute: Optional[ComputeArgs] = None   # a compute step's operands
    epilogue: Optional[Epilogue] = None     # applied to what the row stores into dst


@dataclass
class Tables:
    prog: Program
    ranks: Tuple[int, ...]              # ranks of this launch group, in block order
    tbs: np.ndarray                     # int32 [nblocks, TB_NFIELDS]
    steps: np.ndarray                   # int32 [nsteps, ST_NFIELDS]
    deps: np.ndarray                    # int32 [ndeps, 2]
    extras: np.ndarray                  # int32 [nextra, 2]
    sends: List[ConnKey]                # send-side connection of each send index
    recvs: List[ConnKey]
    max_cnt: int                        # largest cnt of any transfer in the whole program
    blocks: List[Tuple[int, int]]       # (rank, tb id) of each block
    device_steps: List[List[DeviceStep]] = field(default_factory=list)   # per block
    chunk_units: FrozenSet[int] = frozenset()   # split-axis units per chunk of the compute steps (fused IR)
    uses_input: bool = True             # some step of these blocks reads or writes buffer i


    @property
    def nblocks(self) -> int:
        return len(self.blocks)

    def describe_step(self, block: int, dstep: int) -> str:
        rank, tb = self.blocks[block]
        ds = self.device_steps[block][dstep]
        xml = self.prog.gpu(rank).threadblocks
        tbo = next(t for t in xml if t.id == tb)
        k = ds.origs[-1]
        return f"rank {rank} TB {tb} step {k} ({tbo.steps[k].type})"


def connections(prog: Program) -> List[ConnKey]:
    """Every connection the program names (from either end), sorted."""
    keys = set()
    for g in prog.gpus:
        for tb in g.threadblocks:
            if tb.send >= 0:
                keys.add((g.id, tb.send, tb.chan))
            if tb.recv >= 0:
                keys.add((tb.recv, g.id, tb.chan))
    return sorted(keys)


def max_transfer_cnt(prog: Program) -> int:
    cnts = [st.cnt for g in prog.gpus for tb in g.threadblocks for st in tb.steps
            if st.type != "nop" and (OPCODES[st.type].send or OPCODES[st.type].recv)]
    return max(cnts, default=1)


def check_transfer_counts(prog: Program) -> None:
    """The k-th send and the k-th receive of a connection must move the same
    number of chunks (a slot holds cnt chunk-tiles).  Unequal *numbers* of
    sends and receives are left to the kernel, which times out on them."""
    seqs: Dict[Tuple[str, ConnKey], List[Tuple[int, int, int]]] = {}
    for g in prog.gpus:
        for tb in g.threadblocks:
            for k, st in enumerate(tb.steps):
                if st.type == "nop":
                    continue
                if st.info.send:
                    seqs.setdefault(("s", (g.id, tb.send, tb.chan)), []).append((st.cnt, tb.id, k))
                if st.info.recv:
                    seqs.setdefault(("r", (tb.recv, g.id, tb.chan)), []).append((st.cnt, tb.id, k))
    for (side, key), sends in seqs.items():
        if side != "s":
            continue
        for n, (s, r) in enumerate(zip(sends, seqs.get(("r", key), []))):
            if s[0] != r[0]:
                raise FifoOrderError(
                    f"connection rank {key[0]} -> rank {key[1]} chan {key[2]}: transfer {n} is sent with cnt={s[0]} "
                    f"(rank {key[0]} TB {s[1]} step {s[2]}) but received with cnt={r[0]} "
                    f"(rank {key[1]} TB {r[1]} step {r[2]})")


class _Resolver:
    """Turns XML waits (which may name nops) into waits on real steps."""

    def __init__(self, rank: int, tbs: Dict[int, List[Step]]):
        self.rank = rank
        self.tbs = tbs
        self.memo: Dict[StepRef, FrozenSet[StepRef]] = {}
        self.active: set = set()

    def own_waits(self, ref: StepRef) -> FrozenSet[StepRef]:
        st = self.tbs[ref[0]][ref[1]]
        if st.depid < 0:
            return frozenset()
        return self.done(st.depid, st.deps)

    def _inputs(self, ref: StepRef) -> List[StepRef]:
        """What a nop's completion stands for: the step before it and the step it waits on."""
        tb, k = ref
        st = self.tbs[tb][k]
        return ([(tb, k - 1)] if k > 0 else []) + ([(st.depid, st.deps)] if st.depid >= 0 else [])

    def done(self, tb: int, k: int) -> FrozenSet[StepRef]:
        """Real steps whose completion means step k of tb has completed.

        An explicit stack, not recursion: a threadblock may hold a thousand
        nops in a row (MAX_STEPS_PER_TB), past Python's recursion limit."""
        if k < 0:
            return frozenset()
        stack = [(tb, k)]
        while stack:
            ref = stack[-1]
            if ref in self.memo:
                stack.pop()
                continue
            if self.tbs[ref[0]][ref[1]].type != "nop":
                self.memo[ref] = frozenset([ref])
                stack.pop()
                continue
            inputs = self._inputs(ref)
            todo = [d for d in inputs if d not in self.memo]
            if not todo:
                self.memo[ref] = frozenset().union(*(self.memo[d] for d in inputs))
                self.active.discard(ref)
                stack.pop()
                continue
            self.active.add(ref)
            for d in todo:
                if d in self.active:   # an unfinished step on the path waits on this one
                    raise IRStructureError(f"rank {self.rank} TB {d[0]} step {d[1]}: nop dependencies form a cycle")
            stack.extend(todo)
        return self.memo[(tb, k)]


def _latest(refs, own_tb: int) -> Dict[int, int]:
    """One wait per other TB: the latest step (program order covers the rest)."""
    out: Dict[int, int] = {}
    for tb, k in refs:
        if tb != own_tb:
            out[tb] = max(out.get(tb, -1), k)
    return out


def _may_alias(a: Tuple[str, int], b: Tuple[str, int], cnt: int) -> bool:
    # i and o can be one allocation (in-place calls), so they may always alias.
    if {a[0], b[0]} == {"i", "o"}:
        return True
    return a[0] == b[0] and a[1] < b[1] + cnt and b[1] < a[1] + cnt


def device_steps(prog: Program, rank: int) -> Dict[int, List[DeviceStep]]:
    """Per TB id, its device steps (nops folded, waits resolved, re runs fused)."""
    conv = prog.convention
    g = prog.gpu(rank)
    tbs = {tb.id: tb.steps for tb in g.threadblocks}
    res = _Resolver(rank, tbs)
    rows: Dict[int, List[DeviceStep]] = {}
    for tb in g.threadblocks:
        out: List[DeviceStep] = []
        pending: set = set()
        for k, st in enumerate(tb.steps):
            pending |= res.own_waits((tb.id, k))
            if st.type == "nop":
                continue
            out.append(DeviceStep(op=st.type, cnt=st.cnt, inp=local_input(st, conv), out=local_output(st, conv),
                                  extras=[], waits=_latest(pending, tb.id), origs=[k], compute=st.compute,
                                  epilogue=st.epilogue))
            pending = set()
        rows[tb.id] = out
    waited = {(t, k) for steps in rows.values() for ds in steps for t, k in ds.waits.items()}
    for tbid, steps in rows.items():
        rows[tbid] = _fuse_reduces(steps, tbid, waited)
    index = {(tbid, k): j for tbid, steps in rows.items() for j, ds in enumerate(steps) for k in ds.origs}
    for tbid, steps in rows.items():
        for ds in steps:
            for t, k in ds.waits.items():
                j = index[(t, k)]
                rows[t][j].signal = True
    return rows


def _fuse_reduces(steps: List[DeviceStep], tbid: int, waited: set) -> List[DeviceStep]:
    out: List[DeviceStep] = []
    for ds in steps:
        prev = out[-1] if out else None
        # A row that applies the epilogue stores a final value: nothing may reduce into it after.
        if (prev is not None and ds.op == "re" and prev.op == "re" and ds.out == prev.out and ds.cnt == prev.cnt
                and not ds.waits and (tbid, prev.origs[-1]) not in waited and prev.epilogue is None
                and 2 + len(prev.extras) <= limits.MAX_REDUCE_FANIN
                and not _may_alias(ds.inp, ds.out, ds.cnt)
                and not any(_may_alias(s, ds.out, ds.cnt) for s in [prev.inp] + prev.extras)):
            prev.extras.append(ds.inp)
            prev.origs.append(ds.origs[0])
            prev.epilogue = ds.epilogue
            continue
        out.append(ds)
    return out


def refuse_not_on_device(prog: Program) -> None:
    """NotOnDeviceError naming the first step whose opcode the interpreter lacks
    (`gc3.ir.opcodes.NOT_ON_DEVICE`: compute steps of a fused IR, for now): the
    kernel would otherwise meet an opcode it cannot dispatch."""
    for g in prog.gpus:
        for tb in g.threadblocks:
            for st in tb.steps:
                if st.type in NOT_ON_DEVICE:
                    raise NotOnDeviceError(
                        f"{prog.name}: rank {g.id} tb {tb.id} step {st.s} is a {st.type!r} step, which the CUDA "
                        f"runtime has no opcode for yet (a fused IR: `gc3 simulate` runs it on the CPU)")


# The epilogue items the interpreter applies (kernels/epilogue.cuh), each at most once, in any order.
EPILOGUE_ITEMS = {"scale": "GC3_EPI_SCALE", "avg": "GC3_EPI_AVG", "bias": "GC3_EPI_BIAS",
                  "residual": "GC3_EPI_RESIDUAL"}


def check_epilogue(prog: Program) -> None:
    """What the interpreter needs of an epilogue IR, refused naming the program or step: the
    items of EPILOGUE_ITEMS, once each (no cast: every buffer of a call is of its one dtype);
    every carrying step carries the program's epilogue (the call passes one) and stores it into
    output memory (the kernel indexes bias and residual by the output element)."""
    epi = prog.epilogue
    carriers = [(g.id, tb.id, st) for g in prog.gpus for tb in g.threadblocks for st in tb.steps
                if st.epilogue is not None]
    if epi is None:
        if carriers:
            r, tb, st = carriers[0]
            raise IRStructureError(f"{prog.name}: rank {r} tb {tb} step {st.s} carries the epilogue {st.epilogue} "
                                   f"but the program promises none (no <epilogue>)")
        return
    where = f"{prog.name}: the epilogue {epi}"
    if prog.compute is not None:
        raise NotOnDeviceError(f"{where} on a compute-fused program ({prog.compute.op}): the interpreter applies "
                               f"epilogues to plain collectives only")
    keys = [k for k, _ in epi.items]
    if "cast" in keys:
        raise NotOnDeviceError(f"{where}: the CUDA interpreter does not apply cast({epi.cast}): it keeps every "
                               f"buffer of a call in the call's one dtype (one kernel build per dtype); run the "
                               f"epilogue without the cast and convert the output after the call")
    for k in keys:
        if keys.count(k) > 1:
            raise NotOnDeviceError(f"{where}: {k} appears {keys.count(k)} times; the interpreter applies each of "
                                   f"{', '.join(EPILOGUE_ITEMS)} at most once")
    if epi.cols is not None and epi.cols > limits.INT32_MAX:
        raise LimitError(f"{where}: cols={epi.cols} does not fit the kernel's int32 field")
    if prog.ngpus >= 1 << 16:
        raise LimitError(f"{where}: {prog.ngpus} ranks; the kernel's avg field holds fewer than {1 << 16}")
    conv = prog.convention
    for r, tb, st in carriers:
        at = f"{prog.name}: rank {r} tb {tb} step {st.s} ({st.type})"
        if st.epilogue != epi:
            raise NotOnDeviceError(f"{at} carries the epilogue {st.epilogue}, not the program's {epi}: the "
                                   f"interpreter applies the call's one epilogue")
        out = local_output(st, conv)
        if out is None or out[0] == "s" or (out[0] == "i" and not prog.inplace):
            what = "nothing" if out is None else f"{out[0]}[{out[1]}]"
            raise IRStructureError(f"{at} applies the epilogue to what it stores into {what}, which is not memory "
                                   f"of the output buffer")


def epilogue_words(prog: Program, bias: int, residual: int) -> List[int]:
    """One rank's GC3_EPW_* words (kernels/common.cuh) of `prog`'s epilogue, with the addresses
    of that rank's bias and residual (0 where the epilogue has none)."""
    epi = prog.epilogue
    return pack_epilogue([k for k, _ in epi.items], epi.scale, epi.cols, prog.ngpus, bias, residual)


def pack_epilogue(items: Sequence[str], scale: Optional[float], cols: Optional[int], nranks: int, bias: int,
                  residual: int) -> List[int]:
    """GC3_EPW_* words of an epilogue of `items` (EPILOGUE_ITEMS' names, applied in that order):
    what the interpreter and the small kernels' epilogue build (kernels/epilogue.cuh) read."""
    code = 0
    for n, k in enumerate(items):
        code |= abi.C[EPILOGUE_ITEMS[k]] << (4 * n)
    scale = scale if scale is not None else 1.0
    shape = (cols or 0) | nranks << 32 | code << 48
    words = [0] * abi.C["GC3_CMP_PTRS"]
    words[abi.C["GC3_EPW_BIAS"]] = int(bias)
    words[abi.C["GC3_EPW_RESIDUAL"]] = int(residual)
    words[abi.C["GC3_EPW_SCALE"]] = int(np.float64(scale).view(np.uint64))
    words[abi.C["GC3_EPW_SHAPE"]] = shape
    return words


# The storage types the compute opcodes are built for (prims_compute.cuh).
COMPUTE_DTYPES = ("float16", "bfloat16", "float32")


def compute_pairs(prog: Program, rank: int, tbid: int, ds: DeviceStep) -> List[List[int]]:
    """A compute step's GC3_CMP_EXTRA_PAIRS extras rows: [col0, col1], then the operator's
    dimensions.  structure.check has put its operands inside the operator; refused here is what
    the kernel in particular cannot evaluate, naming the step."""
    spec, args = prog.compute, ds.compute
    where = f"{prog.name}: rank {rank} tb {tbid} step {ds.origs[-1]} ({ds.op})"
    if spec.dtype not in COMPUTE_DTYPES:
        raise NotOnDeviceError(f"{where}: the interpreter's {spec.op} computes in {', '.join(COMPUTE_DTYPES)}, "
                               f"not {spec.dtype}")
    axis, length, _ = spec.split()
    if ds.out is None or (args.col1 - args.col0) % ds.cnt:
        raise IRStructureError(f"{where}: {axis}s [{args.col0}, {args.col1}) do not split into its {ds.cnt} dst "
                               f"chunk(s)")
    dims = list(getattr(spec, f"{spec.op}_dims")())
    if max(dims + [length]) > limits.INT32_MAX:
        raise LimitError(f"{where}: operator dimensions {dims} do not fit the kernel's int32 fields")
    pairs = abi.C["GC3_CMP_EXTRA_PAIRS"]
    flat = [args.col0, args.col1] + dims
    flat += [0] * (2 * pairs - len(flat))
    return [flat[i:i + 2] for i in range(0, 2 * pairs, 2)]


def build(prog: Program, ranks: Optional[Sequence[int]] = None) -> Tables:
    """Tables for the blocks of `ranks` (default: every rank, for virtual ranks)."""
    refuse_not_on_device(prog)
    check_epilogue(prog)
    structure.check(prog)
    # Longer `re` runs are split into passes here, so only the table limits apply.
    runtime_limits.check(prog, runtime_limits.Limits(max_fanin=1 << 30))
    check_transfer_counts(prog)
    ranks = tuple(range(prog.ngpus)) if ranks is None else tuple(ranks)
    blocks: List[Tuple[int, int]] = []
    per_block: List[List[DeviceStep]] = []
    chan_of: Dict[Tuple[int, int], Tuple[int, int, int]] = {}
    for r in ranks:
        rows = device_steps(prog, r)
        for tb in prog.gpu(r).threadblocks:
            blocks.append((r, tb.id))
            per_block.append(rows[tb.id])
            chan_of[(r, tb.id)] = (tb.send, tb.recv, tb.chan)
    block_of = {b: i for i, b in enumerate(blocks)}
    sends = sorted({(r, s, c) for (r, _), (s, _, c) in chan_of.items() if s >= 0})
    recvs = sorted({(rv, r, c) for (r, _), (_, rv, c) in chan_of.items() if rv >= 0})
    send_idx = {k: i for i, k in enumerate(sends)}
    recv_idx = {k: i for i, k in enumerate(recvs)}

    tb_rows, step_rows, dep_rows, extra_rows = [], [], [], []
    units: set = set()
    for b, ((r, tbid), steps) in enumerate(zip(blocks, per_block)):
        if len(steps) >= 1 << abi.STEP_BITS:
            raise LimitError(f"rank {r} TB {tbid}: {len(steps)} device steps, more than {(1 << abi.STEP_BITS) - 1}")
        s, rv, c = chan_of[(r, tbid)]
        tb_rows.append([ranks.index(r), r, tbid, len(step_rows), len(steps),
                        send_idx[(r, s, c)] if s >= 0 else -1, recv_idx[(rv, r, c)] if rv >= 0 else -1, c])
        for ds in steps:
            info = OPCODES[ds.op]
            flags = ((abi.C["GC3_F_RECV"] if info.recv else 0) | (abi.C["GC3_F_SEND"] if info.send else 0)
                     | (abi.C["GC3_F_REDUCE"] if info.reduce else 0) | (abi.C["GC3_F_SIGNAL"] if ds.signal else 0)
                     | (abi.C["GC3_F_EPILOGUE"] if ds.epilogue is not None else 0))
            dep_start = len(dep_rows)
            for t, k in sorted(ds.waits.items()):
                target = block_of[(r, t)]
                dep_rows.append([target, _device_index(per_block[target], k)])
            extra_start = len(extra_rows)
            extra_rows.extend([abi.BUF[buf], off] for buf, off in ds.extras)
            if info.compute:
                extra_rows.extend(compute_pairs(prog, r, tbid, ds))
                units.add((ds.compute.col1 - ds.compute.col0) // ds.cnt)
            inp = ds.inp or (None, 0)
            out = ds.out or (None, 0)
            step_rows.append([abi.OPCODE[ds.op], flags, ds.cnt, abi.BUF[inp[0]], inp[1], abi.BUF[out[0]], out[1],
                              dep_start, len(ds.waits), extra_start, len(ds.extras), ds.origs[-1]])
    return Tables(
        prog=prog, ranks=ranks,
        tbs=_array(tb_rows, abi.TB_NFIELDS), steps=_array(step_rows, abi.ST_NFIELDS),
        deps=_array(dep_rows, 2), extras=_array(extra_rows, 2),
        sends=sends, recvs=recvs, max_cnt=max_transfer_cnt(prog), blocks=blocks, device_steps=per_block,
        chunk_units=frozenset(units),
        uses_input=any(op is not None and op[0] == "i" for steps in per_block for ds in steps
                       for op in [ds.inp, ds.out] + ds.extras))


def _device_index(steps: List[DeviceStep], xml_index: int) -> int:
    for j, ds in enumerate(steps):
        if xml_index in ds.origs:
            return j
    raise AssertionError(f"xml step {xml_index} has no device step")


def _array(rows: List[List[int]], width: int) -> np.ndarray:
    # Never empty: the kernel may take the address of row 0.
    a = np.asarray(rows, dtype=np.int32).reshape(-1, width) if rows else np.zeros((1, width), np.int32)
    return np.ascontiguousarray(a)
