"""`gc3 bench`: nccl-tests' table for gc3 and NCCL side by side.

    mpirun -np 2 gc3 bench -c allreduce,alltoall -b 8 -e 256M -f 4 --json out.json --plot out.png

One process per GPU.  The gc3 side is `runtime_cuda.nccl.NcclCommunicator`, so
it runs whatever the catalog selects (GC3_XML_FILES, GC3_CONFIG, ...; `--xml`
sets GC3_XML_FILES for convenience) and NCCL where nothing matches; the last
column names what served each size.  The NCCL side is cupy.cuda.nccl.

`--peer symmetric` adds NCCL on symmetric windows (NCCL >= 2.27; one GPU per
rank) as a third side, NCCL-sym, in the same run: its own communicator and its
own buffers from ncclMemAlloc, registered with NCCL_WIN_COLL_SYMMETRIC
(runtime_cuda/nccl/symmetric.py); gc3 and default NCCL keep ordinary CuPy
buffers, and the speedup is shown against both NCCLs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gc3.dtypes import DTYPES
from gc3.errors import GC3Error
from runtime_cuda import measured_file
from runtime_cuda.fused.choice import OPS

_COLLS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
_DTYPES = tuple(DTYPES)


def _size(ctx, param, value):
    from gc3.units import parse_size
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _colls(ctx, param, value):
    names = [c.strip() for c in ",".join(value).split(",") if c.strip()] or ["allreduce"]
    if names == ["all"]:
        return list(_COLLS)
    bad = [c for c in names if c not in _COLLS]
    if bad:
        raise click.BadParameter(f"unknown collective(s) {', '.join(bad)}; choose from {', '.join(_COLLS)} or all")
    return names


FUSED_OPS = OPS
FUSED_RECORD = "fused.txt"   # in the repository's measured/ folder (runtime_cuda.measured_file)


def fused_op_names(value: str, param: str) -> list:
    names = [o.strip() for o in value.split(",") if o.strip()]
    if names == ["all"]:
        return list(FUSED_OPS)
    bad = [o for o in names if o not in FUSED_OPS]
    if bad or not names:
        raise click.BadParameter(f"unknown operator(s) {', '.join(bad) or '(none)'}; choose from "
                                 f"{', '.join(FUSED_OPS)} or all", param_hint=param)
    return names


def fused_runtime(what: str):
    """The torch-side benchmark module, or exit 2 naming what this machine lacks."""
    try:
        import torch
        from runtime_cuda.torch_dist import bench_fused
    except ImportError as exc:
        raise click.UsageError(f"{what} needs torch, cupy and CUDA GPUs ({exc})") from None
    if not torch.cuda.is_available():
        raise click.UsageError(f"{what} needs CUDA GPUs, one per process; torch sees no GPU here")
    return bench_fused


def check_shapes(names, quick: bool, shapes) -> None:
    """A --shape that names no shape of the grid is refused before anything starts (with no GPU
    too; without torch, fused_runtime says what is missing)."""
    if not shapes:
        return
    try:
        from runtime_cuda.torch_dist import bench_fused
    except ImportError:
        return
    try:
        bench_fused.cases(names, quick, shapes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shape") from None


def _fused(ops: str, quick: bool, chunks, record: Path, iters: int, rounds: int, plot_path, report: bool,
           shapes=()) -> None:
    from runtime_cuda.fused import records

    names = fused_op_names(ops, "--ops")
    if not report:
        check_shapes(names, quick, shapes)
        bench_fused = fused_runtime("gc3 bench --fused")
        failed = bench_fused.bench(names, quick, record, iters, rounds, chunks, click.echo, shapes)
        if failed:
            raise click.ClickException(f"{failed} shape(s) failed the check against the fp32 reference")
        if os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != "0":
            return
    try:
        rows = [r for r in records.read(record) if r["op"] in names]
    except OSError as exc:
        raise click.BadParameter(f"{record}: cannot read ({exc.strerror})", param_hint="--record") from None
    except GC3Error as exc:
        raise click.BadParameter(str(exc), param_hint="--record") from None
    if report:
        click.echo(records.markdown(rows))
    if plot_path is not None and rows:
        records.plot(rows, plot_path, title=f"gc3 fused operators against matmul + NCCL ({record.name})")
        click.echo(f"wrote {plot_path}")


def impl_names(impl: str, peer: str):
    """The sides of the table, in column order, for --impl and --peer."""
    names = ("gc3", "nccl") if impl == "both" else (impl,)
    return names + ("nccl-sym",) if peer == "symmetric" else names


@click.command("bench")
@click.option("-c", "--collective", "collectives", multiple=True, callback=_colls,
              help="collective(s), comma-separated or repeated: " + ", ".join(_COLLS) + ", or all")
@click.option("-b", "--minbytes", default="8", callback=_size, show_default=True, help="smallest size")
@click.option("-e", "--maxbytes", default="32M", callback=_size, show_default=True, help="largest size")
@click.option("-f", "--stepfactor", default=2, show_default=True, help="multiply the size by this each step")
@click.option("-i", "--stepbytes", default="0", callback=_size, help="add this each step instead (nccl-tests -i)")
@click.option("-d", "--dtype", type=click.Choice(_DTYPES), default="float32", show_default=True)
@click.option("-o", "--op", type=click.Choice(("sum", "prod", "max", "min", "avg")), default="sum", show_default=True)
@click.option("-r", "--root", default=0, show_default=True, help="root of broadcast and reduce")
@click.option("-w", "--warmup", "warmup", default=5, show_default=True, help="untimed calls per case")
@click.option("-n", "--iters", default=20, show_default=True, help="timed calls per round")
@click.option("-R", "--rounds", default=3, show_default=True,
              help="timed rounds of --iters calls back to back per case; the case's time is the median round")
@click.option("--graph", "graph_max", default="0", callback=_size, show_default=True,
              help="also time CUDA-graph replay (a graph of 100 calls, and a graph of one) for sizes up to this")
@click.option("--warm-s", default=0.5, show_default=True,
              help="seconds of untimed calls before each implementation's first case (clocks ramp up)")
@click.option("--hang-s", default=60.0, show_default=True,
              help="a case (one implementation, size and placement) still running after this many seconds "
                   "ends the run with status 3, naming it (0: wait forever)")
@click.option("--check/--no-check", default=True, show_default=True, help="compare every output element (#wrong)")
@click.option("--impl", type=click.Choice(("both", "gc3", "nccl")), default="both", show_default=True)
@click.option("--peer", type=click.Choice(("default", "symmetric")), default="default", show_default=True,
              help="symmetric: also time NCCL on ncclMemAlloc'd buffers registered as symmetric windows "
                   "(NCCL >= 2.27, one GPU per rank), as an extra NCCL-sym column")
@click.option("--xml", "xml_files", multiple=True, type=click.Path(), help="IR file(s) to add to GC3_XML_FILES")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="write the rows as CSV (rank 0)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the rows as JSON (rank 0)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="PNG of busbw vs size (rank 0)")
@click.option("--fused", is_flag=True, help="time the fused operators instead (torch; under torchrun or mpirun, "
              "one process per GPU) against matmul + NCCL and PyTorch's symm_mem ops; a line per shape goes to "
              "--record")
@click.option("--ops", "fused_ops", default="all", show_default=True,
              help="--fused: operators, comma-separated: " + ", ".join(FUSED_OPS) + ", or all")
@click.option("--quick", is_flag=True, help="--fused: a third of the shape grid")
@click.option("--chunks", type=click.IntRange(1, 64), help="--fused: the fused path's chunk count "
              "[default: the measured table's, else runtime_cuda.fused.choice.DEFAULT_CHUNKS]")
@click.option("--shape", "shapes", multiple=True, metavar="OP[:FIELD=VALUE,...]",
              help="--fused: only the grid's shapes this names, e.g. gemm_ar:M=8192,K=53248 or "
              "ar_epilogue:bytes=16777216,dtype=bfloat16 (the fields of the op's record line); repeatable")
@click.option("--record", type=click.Path(dir_okay=False), default=None,
              help="--fused: measured-lines file to append to [default: measured/fused.txt at the repository root]")
@click.option("--report", is_flag=True, help="--fused: measure nothing; print --record's lines as a markdown table "
              "(and draw --plot)")
def command(collectives, minbytes, maxbytes, stepfactor, stepbytes, dtype, op, root, warmup, iters, rounds,
            graph_max, warm_s, hang_s, check, impl, peer, xml_files, csv_path, json_path, plot_path,
            fused, fused_ops, quick, chunks, shapes, record, report):
    """Measure collectives like nccl-tests, gc3 beside NCCL (run under mpirun -np N)."""
    if report and not fused:
        raise click.UsageError("--report reads the fused operators' record: use it with --fused")
    if shapes and (report or not fused):
        raise click.UsageError("--shape picks the fused operators' shapes to measure: use it with --fused, "
                               "without --report")
    if fused:
        try:
            path = Path(record) if record else measured_file(FUSED_RECORD)
        except GC3Error as exc:
            raise click.BadParameter(str(exc), param_hint="--record") from None
        return _fused(fused_ops, quick, chunks, path, iters, rounds, Path(plot_path) if plot_path else None, report,
                      shapes)
    from runtime_cuda.nccl import perf

    try:
        sizes = perf.sweep(minbytes, maxbytes, stepfactor, stepbytes)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if xml_files:
        os.environ["GC3_XML_FILES"] = ":".join(list(xml_files) + [os.environ.get("GC3_XML_FILES", "")]).rstrip(":")
    try:
        import cupy  # noqa: F401
        from runtime_cuda.nccl import bench_gpu, perf_gpu
    except ImportError as exc:
        # exit 2, as `gc3 run` without a GPU: the environment cannot be used, nothing is wrong
        from gc3.cli._common import fail
        from gc3.errors import InputError
        fail("gc3 bench", InputError(f"needs cupy with NCCL and a GPU ({exc})"))
    impls = impl_names(impl, peer)
    if rounds < 1 or iters < 1:
        raise click.UsageError(f"--rounds ({rounds}) and --iters ({iters}) must be at least 1")
    cfg = perf_gpu.BenchConfig(collectives, sizes, dtype, op, root, warmup, iters, check, impls, hang_s,
                               rounds=rounds, graph_max=graph_max, warm_s=warm_s)
    host = perf_gpu.Host()
    if not 0 <= root < host.size:
        raise click.UsageError(f"--root {root} is not a rank of {host.size}")
    lead = host.rank == 0
    current = [None]

    def report(row):
        if not lead:
            return
        if current[0] != row.coll:
            current[0] = row.coll
            click.echo("\n".join(perf.header(row.coll, host.size, dtype, op, impls)))
        click.echo(perf.format_row(row, impls))
        for line in perf.graph_details(row, impls):
            click.echo(line)
        for line in perf.wrong_details(row):
            click.echo(line)
        sys.stdout.flush()

    try:
        rows = bench_gpu.run_bench(cfg, host, report)
    except GC3Error as exc:
        raise click.ClickException(str(exc)) from None
    if not lead:
        return
    click.echo("\n".join(perf.footer(rows, impls)))
    meta = {"nranks": host.size, "dtype": dtype, "op": op, "root": root, "warmup": warmup, "iters": iters,
            "rounds": rounds, "graph_max": graph_max, "warm_s": warm_s,
            "impls": list(impls), "peer": peer, "GC3_XML_FILES": os.environ.get("GC3_XML_FILES", ""),
            "GC3_CONFIG": os.environ.get("GC3_CONFIG", "")}
    if csv_path:
        perf.write_csv(rows, Path(csv_path))
    if json_path:
        perf.write_json(rows, Path(json_path), meta)
    if plot_path:
        perf.plot(rows, Path(plot_path), title=f"gc3 bench, {host.size} ranks")
    if any((m.wrong or 0) for r in rows for side in r.results.values() for m in side.values()):
        raise click.ClickException("some outputs were wrong (#wrong > 0)")
