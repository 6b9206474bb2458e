"""The 2-rank program configurations the runtime's sweep times (runtime_cuda.benchmarks.runtime_sweep,
run as scripts/bench_runtime.py, times each against NCCL at the sizes it serves), and what
`gc3 calibrate --from-sweep` reads a sweep row's program from: a row names its candidate by
collective and label.  Rows of a committed sweep keep naming these, so a candidate that was
measured is not renamed or removed while its rows are in measured/ (the calibration test
rebuilds the CSV from them)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class ProgramConfig:
    """One configuration timed: a program of gc3.algorithms, its protocol and instances, the sizes it
    serves and the environment it runs with."""
    label: str
    coll: str
    script: str                      # gc3.algorithms.<script>
    argv: Tuple[str, ...]
    proto: str
    instances: int
    lo: int                          # serves sizes lo..hi (nccl-tests bytes)
    hi: int
    env: Tuple[Tuple[str, str], ...] = field(default=())
    fusion: bool = True              # rrc+s -> rrcs etc. (off: sends and receives in separate blocks)


def _c(label, coll, script, argv, proto, inst, lo, hi, fusion=True, **env):
    return ProgramConfig(label, coll, script, tuple(argv), proto, inst, lo, hi, tuple(sorted(env.items())), fusion)


SPLIT = "4:65536"        # >= 4 tiles per chunk, tiles >= 64 KiB
SPLIT_FINE = "4:16384"   # >= 4 tiles per chunk, tiles >= 16 KiB
BIG = 1 << 40
CANDIDATES: Tuple[ProgramConfig, ...] = (
    # allreduce, small: one-shot (1 hop) vs all-pairs (2 hops)
    _c("allpairs-LL-i4", "allreduce", "allreduce_allpairs", ["2"], "LL", 4, 0, 256 * KiB),
    _c("oneshot-LL-i1", "allreduce", "allreduce_oneshot", ["2"], "LL", 1, 0, 64 * KiB),
    _c("oneshot-LL-i4", "allreduce", "allreduce_oneshot", ["2"], "LL", 4, 0, 1 * MiB),
    _c("oneshot-LL-i16", "allreduce", "allreduce_oneshot", ["2"], "LL", 16, 16 * KiB, 1 * MiB),
    _c("oneshot-LL-i32", "allreduce", "allreduce_oneshot", ["2"], "LL", 32, 64 * KiB, 1 * MiB),
    _c("ring-S-i32", "allreduce", "allreduce_ring", ["2"], "Simple", 32, 256 * KiB, BIG),
    _c("ring-S-i64", "allreduce", "allreduce_ring", ["2"], "Simple", 64, 256 * KiB, BIG),
    _c("ring-S-i64-split", "allreduce", "allreduce_ring", ["2"], "Simple", 64, 256 * KiB, BIG,
       GC3_TILE_SPLIT_SIMPLE=SPLIT),
    # Unfused, each channel's sends and receives get blocks of their own (128 per rank at 64
    # instances, as the reducescatter and allgather programs have) instead of one block doing both.
    _c("ring-S-i64-nofuse", "allreduce", "allreduce_ring", ["2"], "Simple", 64, 256 * KiB, BIG, fusion=False),
    _c("ring-S-i32-nofuse", "allreduce", "allreduce_ring", ["2"], "Simple", 32, 256 * KiB, BIG, fusion=False),
    _c("ring-S-i32-1M", "allreduce", "allreduce_ring", ["2"], "Simple", 32, 16 * MiB, BIG,
       GC3_SLOT_BYTES_SIMPLE=str(1 << 20), GC3_TILE_SPLIT_SIMPLE=SPLIT),
    _c("ring-LL128-i16", "allreduce", "allreduce_ring", ["2"], "LL128", 16, 256 * KiB, 64 * MiB),
    _c("ring-LL128-i64", "allreduce", "allreduce_ring", ["2"], "LL128", 64, 256 * KiB, BIG),
    _c("oneshot-LL128-i32", "allreduce", "allreduce_oneshot", ["2"], "LL128", 32, 256 * KiB, 4 * MiB),
    # reducescatter: direct (receive into scratch, then reduce) vs ring (reduce straight from the FIFO)
    _c("direct-LL-i4", "reducescatter", "reducescatter_direct", ["2"], "LL", 4, 0, 256 * KiB),
    _c("ring-LL-i1", "reducescatter", "reducescatter_ring", ["2"], "LL", 1, 0, 64 * KiB),
    _c("ring-LL-i4", "reducescatter", "reducescatter_ring", ["2"], "LL", 4, 0, 1 * MiB),
    _c("ring-LL-i16", "reducescatter", "reducescatter_ring", ["2"], "LL", 16, 16 * KiB, 1 * MiB),
    _c("direct-S-i32", "reducescatter", "reducescatter_direct", ["2"], "Simple", 32, 256 * KiB, BIG),
    _c("ring-S-i32", "reducescatter", "reducescatter_ring", ["2"], "Simple", 32, 256 * KiB, BIG),
    _c("ring-S-i64", "reducescatter", "reducescatter_ring", ["2"], "Simple", 64, 256 * KiB, BIG),
    _c("ring-S-i64-split", "reducescatter", "reducescatter_ring", ["2"], "Simple", 64, 256 * KiB, BIG,
       GC3_TILE_SPLIT_SIMPLE=SPLIT),
    _c("ring-LL128-i16", "reducescatter", "reducescatter_ring", ["2"], "LL128", 16, 256 * KiB, 64 * MiB),
    _c("ring-LL128-i64", "reducescatter", "reducescatter_ring", ["2"], "LL128", 64, 256 * KiB, BIG),
    # alltoall and allgather: direct, more or fewer channels
    _c("direct-LL-i1", "alltoall", "alltoall_direct", ["2"], "LL", 1, 0, 64 * KiB),
    _c("direct-LL-i4", "alltoall", "alltoall_direct", ["2"], "LL", 4, 0, 1 * MiB),
    _c("direct-LL-i16", "alltoall", "alltoall_direct", ["2"], "LL", 16, 16 * KiB, 1 * MiB),
    _c("direct-S-i32", "alltoall", "alltoall_direct", ["2"], "Simple", 32, 256 * KiB, BIG),
    _c("direct-S-i64", "alltoall", "alltoall_direct", ["2"], "Simple", 64, 256 * KiB, BIG),
    _c("direct-S-i64-split", "alltoall", "alltoall_direct", ["2"], "Simple", 64, 256 * KiB, BIG,
       GC3_TILE_SPLIT_SIMPLE=SPLIT),
    _c("direct-LL-i1", "allgather", "allgather_direct", ["2"], "LL", 1, 0, 64 * KiB),
    _c("direct-LL-i4", "allgather", "allgather_direct", ["2"], "LL", 4, 0, 1 * MiB),
    _c("direct-LL-i16", "allgather", "allgather_direct", ["2"], "LL", 16, 16 * KiB, 1 * MiB),
    _c("direct-S-i32", "allgather", "allgather_direct", ["2"], "Simple", 32, 256 * KiB, BIG),
    _c("direct-S-i64", "allgather", "allgather_direct", ["2"], "Simple", 64, 256 * KiB, BIG),
    _c("direct-S-i64-split", "allgather", "allgather_direct", ["2"], "Simple", 64, 256 * KiB, BIG,
       GC3_TILE_SPLIT_SIMPLE=SPLIT),
    _c("direct-S-i64-fine", "allgather", "allgather_direct", ["2"], "Simple", 64, 256 * KiB, BIG,
       GC3_TILE_SPLIT_SIMPLE=SPLIT_FINE),
    _c("direct-S-i32-fine", "allgather", "allgather_direct", ["2"], "Simple", 32, 256 * KiB, BIG,
       GC3_TILE_SPLIT_SIMPLE=SPLIT_FINE),
    _c("direct-LL128-i16", "allgather", "allgather_direct", ["2"], "LL128", 16, 256 * KiB, 64 * MiB),
    _c("direct-LL128-i64", "allgather", "allgather_direct", ["2"], "LL128", 64, 256 * KiB, BIG),
)


def compile_candidate(c: ProgramConfig):
    """The lowered program a candidate runs, compiled as `gc3 tune` compiles its variants."""
    from .nccl.library import compile_program

    return compile_program(c.script, c.argv, c.instances, c.proto, fusion=c.fusion)[1]
