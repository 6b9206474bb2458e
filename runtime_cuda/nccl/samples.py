"""The shipped catalog: the algorithm samples compiled into ir_samples/*.xml and their
index.json, as `gc3 catalog build` writes them (`gc3 catalog build --check`: exit 1 if
the folder differs from what it would write).

Each sample is an algorithm of gc3.algorithms with fixed arguments, instances
and protocol, plus the message sizes it is recommended for.  index.json
follows the schema in runtime_cuda/nccl/catalog.py; the NCCL-replacement
layer takes the first entry, in file order, that serves a call, so the size
ranges of entries with the same collective, rank count and placement do not
overlap.  The 2 nodes x 4 GPUs samples come after the single-node 8-rank ones
and so serve no call from this index: on a two-node cluster, list them first
in a GC3_CONFIG file.  Output is byte-for-byte deterministic.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from gc3.ir.xml_io import to_xml
from gc3.verify import verify

from .catalog import DEFAULT_INDEX
from .library import args as A, compile_program  # arguments by name

# Where the drop-in reads the sample index from: a checkout's ir_samples/, else a wheel's copy.
SAMPLES_DIR = DEFAULT_INDEX.parent
KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Sample:
    file: str                     # ir_samples/<file>.xml
    algorithm: str                # gc3.algorithms.<algorithm>
    args: Tuple[int, ...]         # its positional arguments (built by name: runtime_cuda.nccl.library.args)
    instances: int
    protocol: str
    min_bytes: int                # recommended sizes, nccl-tests' "size" (the larger user buffer)
    max_bytes: Optional[int]      # None: no upper bound
    oop: bool = True              # an in-place IR also serves out-of-place calls (after a copy)
    fusion: bool = True           # False: compiled without instruction fusion (gc3.lower's instr_fusion)


S = Sample
SAMPLES: Tuple[Sample, ...] = (
    # 2 ranks, from measurements on 2x H200 (NV18): `gc3 tune --quick` (measured/
    # tune_2xH200_2026-11-23/) for the small sizes, where its grid has the winners, and the
    # 64-instance Simple programs above 1-2 MiB, and the 16-instance LL ones to 256 KiB, which its
    # grid lacks, from the sweep
    # (measured/sweep_2xh200_2026-11-22_rows.txt) and `gc3 bench` in the same
    # session.  Between the two, NCCL wins and no entry covers the size.  In-place and
    # out-of-place calls have their own winners here, so in-place IRs serve only in-place calls.
    S("allreduce_oneshot_2r_LL_i16", *A("allreduce_oneshot", ranks=2), 16, "LL", 0, 256 * KiB),
    # The ring from 2 MiB, out of place (the rank's own input chunk added into its output by the
    # first reduction, so no copy of the whole input first) and in place.  Fused (each channel's
    # send, receive-reduce-send and receive in one block: 64 blocks) up to 128 MiB; unfused above
    # (sends and receives in blocks of their own: 128 blocks, as the reducescatter and allgather
    # programs have), which 2x H200 measured faster from 256 MiB (1 GiB in place: 2979 us against
    # 3111 fused and NCCL's 3313) and slower to 64 MiB (211 against 202 us).
    S("allreduce_ring_2r_Simple_i64", *A("allreduce_ring", ranks=2, inplace=0), 64, "Simple", 2 * MiB, 128 * MiB),
    S("allreduce_ring_2r_inplace_Simple_i64", *A("allreduce_ring", ranks=2, inplace=1), 64, "Simple", 2 * MiB,
      128 * MiB, oop=False),
    S("allreduce_ring_2r_Simple_i64_unfused", *A("allreduce_ring", ranks=2, inplace=0), 64, "Simple",
      128 * MiB + 1, None, fusion=False),
    S("allreduce_ring_2r_inplace_Simple_i64_unfused", *A("allreduce_ring", ranks=2, inplace=1), 64, "Simple",
      128 * MiB + 1, None, oop=False, fusion=False),
    S("allgather_recursive_doubling_2r_inplace_LL", *A("allgather_recursive_doubling", ranks=2, chunks=1, inplace=1),
      1, "LL", 0, 4 * KiB, oop=False),
    S("allgather_direct_2r_inplace_LL", *A("allgather_direct", ranks=2, chunks=1, inplace=1), 1, "LL", 4 * KiB + 1,
      32 * KiB, oop=False),
    S("allgather_direct_2r_inplace_LL_i16", *A("allgather_direct", ranks=2, chunks=1, inplace=1), 16, "LL",
      32 * KiB + 1, 256 * KiB, oop=False),
    S("allgather_direct_2r_inplace_Simple_i64", *A("allgather_direct", ranks=2, chunks=1, inplace=1), 64, "Simple",
      256 * KiB + 1, None, oop=False),
    S("allgather_direct_2r_LL", *A("allgather_direct", ranks=2), 1, "LL", 0, 4 * KiB),
    S("allgather_recursive_doubling_2r_LL_i4", *A("allgather_recursive_doubling", ranks=2), 4, "LL",
      4 * KiB + 1, 64 * KiB),
    S("allgather_direct_2r_LL_i16", *A("allgather_direct", ranks=2), 16, "LL", 64 * KiB + 1, 256 * KiB),
    S("allgather_direct_2r_Simple_i64", *A("allgather_direct", ranks=2), 64, "Simple", 256 * KiB + 1, None),
    S("reducescatter_ring_2r_inplace_LL", *A("reducescatter_ring", ranks=2, chunks=1, inplace=1), 1, "LL", 0, 4 * KiB,
      oop=False),
    S("reducescatter_direct_2r_inplace_LL_i4", *A("reducescatter_direct", ranks=2, chunks=1, inplace=1), 4, "LL",
      4 * KiB + 1, 64 * KiB, oop=False),
    S("reducescatter_ring_2r_inplace_LL_i16", *A("reducescatter_ring", ranks=2, chunks=1, inplace=1), 16, "LL",
      64 * KiB + 1, 256 * KiB, oop=False),
    S("reducescatter_ring_2r_inplace_Simple_i64", *A("reducescatter_ring", ranks=2, chunks=1, inplace=1), 64, "Simple",
      1 * MiB, None, oop=False),
    S("reducescatter_direct_2r_LL_i4", *A("reducescatter_direct", ranks=2), 4, "LL", 0, 4 * KiB),
    S("reducescatter_ring_2r_LL_i4", *A("reducescatter_ring", ranks=2), 4, "LL", 4 * KiB + 1, 64 * KiB),
    S("reducescatter_ring_2r_LL_i16", *A("reducescatter_ring", ranks=2), 16, "LL", 64 * KiB + 1, 256 * KiB),
    S("reducescatter_ring_2r_Simple_i64", *A("reducescatter_ring", ranks=2), 64, "Simple", 1 * MiB, None),
    S("alltoall_direct_2r_LL_i16", *A("alltoall_direct", ranks=2), 16, "LL", 0, 256 * KiB),
    S("alltoall_direct_2r_Simple_i64", *A("alltoall_direct", ranks=2), 64, "Simple", 256 * KiB + 1, None),
    # In place through scratch (one local copy more): NCCL has no in-place all-to-all, so its peer
    # is the same send/recv group behind a full staging copy (0.67-1.00x for gc3 routing there).
    S("alltoall_direct_2r_inplace_LL_i16", *A("alltoall_direct", ranks=2, chunks=1, inplace=1), 16, "LL", 0,
      256 * KiB, oop=False),
    S("alltoall_direct_2r_inplace_Simple_i64", *A("alltoall_direct", ranks=2, chunks=1, inplace=1), 64, "Simple",
      256 * KiB + 1, None, oop=False),
    # 4 ranks
    S("allreduce_oneshot_4r_LL", *A("allreduce_oneshot", ranks=4), 1, "LL", 0, 16 * KiB),
    S("allreduce_allpairs_4r_LL", *A("allreduce_allpairs", ranks=4), 1, "LL", 16 * KiB + 1, 256 * KiB),
    S("allreduce_ring_4r_Simple_i2", *A("allreduce_ring", ranks=4, inplace=0), 2, "Simple", 256 * KiB + 1, None),
    S("allreduce_ring_4r_inplace_Simple_i2", *A("allreduce_ring", ranks=4, inplace=1), 2, "Simple", 256 * KiB + 1,
      None, oop=False),
    S("allgather_ring_4r_Simple", *A("allgather_ring", ranks=4), 1, "Simple", 0, None),
    S("reducescatter_ring_4r_inplace_Simple", *A("reducescatter_ring", ranks=4, chunks=1, inplace=1), 1, "Simple", 0, None),
    S("alltoall_direct_4r_LL", *A("alltoall_direct", ranks=4), 1, "LL", 0, None),
    # 8 ranks on one node
    S("allreduce_oneshot_8r_LL", *A("allreduce_oneshot", ranks=8), 1, "LL", 0, 16 * KiB),
    S("allreduce_allpairs_8r_LL", *A("allreduce_allpairs", ranks=8), 1, "LL", 16 * KiB + 1, 256 * KiB),
    S("allreduce_recursive_doubling_8r_Simple", *A("allreduce_recursive_doubling", ranks=8), 1, "Simple",
      256 * KiB + 1, 2 * MiB),
    S("allreduce_ring_8r_Simple", *A("allreduce_ring", ranks=8, inplace=0), 1, "Simple", 2 * MiB + 1, 32 * MiB),
    S("allreduce_ring_8r_inplace_Simple", *A("allreduce_ring", ranks=8, inplace=1), 1, "Simple", 2 * MiB + 1,
      32 * MiB, oop=False),
    S("allreduce_ring_8r_Simple_i4", *A("allreduce_ring", ranks=8, inplace=0), 4, "Simple", 32 * MiB + 1, None),
    S("allreduce_ring_8r_inplace_Simple_i4", *A("allreduce_ring", ranks=8, inplace=1), 4, "Simple", 32 * MiB + 1,
      None, oop=False),
    S("allgather_direct_8r_LL", *A("allgather_direct", ranks=8), 1, "LL", 0, 256 * KiB),
    S("allgather_recursive_doubling_8r_Simple", *A("allgather_recursive_doubling", ranks=8), 1, "Simple",
      256 * KiB + 1, 4 * MiB),
    S("allgather_ring_8r_Simple_i2", *A("allgather_ring", ranks=8), 2, "Simple", 4 * MiB + 1, None),
    S("allgather_direct_8r_inplace_Simple", *A("allgather_direct", ranks=8, chunks=1, inplace=1), 1, "Simple", 0, None),
    S("reducescatter_direct_8r_LL", *A("reducescatter_direct", ranks=8), 1, "LL", 0, 256 * KiB),
    S("reducescatter_recursive_halving_8r_Simple", *A("reducescatter_recursive_halving", ranks=8), 1, "Simple",
      256 * KiB + 1, 4 * MiB),
    S("reducescatter_ring_8r_Simple_i2", *A("reducescatter_ring", ranks=8), 2, "Simple", 4 * MiB + 1, None),
    S("alltoall_direct_8r_Simple", *A("alltoall_direct", ranks=8), 1, "Simple", 0, None),
    S("broadcast_tree_8r_LL", *A("broadcast_tree", ranks=8, chunks=1), 1, "LL", 0, 256 * KiB),
    S("broadcast_ring_8r_Simple", *A("broadcast_ring", ranks=8, chunks=4), 1, "Simple", 256 * KiB + 1, None),
    S("reduce_ring_8r_Simple", *A("reduce_ring", ranks=8, chunks=4), 1, "Simple", 0, None),
    # 2 nodes x 4 GPUs (shadowed by the 8-rank entries above; see the module docstring)
    S("allreduce_hierarchical_2x4_Simple", *A("allreduce_hierarchical", nodes=2, gpus=4), 1, "Simple", 0, 32 * MiB),
    S("allreduce_hierarchical_2x4_Simple_i2", *A("allreduce_hierarchical", nodes=2, gpus=4), 2, "Simple", 32 * MiB + 1, None),
    S("alltoall_two_step_2x4_LL", *A("alltoall_two_step", nodes=2, gpus=4), 1, "LL", 0, 1 * MiB),
    S("alltoall_three_step_2x4_Simple", *A("alltoall_three_step", nodes=2, gpus=4), 1, "Simple", 1 * MiB + 1, None),
)


# Fused programs (compute steps), compiled with their default arguments: written for
# reading and for the GPU side, but not indexed, since no NCCL call can be served by them.
FUSED: Tuple[str, ...] = ("gemm_reducescatter", "allgather_gemm", "gemm_allreduce", "gemm_alltoall")


def compile_fused(name: str):
    from gc3 import algorithms, lower

    prog = lower(algorithms.trace(f"fused.{name}"))
    verify(prog)
    return prog


def compile_sample(sample: Sample):
    """(traced GC3Program, verified ir.Program named after the sample's file, with its size range)."""
    traced, prog = compile_program(sample.algorithm, sample.args, sample.instances, sample.protocol,
                                   fusion=sample.fusion)
    prog = dataclasses.replace(prog, name=sample.file, minBytes=sample.min_bytes,
                               maxBytes=sample.max_bytes if sample.max_bytes is not None else prog.maxBytes)
    verify(prog)
    return traced, prog


def index_entry(sample: Sample, traced, prog) -> dict:
    entry = {"file": f"{sample.file}.xml", "collective": prog.coll, "ranks": prog.ngpus,
             "inplace": prog.inplace, "protocol": prog.proto, "min_bytes": sample.min_bytes,
             "max_bytes": sample.max_bytes}
    if prog.inplace:
        # An in-place IR can serve out-of-place calls too: the runtime first copies
        # the input into the output's aliased region (as MSCCL does).
        entry["outofplace"] = sample.oop
    if traced.collective.root is not None:
        entry["root"] = traced.collective.root
    return entry


# The dedicated small-message allreduce kernels (runtime_cuda/ranks/small_allreduce.py) lead the index
# at these rank counts, ahead of the IR allreduces, up to KERNEL_TOP: one-shot up to the size
# where the cost model's two-shot becomes cheaper, two-shot from there.  2 ranks: measured on
# 2x H200 (2026-11-23, one block per 4 KiB up to 128): one-shot beats NCCL and the ring up to
# 2 MiB; 4 and 8 ranks were not measured, so they keep the kernels' default range.
KERNEL_RANKS: Tuple[int, ...] = (2, 4, 8)
KERNEL_TOP = {2: 2 << 20}
# The one-shot allgather and reducescatter, where measured: 2x H200 (2026-11-24, through the
# drop-in, measured/bench_agrs_kernel_2xh200_2026-11-24.txt) 1.02-2.9x the faster
# NCCL eager and 1.07-2.1x NCCL-sym replayed from graphs at 1 KiB-2 MiB (the IR programs
# there, LL and Simple: 0.6-0.8x NCCL-sym from graphs).  They lead the index, so the 2-rank
# allgather and reducescatter IRs serve from 2 MiB up.
GATHER_SCATTER_TOP = {2: 2 << 20}


def kernel_entries(ranks: int) -> List[dict]:
    from gc3 import limits
    from gc3.simulator.cost_config import preset
    from gc3.simulator.small_allreduce import small_allreduce_seconds

    cfg, top = preset(), KERNEL_TOP.get(ranks, limits.SMALL_ALLREDUCE_DEFAULT_BYTES)
    sizes = [1 << k for k in range(10, top.bit_length())]   # 1 KiB .. the kernels' limit
    two = [b for b in sizes if small_allreduce_seconds("twoshot", b, ranks, cfg)
           < small_allreduce_seconds("oneshot", b, ranks, cfg)]
    cut = two[0] // 2 if two else top
    base = {"collective": "allreduce", "ranks": ranks, "inplace": True, "outofplace": True}
    entries = [dict(base, kernel="oneshot", min_bytes=0, max_bytes=cut)]
    if cut < top:
        entries.append(dict(base, kernel="twoshot", min_bytes=cut + 1, max_bytes=top))
    if ranks in GATHER_SCATTER_TOP:
        entries += [dict(base, collective=c, kernel="oneshot", min_bytes=0, max_bytes=GATHER_SCATTER_TOP[ranks])
                    for c in ("allgather", "reducescatter")]
    return entries


def generate(out_dir: Path) -> List[Path]:
    """Write every sample and index.json into `out_dir`; remove stale *.xml there. Returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written, entries = [], [e for r in KERNEL_RANKS for e in kernel_entries(r)]
    for sample in SAMPLES:
        # An IR listed twice (different ranges in and out of place) carries the union of its ranges.
        same = [s for s in SAMPLES if s.file == sample.file]
        union = dataclasses.replace(sample, min_bytes=min(s.min_bytes for s in same),
                                    max_bytes=None if None in [s.max_bytes for s in same]
                                    else max(s.max_bytes for s in same))
        traced, prog = compile_sample(union)
        path = out_dir / f"{sample.file}.xml"
        if path not in written:
            path.write_text(to_xml(prog))
            written.append(path)
        entries.append(index_entry(sample, traced, prog))
    for name in FUSED:
        path = out_dir / f"{name}.xml"
        path.write_text(to_xml(compile_fused(name)))
        written.append(path)
    index = out_dir / "index.json"
    index.write_text(json.dumps({"version": 1, "algorithms": entries}, indent=2) + "\n")
    written.append(index)
    for stale in sorted(set(out_dir.glob("*.xml")) - set(written)):
        stale.unlink()
    return written


def differences(committed: Path) -> List[str]:
    """What differs between `committed` and a fresh generation, one line per file."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        names = sorted({p.name for p in fresh.iterdir()} | {p.name for p in committed.glob("*.xml")}
                       | ({"index.json"} if (committed / "index.json").exists() else set()))
        out = []
        for name in names:
            a, b = committed / name, fresh / name
            if not a.exists():
                out.append(f"{name}: missing from {committed}")
            elif not b.exists():
                out.append(f"{name}: in {committed} but no longer generated")
            elif a.read_bytes() != b.read_bytes():
                out.append(f"{name}: differs from what `gc3 catalog build` writes now")
        return out
