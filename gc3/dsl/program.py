"""The program being traced: `GC3Program`, `chunk`, `parallelize`, `Check`.

Tracing runs the user's Python once.  Each `copy`/`reduce` is checked against
the symbolic state (every slot's `Value`, see `symbolic.py`), applied to it,
and added to the program's Chunk DAG (`GC3Program.chunk_dag`, what lowering
compiles) as an `Op` over canonical `Slot`s: the checks are tracing's, the
DAG is the same whoever builds it.  `Check()`
compares the final state with the collective's postcondition.

Decisions a user may trip over:
* `chunk()` of a slot that holds no data raises `UninitializedChunkError` at
  once (msccl-tools returns None there, which fails later, far away).
* A reference is stale once any of its slots is written by another operation;
  using it (as a source, destination, or via split/group) raises
  `StaleReferenceError`.  `ref.reduce(other)` writes through `ref`, so `ref`
  stays valid and is returned (msccl-tools programs reduce several times into
  one ref).
* `copy` without `index` goes to the source's index, except into a scratch
  buffer, where it appends after the chunks that buffer already holds on the
  destination rank.  A copy onto its own slot (an in-place alias) is a no-op.
* In-place aliases are resolved when a reference is made, so `ref.buffer` and
  `ref.index` are the real ones.

The only global is the tracing state: the program being traced, and (inside
`run_script`) the list of programs a script traced.
"""
from __future__ import annotations

import runpy
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .. import limits
from .chunk_dag import ChunkDAG, input_slots
from .chunk_ref import ChunkRef
from ..ir.collectives import Collective
from ..errors import GC3Error, IndexOutOfRangeError, InputError, PostconditionError, TraceError, UninitializedChunkError
from ..ir import PROTOCOLS
from ..ir.opcodes import COMPUTE, OPCODES
from .ops import Op, Slot
from ..ir.symbolic import Value, computed_chunk, describe, difference, input_chunk
from .topology import Topology, fully_connected
from .tracing import Buffer, _current, _tracing, canonical_buffer  # noqa: F401  (Buffer: the DSL's name)
from ..units import as_int, user_location


Key = Tuple[int, str, int]       # (rank, canonical buffer, index) of one chunk


def _check_sizes(coll: Collective, where: str) -> None:
    """Buffer sizes within gc3.limits before anything is allocated per chunk."""
    total = 0
    for r in range(coll.num_ranks):
        for what, size in (("input", coll.input_size(r)), ("output", coll.output_size(r))):
            if size > limits.MAX_CHUNKS:
                raise TraceError(f"{where}: {coll!r}: rank {r}'s {what} has {size} chunks, more than "
                                 f"gc3.limits.MAX_CHUNKS={limits.MAX_CHUNKS}")
            total += size
    if total > limits.MAX_TOTAL_CHUNKS:
        raise TraceError(f"{where}: {coll!r} has {total} chunks over all ranks, more than "
                         f"gc3.limits.MAX_TOTAL_CHUNKS={limits.MAX_TOTAL_CHUNKS}")


