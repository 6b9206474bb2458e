"""The lowering pipeline: a Chunk DAG -> a scheduled `gc3.ir.Program`.

Lowering reads a `ChunkDAG` (`gc3/dsl/chunk_dag.py`) and nothing else of the
DSL, so a traced program (`GC3Program.chunk_dag`) and one built by other means
compile alike.  `PASSES` names the stages in the order they run, each a
function from one structure to the next:

    ChunkDAG --plan_buffers--> BufferPlan
    ChunkDAG, BufferPlan --build--> InstrDAG --absorb--> InstrDAG --fuse--> InstrDAG --replicate--> InstrDAG
        --channels--> ChannelAssignment --threadblocks--> BlockSchedule [--merge_lone_pairs--> BlockSchedule]
        --sync--> [ir.Gpu] --(`lower`)--> ir.Program

`absorb` and `fuse` are the optional optimizations (`instr_fusion`; absorption
can also be turned off alone): without them the program lowers as traced.
`merge_lone_pairs` runs for LL unless `tb_merge=False`.

Channels and threadblocks schedule the first instance only; `sync` stamps the
other instances onto their own channels and chunks (see `replication.py`).

The result uses gc3's operand convention (every operand local, see
`gc3.ir.Convention`) and is marked with `gc3version`.  Input and output sizes
come from the collective's declared chunk counts times the replication factor,
never from the indices the program happens to touch, so `gc3/ir/layout.py` maps
every chunk of a call exactly as the program meant.  Scratch is the declared
size too, except that after absorption it is cut to the chunks the program
still names (`buffers.fit_scratch`).

A collective's epilogue goes last, on the steps that store final output chunks;
which steps those are, only a symbolic run of the lowered program says, and
that run is the verifier's, a stage above this one.  So `lower` takes it as a
parameter (`place_epilogue`), and `gc3.toolchain.lower` (which is `gc3.lower`)
passes the verifier's: compile through that unless you bring your own.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from typing import Callable, Optional, Tuple

from .. import __version__, limits
from .absorption import absorb
from .channels import assign_channels
from ..errors import GC3Error, LoweringError, ScheduleError
from .fusion import fuse
from .instruction_dag import build_instr_dag
from ..dsl.chunk_dag import ChunkDAG
from ..ir.collectives import NCCL_COLLECTIVES, Collective
from ..ir import PROTOCOLS, Postcondition, Program
from ..ir.epilogue import Epilogue
from .buffers import fit_scratch, plan_buffers
from .replication import replicate
from .sync import insert_sync
from .threadblocks import assign_threadblocks, merge_lone_pairs

__all__ = ["lower", "MAX_BYTES", "PASSES", "Options"]

# maxBytes when the program sets none: any message (1 TiB) fits, and the value
# still fits the 64-bit fields both MSCCL runtimes parse it into.
MAX_BYTES = 1 << 40


@dataclass(frozen=True)
class Options:
    """What the passes are told: which optional ones run, and the runtime's limits."""

    fusion: bool
    absorption: bool
    tb_merge: bool
    slots: int          # FIFO slots of a connection (the protocol's)
    max_tbs: int


def _absorb(dag, o: Options):
    dag = absorb(dag)
    dag.plan = fit_scratch(dag.plan, dag)   # scratch only the absorbed steps used
    return dag


# (name, pass, runs when): the passes in the order they run.
PASSES: Tuple[Tuple[str, Callable, Callable[[Options], bool]], ...] = (
    ("absorb", _absorb, lambda o: o.fusion and o.absorption),
    ("fuse", lambda dag, o: fuse(dag), lambda o: o.fusion),
    ("replicate", lambda dag, o: replicate(dag, dag.plan), lambda o: True),
    ("channels", lambda dag, o: assign_channels(dag), lambda o: True),
    ("threadblocks", lambda ca, o: assign_threadblocks(ca, slots=o.slots, max_tbs=o.max_tbs), lambda o: True),
    ("merge_lone_pairs", lambda sched, o: merge_lone_pairs(sched), lambda o: o.tb_merge),
)


def schedule(dag, o: Options):
    """The Instruction DAG through every pass of `PASSES` that `o` turns on."""
    for _, run, on in PASSES:
        if on(o):
            dag = run(dag, o)
    return dag