class GC3Program:
    def __init__(self, name: str, collective: Collective, topology: Optional[Topology] = None,
                 instances: int = 1, protocol: str = "Simple", instr_fusion: bool = True):
        where = user_location()
        if not isinstance(collective, Collective):
            raise TraceError(f"{where}: collective must be a gc3.collectives.Collective, got {collective!r}")
        if topology is None:
            topology = fully_connected(collective.num_ranks)
        if not isinstance(topology, Topology):
            raise TraceError(f"{where}: topology must be a gc3.topology.Topology, got {topology!r}")
        if topology.num_ranks != collective.num_ranks:
            raise TraceError(f"{where}: topology {topology.name} has {topology.num_ranks} ranks "
                             f"but the collective has {collective.num_ranks}")
        if protocol not in PROTOCOLS:
            raise TraceError(f"{where}: protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
        instances = as_int(instances, "instances", 1, where, high=limits.MAX_INSTANCES, limit="MAX_INSTANCES")
        _check_sizes(collective, where)
        self.name = name
        self.collective = collective
        self.topology = topology
        self.num_ranks = collective.num_ranks
        # What lowering reads: tracing only adds checked ops to it.
        self.chunk_dag = ChunkDAG(name, collective, instances=instances, protocol=protocol,
                                  instr_fusion=instr_fusion)
        self.where = where
        self._values: Dict[Key, Value] = {}
        self._versions: Dict[Key, int] = {}
        self._writers: Dict[Key, str] = {}
        self._parallel: Optional[Tuple[int, int]] = None   # (factor, group id)
        self._groups = 0
        for j, key in input_slots(collective):
            self._values[key] = input_chunk(key[0], j)

    # --- context ------------------------------------------------------------
    def __enter__(self) -> "GC3Program":
        if _tracing.current is not None:
            raise TraceError(f"{user_location()}: program {_tracing.current.name!r} (opened at "
                             f"{_tracing.current.where}) is still being traced; programs do not nest")
        _tracing.current = self
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _tracing.current = None
        if exc_type is None and _tracing.recorded is not None:
            _tracing.recorded.append(self)

    def __repr__(self) -> str:
        return f"GC3Program({self.name!r}, {self.collective!r}, {len(self.ops)} ops)"

    # --- what the chunk DAG holds ------------------------------------------------
    @property
    def ops(self) -> List[Op]:
        return self.chunk_dag.ops

    @property
    def sources(self) -> List[Key]:
        return self.chunk_dag.sources

    @property
    def scratch_sizes(self) -> Dict[int, Dict[str, int]]:
        return self.chunk_dag.scratch_sizes

    @property
    def instances(self) -> int:
        return self.chunk_dag.instances

    @property
    def protocol(self) -> str:
        return self.chunk_dag.protocol

    @property
    def instr_fusion(self) -> bool:
        return self.chunk_dag.instr_fusion

    # --- addressing -------------------------------------------------------------
    def locate(self, rank, buffer, index, count: int, where: str) -> Tuple[int, str, int]:
        """User (rank, buffer, index) of a `count`-chunk run -> canonical (rank, buffer, index)."""
        r = self.rank(rank, where)
        buf = canonical_buffer(buffer, where)
        idx = self.topology.flatten(index, "index", where)
        count = as_int(count, "count", 1, where)
        if idx < 0:
            raise IndexOutOfRangeError(f"{where}: index {idx} of (rank {r}, {buf!r}) is negative")
        if idx + count > limits.MAX_CHUNKS:
            raise IndexOutOfRangeError(f"{where}: (rank {r}, {buf!r}, {idx}) with count {count} reaches past "
                                       f"gc3.limits.MAX_CHUNKS={limits.MAX_CHUNKS} chunks per buffer")
        if buf in ("i", "o"):
            size = self.collective.size(r, buf)
            if idx + count > size:
                span = f"{idx}" if count == 1 else f"{idx}:{idx + count}"
                raise IndexOutOfRangeError(
                    f"{where}: (rank {r}, {buf!r}, {span}) is outside the buffer's {size} chunks "
                    f"({self.collective!r})")
            buf, idx = self.collective.alias(r, buf, idx)
        return r, buf, idx

    def rank(self, rank, where: str) -> int:
        r = self.topology.flatten(rank, "rank", where)
        if not 0 <= r < self.num_ranks:
            raise IndexOutOfRangeError(f"{where}: rank {rank!r} is outside [0, {self.num_ranks})")
        return r

    def keys(self, slot: Slot):
        return [(slot.rank, slot.buffer, i) for i in slot.indices()]

    def require_data(self, slot: Slot, where: str, role: str, written=None) -> None:
        """`written`: the user's (buffer, index) of slot's first chunk, named too when in place moved it."""
        for key in self.keys(slot):
            if key not in self._values:
                alias = ""
                if written is not None and written != (slot.buffer, slot.index):
                    buf, idx = written[0], written[1] + key[2] - slot.index
                    alias = f" (the in-place alias of ({key[0]}, {buf!r}, {idx}))"
                raise UninitializedChunkError(
                    f"{where}: {role} chunk (rank {key[0]}, {key[1]!r}, {key[2]}){alias} holds no data yet")

    def versions(self, slot: Slot) -> Tuple[int, ...]:
        return tuple(self._versions.get(k, 0) for k in self.keys(slot))

    def value(self, key: Key) -> Optional[Value]:
        return self._values.get(key)

    def snapshot(self) -> Dict[Key, Value]:
        """Every chunk that holds data, by (rank, canonical buffer, index)."""
        return dict(self._values)

    def writer(self, key: Key) -> str:
        return self._writers.get(key, "")

    def ref(self, slot: Slot, where: str) -> ChunkRef:
        return ChunkRef(self, slot.rank, slot.buffer, slot.index, slot.count, self.versions(slot), where)

    # --- applying operations ------------------------------------------------------
    def record(self, kind: str, src: Slot, dst: Slot, ch, sendtb, recvtb, where: str, compute=None) -> Op:
        parallel, group = self._parallel if self._parallel else (1, None)
        if kind in COMPUTE and OPCODES[kind].local_in:    # agemm: block j of C from the A block j read
            w = self.collective.rows_per_chunk
            src_values = [computed_chunk(dst.rank, compute.col0 // w + k, kind) for k in range(dst.count)]
            kind_applied = "copy"
        elif kind in COMPUTE:   # src repeats dst; the values are the computed blocks of the split axis
            first = compute.col0 // self.collective.per_chunk
            block = self.collective.compute.block_chunk
            src_values = [computed_chunk(dst.rank, block(first + k), kind) for k in range(dst.count)]
            kind_applied = "copy"
        else:
            src_values = [self._values[k] for k in self.keys(src)]
            kind_applied = kind
        for k, v in zip(self.keys(dst), src_values):
            self._values[k] = v if kind_applied == "copy" else self._values[k] + v
            self._versions[k] = self._versions.get(k, 0) + 1
            self._writers[k] = where
        return self.chunk_dag.add(kind, src, dst, ch=ch, sendtb=sendtb, recvtb=recvtb,
                                  parallel=parallel, parallel_group=group, where=where, compute=compute)

    def next_scratch_index(self, rank: int, buffer: str) -> int:
        return self.chunk_dag.scratch_sizes[rank].get(buffer, 0)

    # --- parallelize ---------------------------------------------------------------
    def begin_parallel(self, n: int, where: str) -> None:
        if self._parallel is not None:
            raise TraceError(f"{where}: parallelize blocks do not nest")
        self._parallel = (n, self._groups)
        self._groups += 1

    def end_parallel(self) -> None:
        self._parallel = None

    # --- verification ------------------------------------------------------------
    def check(self) -> bool:
        """Raise PostconditionError at the first output chunk that differs from the collective's."""
        coll = self.collective
        for r in range(self.num_ranks):
            for j in range(coll.output_size(r)):
                expected = coll.postcondition(r, j)
                if expected is None:
                    continue
                buf, idx = coll.alias(r, "o", j)
                got = self._values.get((r, buf, idx))
                if got == expected:
                    continue
                alias = "" if (buf, idx) == ("o", j) else f" (in place: stored at {buf!r} {idx})"
                detail = f" [{difference(expected, got)}]" if got is not None else ""
                last = self._writers.get((r, buf, idx))
                written = f"; last written at {last}" if last else ""
                raise PostconditionError(
                    f"program {self.name!r} does not implement {coll.name}: output chunk (rank {r}, 'o', {j})"
                    f"{alias} should hold {expected} but holds {describe(got)}{detail}{written}")
        return True


# --- the DSL's free functions ----------------------------------------------------
def chunk(rank, buffer, index, count: int = 1, *, size: Optional[int] = None) -> ChunkRef:
    """A reference to `count` contiguous chunks (msccl-tools' `size=` is accepted too)."""
    where = user_location()
    prog = _current("chunk()")
    if size is not None:
        count = size
    r, buf, idx = prog.locate(rank, buffer, index, count, where)
    slot = Slot(r, buf, idx, count)
    prog.require_data(slot, where, "referenced",
                      (canonical_buffer(buffer, where), prog.topology.flatten(index, "index", where)))
    return prog.ref(slot, where)


def gemv(rank, buffer, index, count: int = 1, *, cols: Optional[int] = None, sendtb=None) -> ChunkRef:
    """Compute chunks (rank, buffer, index..index+count-1) as rank's partial product:
    the column blocks `cols..cols+count-1` of x_rank @ w_rank (default `cols`:
    `index`, the output chunks those columns end up in), under a fused
    collective (`gc3.collectives.GemvAllReduce`).  Returns a reference to the
    computed chunks, to send, reduce or copy like any other."""
    return _compute("gemv", "gemv()", "GemvAllReduce", rank, buffer, index, count, cols, "cols", sendtb)


def embedding_bag(rank, buffer, index, count: int = 1, *, rows: Optional[int] = None, sendtb=None) -> ChunkRef:
    """Compute chunks (rank, buffer, index..index+count-1) as rank's pooled embedding
    bags (sum over each bag, every table of the rank) of the sample blocks
    `rows..rows+count-1` of the global batch, b/c samples a block (default `rows`:
    `index`, the input chunk those samples are in), under a fused collective
    (`gc3.collectives.EmbeddingBagAllToAll`): block p*c + i is samples
    p*b + i*b/c .., the ones rank p receives.  Returns a reference to the computed
    chunks, to send or copy like any other."""
    return _compute("ebag", "embedding_bag()", "EmbeddingBagAllToAll", rank, buffer, index, count, rows, "rows",
                    sendtb)


def gemm(rank, buffer, index, count: int = 1, *, rows: Optional[int] = None, a: Optional[ChunkRef] = None,
         sendtb=None) -> ChunkRef:
    """Compute chunks (rank, buffer, index..index+count-1) as row blocks `rows..rows+count-1`
    of rank's product a_rank @ b_rank (default `rows`: `index`, the input chunk those rows
    are), under a fused GEMM collective (`gc3.collectives.GemmReduceScatter`,
    `GemmAllReduce`, `GemmAllToAll`).  Returns a reference to the computed chunks, to send,
    reduce or copy like any other.

    With `a` (under `gc3.collectives.AllGatherGemm`): the A row blocks are the chunks `a`
    holds on `rank` (the ones that arrived), and the rows are whichever blocks they hold: an
    `agemm` step, which waits for those chunks only."""
    if a is not None:
        return _gemm_of_chunk(rank, buffer, index, count, a, rows, sendtb)
    return _compute("gemm", "gemm()", "GemmReduceScatter", rank, buffer, index, count, rows, "rows", sendtb)


def _gemm_of_chunk(rank, buffer, index, count, a: ChunkRef, rows, sendtb) -> ChunkRef:
    from .chunk_ref import _schedule_hint
    from ..ir import ComputeArgs

    where = user_location()
    prog = _current("gemm()")
    coll = prog.collective
    if getattr(coll, "compute", None) is None or coll.compute.op != "agemm":
        raise TraceError(f"{where}: gemm(a=...) needs gc3.collectives.AllGatherGemm; {coll!r} is not one")
    if rows is not None:
        raise TraceError(f"{where}: gemm(a=...) computes the rows its A chunks hold; rows= cannot be given")
    count = as_int(count, "count", 1, where)
    r, buf, idx = prog.locate(rank, buffer, index, count, where)
    if not isinstance(a, ChunkRef) or a.rank != r or a.count != count:
        raise TraceError(f"{where}: gemm(a=...) needs {count} chunk(s) of A on rank {r}, got {a!r}")
    a._require_fresh(where)
    src = Slot(a.rank, a.buffer, a.index, a.count)
    blocks = []
    for key in prog.keys(src):
        v = prog.value(key)
        if v is None or len(v.terms) != 1 or len(v.terms[0]) != 2:
            raise TraceError(f"{where}: gemm(a=...) reads chunk {key} holding {describe(v)}; it must hold one A "
                             f"row block as the caller gave it")
        p, i = v.terms[0]
        blocks.append(p * coll.chunk_factor + i)
    if blocks != list(range(blocks[0], blocks[0] + count)):
        raise TraceError(f"{where}: gemm(a=...) reads A blocks {blocks}; they must be consecutive")
    w = coll.rows_per_chunk
    dst = Slot(r, buf, idx, count)
    prog.record("agemm", src, dst, None, _schedule_hint("sendtb", sendtb, where), None, where,
                compute=ComputeArgs(coll.compute.step_inputs, blocks[0] * w, (blocks[0] + count) * w))
    return prog.ref(dst, where)


def _compute(op: str, fn: str, coll_name: str, rank, buffer, index, count, first, first_name: str,
             sendtb) -> ChunkRef:
    """The compute producers' one mechanism: dst chunks <- the operator's split-axis blocks
    first..first+count-1 (the collective's input chunk indices), as one `op` step."""
    from .chunk_ref import _schedule_hint
    from ..ir import ComputeArgs

    where = user_location()
    prog = _current(fn)
    coll = prog.collective
    if getattr(coll, "compute", None) is None or coll.compute.op != op:
        raise TraceError(f"{where}: {fn} needs a fused collective that declares a {op} operator "
                         f"(gc3.collectives.{coll_name}); {coll!r} declares none")
    count = as_int(count, "count", 1, where)
    r, buf, idx = prog.locate(rank, buffer, index, count, where)
    first = prog.topology.flatten(index, "index", where) if first is None else as_int(first, first_name, 0, where)
    if first + count > coll.blocks:
        raise IndexOutOfRangeError(f"{where}: {op} {coll.compute.split()[0]} blocks {first}:{first + count} are "
                                   f"outside the operator's {coll.blocks} blocks")
    col0, col1 = coll.span(first, count)
    dst = Slot(r, buf, idx, count)
    prog.record(op, dst, dst, None, _schedule_hint("sendtb", sendtb, where), None, where,
                compute=ComputeArgs(coll.compute.step_inputs, col0, col1))
    return prog.ref(dst, where)


@contextmanager
def parallelize(n: int):
    """Ops traced inside are marked for splitting into `n` parallel instances by lowering."""
    where = user_location()
    prog = _current("parallelize()")
    n = as_int(n, "parallelize(n): n", 1, where)
    prog.begin_parallel(n, where)
    try:
        yield
    finally:
        prog.end_parallel()


def Check() -> bool:
    """Raise PostconditionError unless the traced program implements its collective; True otherwise."""
    return _current("Check()").check()


def int_args(argv: Optional[Sequence[str]] = None, **defaults: int) -> List[int]:
    """A program script's positional int arguments (sys.argv[1:] by default), named and
    defaulted by `defaults` in order: `n, cf = int_args(ranks=4, chunk_factor=1)`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    names = list(defaults)
    if len(argv) > len(names):
        raise InputError(f"{user_location()}: expected at most {len(names)} arguments ({' '.join(names)}), "
                       f"got {len(argv)}: {' '.join(map(str, argv))}")
    values = []
    for k, name in enumerate(names):
        if k >= len(argv):
            values.append(defaults[name])
            continue
        try:
            values.append(int(argv[k]))
        except ValueError:
            raise InputError(f"{user_location()}: argument {name} must be an int, got {argv[k]!r}") from None
    return values


def _user_frame(tb, path: Path) -> str:
    """file:line of the innermost frame of traceback `tb` in the user's script (else the script)."""
    where = str(path)
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            where = f"{path}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def run_script(path, argv: Sequence[str] = ()) -> GC3Program:
    """Run a gc3 program file as __main__ with sys.argv = [path, *argv]; return the last program it traced."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such program file")
    if path.suffix != ".py":
        raise InputError(f"{path}: expected a gc3 DSL program (FILE.py); an XML IR is read by "
                         f"`gc3 check`, `gc3 show` and `gc3 simulate`")
    if _tracing.current is not None or _tracing.recorded is not None:
        raise TraceError(f"{path}: cannot run a script while another program is being traced")
    saved_argv = sys.argv
    sys.argv = [str(path), *map(str, argv)]
    _tracing.recorded = []
    try:
        runpy.run_path(str(path), run_name="__main__")
    except GC3Error:
        raise
    except SyntaxError as exc:
        raise InputError(f"{exc.filename}:{exc.lineno}: not valid Python: {exc.msg}") from None
    except Exception as exc:
        # The user's own bug: say where in their file, without a traceback of gc3's.
        raise InputError(f"{_user_frame(exc.__traceback__, path)}: the program raised "
                         f"{type(exc).__name__}: {exc}") from None
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise InputError(f"{path}: the program exited with status {exit_.code!r} "
                           f"(arguments: {' '.join(map(str, argv)) or 'none'})") from None
    finally:
        recorded = _tracing.recorded
        _tracing.recorded = None
        _tracing.current = None
        sys.argv = saved_argv
    if not recorded:
        raise InputError(f"{path}: the script traced no GC3Program (is its `with GC3Program(...)` block "
                       f"reached when run as __main__?)")
    return recorded[-1]