def lower(program, *, instances: Optional[int] = None, protocol: Optional[str] = None,
          instr_fusion: Optional[bool] = None, max_tbs: Optional[int] = None,
          absorption: Optional[bool] = None, tb_merge: Optional[bool] = None,
          place_epilogue: Optional[Callable[[Program, Epilogue], object]] = None) -> Program:
    """Compile a `ChunkDAG`, or a traced `GC3Program`'s; keyword arguments override its own settings.

    `absorption` (default: on whenever fusion is) can be turned off alone, to
    get the schedules compiled before it existed (measurements taken on them).
    `tb_merge` (default: on for LL) joins a channel's lone send and lone
    receive threadblocks (threadblocks.merge_lone_pairs).
    `place_epilogue(prog, epilogue)` marks the steps of the plain `prog` that must
    apply the collective's epilogue; needed only when the collective has one.
    """
    dag = program if isinstance(program, ChunkDAG) else getattr(program, "chunk_dag", None)
    if not isinstance(dag, ChunkDAG):
        raise LoweringError(f"lower() compiles a gc3.dsl.chunk_dag.ChunkDAG or a traced GC3Program, "
                            f"got {type(program).__name__}")
    k = dag.instances if instances is None else instances
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limits.MAX_INSTANCES:
        raise LoweringError(f"instances must be an int in 1..{limits.MAX_INSTANCES} (gc3.limits.MAX_INSTANCES), "
                            f"got {k!r}")
    proto = dag.protocol if protocol is None else protocol
    if proto not in PROTOCOLS:
        raise LoweringError(f"protocol {proto!r} is not one of {', '.join(PROTOCOLS)}")
    fusion_on = dag.instr_fusion if instr_fusion is None else instr_fusion
    # LL serves small messages, where a call's time is latency: fewer blocks
    # and no progress flag between a send and the receive beside it.
    opts = Options(fusion=fusion_on, absorption=fusion_on if absorption is None else absorption,
                   tb_merge=proto == "LL" if tb_merge is None else tb_merge,
                   slots=limits.FIFO_SLOTS[proto], max_tbs=limits.MAX_TBS if max_tbs is None else max_tbs)
    coll = dag.collective
    if not dag.ops:
        raise LoweringError(f"program {dag.name!r} has no operations; nothing to compile")

    # The passes allocate many small objects and free none of them until the
    # end; the cycle collector would rescan them over and over (a third of the
    # run time on large programs) without finding anything to free.
    collecting = gc.isenabled()
    gc.disable()
    try:
        plan = plan_buffers(dag, k)
        compute = getattr(coll, "compute", None)
        if compute is not None and plan.factor > 1:
            # Replication splits each chunk into sub-chunks, but a compute step names whole
            # column blocks of y: the two would disagree.  Not needed for the first fused operators.
            raise LoweringError(f"program {dag.name!r}: a fused program compiles with instances=1 and no "
                                f"parallelize() for now (got {plan.instances} instance(s) x {plan.parallel})")
        for (r, buf), n in plan.declared.items():
            if n * plan.factor > limits.MAX_CHUNKS:
                raise LoweringError(
                    f"rank {r} buffer {buf!r}: {n} chunks x {plan.factor} (instances x parallelize) = "
                    f"{n * plan.factor} chunks, more than gc3.limits.MAX_CHUNKS={limits.MAX_CHUNKS}")
        try:
            sched = schedule(build_instr_dag(dag, plan), opts)
        except ScheduleError as first:
            # Fusion ties a receive connection to one send peer per channel;
            # with the user's ch=/sendtb=/recvtb= that can be impossible where
            # the unfused program schedules fine, and fusion is only an
            # optimization.
            if not opts.fusion:
                raise
            try:
                sched = schedule(build_instr_dag(dag, plan), replace(opts, fusion=False))
            except ScheduleError:
                raise first from None
        gpus = insert_sync(sched, sched.dag.plan)
    finally:
        if collecting:
            gc.enable()
    nchunks = max((max(g.i_chunks, g.o_chunks) for g in gpus), default=0)
    prog = Program(
        name=dag.name, proto=proto, nchannels=sched.nchannels, nchunksperloop=nchunks,
        ngpus=coll.num_ranks, coll=coll.name, inplace=coll.inplace, gpus=gpus,
        outofplace=not coll.inplace,
        minBytes=0, maxBytes=MAX_BYTES,
        gc3version=__version__,
        # The root travels in the IR so that its verifier and users need not guess it.
        extra={} if coll.root is None else {"root": str(coll.root)},
        postcondition=None if coll.name in NCCL_COLLECTIVES and not getattr(coll, "states_postcondition", False)
        else ir_postcondition(coll, sched.dag.plan),
        compute=getattr(coll, "compute", None),
    )
    if coll.epilogue is not None:
        if place_epilogue is None:
            raise LoweringError(f"program {prog.name!r}: the epilogue {coll.epilogue} goes on the steps that store "
                                f"final output chunks, which only the verifier finds: lower it with gc3.lower")
        try:
            place_epilogue(prog, coll.epilogue)
        except GC3Error as exc:
            raise LoweringError(f"program {prog.name!r}: cannot place the epilogue {coll.epilogue}: {exc}") from None
    return prog


def ir_postcondition(coll, plan) -> Optional[Postcondition]:
    """A custom collective's postcondition in the IR's chunks (replication's
    index mapping applied to every instance and sub-chunk), or None when the
    collective declares none: then verification refuses the IR."""
    if type(coll).postcondition is Collective.postcondition:
        return None
    post: Postcondition = {}
    for r in range(coll.num_ranks):
        for j in range(coll.output_size(r)):
            value = coll.postcondition(r, j)
            if value is None:
                continue
            for i in range(plan.instances):
                for u in range(plan.parallel):
                    # A compute leaf (rank, index, op) names the operator's block, not an input chunk.
                    post[(r, plan.index(r, "o", j, i, u))] = tuple(
                        (t[0], t[1] if len(t) > 2 else plan.index(t[0], "i", t[1], i, u)) for t in value.terms)
    return post
