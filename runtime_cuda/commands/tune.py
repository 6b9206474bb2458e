"""`gc3 tune`: write the drop-in's algorithm catalog from predicted or measured times.

    gc3 tune --model-only --ranks 4 -o catalog.json            # cost model, no GPU
    gc3 tune --model-only --ranks 4 -o c.json --plot c.png     # and a plot of what was chosen per size
    mpirun -np 4 gc3 tune --quick -o catalog.json              # measured, one rank per process
    mpirun -np 4 gc3 tune --time-budget 300 --install          # measured, cached for these GPUs' fingerprint
    GC3_CONFIG=catalog.json python train.py                    # the drop-in uses it

The candidates, the size grid and the catalog writer are runtime_cuda.nccl.tune;
only the timer differs between the modes.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from gc3.errors import GC3Error
from gc3.cli._progress import quiet, quiet_option

from .bench import _DTYPES, _colls, _size


# Set by mpirun (Open MPI, MPICH/Hydra, PMIx) or srun: measured tuning was launched as one of N processes.
_LAUNCHED_BY = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS")


def _collectives(ctx, param, value):
    return _colls(ctx, param, value) if value else None     # none given: every collective (bench: allreduce)


def writable(value: str, suffix: str, kind: str, hint: str) -> Path:
    """`value` as a path to write the `kind` to, checked before any work: its
    suffix is `suffix` and its folder exists (click's usage error otherwise)."""
    out = Path(value)
    if out.suffix.lower() != suffix:
        raise click.BadParameter(f"{value}: the {kind} is written as {suffix[1:].upper()}; name it *{suffix}",
                                 param_hint=hint)
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise click.BadParameter(f"{value}: folder {out.parent} does not exist", param_hint=hint)
    return out


def png_option(ctx, param, value):
    """click callback of a PNG to write (`--plot`, `gc3 catalog plot -o`)."""
    return None if value is None else writable(value, ".png", "plot", param.opts[0])


def choices_title(prov: dict) -> str:
    """The plot's title: what the catalog was tuned for, how it was timed, when."""
    links = (prov.get("topology") or {}).get("summary")
    how = (f"measured on {prov.get('device', '?')}" + (f" ({links})" if links else "") if prov.get("measured") else
           f"cost model {prov.get('cost_model', {}).get('preset', '?')}")
    return f"gc3 tune: {prov.get('ranks', '?')} ranks, {how}, {prov.get('date', '')[:10]}".rstrip(", ")


@click.command("tune")
@click.option("--model-only", is_flag=True, help="predict times with the simulator's cost model (no GPU)")
@click.option("--ranks", type=int, help="rank count to tune for (--model-only)")
@click.option("--nodes", type=int, default=1, show_default=True, help="nodes the ranks span (ranks = nodes x GPUs)")
@click.option("--cost", help="cost-model preset (gc3 simulate --cost) [default: runtime_cuda.nccl.tune.COST]")
@click.option("--quick", is_flag=True, help="a small grid (instances 1, 4, 16 and 64; Simple and LL; Simple at 64 also "
                                            "unfused where fusion changes it) and sizes x64 apart "
                                            "(measured: up to 16 MiB unless -e says otherwise)")
@click.option("-c", "--collective", "collectives", multiple=True, callback=_collectives,
              help="collective(s), comma-separated or repeated, or all (default: all)")
@click.option("-b", "--minbytes", default="1K", callback=_size, show_default=True, help="smallest size")
@click.option("-e", "--maxbytes", default=None, help="largest size [default: 1G; measured --quick: 16M]")
@click.option("-f", "--stepfactor", type=int, help="multiply the size by this each step [default: 4; --quick 64]")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="catalog JSON to write")
@click.option("--install", is_flag=True, help="measured: store the catalog in the cache for these GPUs' fingerprint "
                                              "(GC3_CACHE_DIR), where the drop-in finds it by default, instead of -o")
@click.option("--time-budget", type=float, default=0, show_default=True,
              help="seconds of measuring; the sizes not reached by then go to NCCL, listed as not measured "
                   "in the catalog's provenance (0: no budget)")
@click.option("--ir-dir", type=click.Path(file_okay=False), help="folder for the IR files [default: X.d/ beside -o X.json]")
@click.option("--prior", "prior_ratio", type=float, default=None,
              help="measured tunes: at each size, time only the candidates the cost model (--cost) predicts within "
                   "this factor of its fastest prediction (and its few fastest); 0 times every candidate "
                   "[default: runtime_cuda.nccl.tune.PRIOR_RATIO, with PRIOR_KEEP kept]")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=png_option,
              help="PNG of the chosen algorithm's time and its margin over NCCL per size (rank 0, after -o)")
@click.option("-d", "--dtype", type=click.Choice(_DTYPES), default=None,
              help="the element type candidates are timed in (the catalog serves every type; tune in the one your "
                   "calls use) [default: runtime_cuda.nccl.tune.DTYPE]")
@click.option("--graph-max", default=None, callback=lambda ctx, param, value: None if value is None else
              _size(ctx, param, value),
              help="measured: up to this size candidates rank by their time per call in a CUDA graph, and the best "
                   "of those whose eager time plus that beats NCCL's wins (0: eager only) "
                   "[default: runtime_cuda.nccl.tune.GRAPH_MAX]")
@click.option("--fused", is_flag=True, help="tune the fused operators instead (torch; under torchrun or mpirun, one "
              "process per GPU): per shape, the faster of the sequential and the fused path goes into the 'fused' "
              "section of -o (default: the catalog the drop-in serves on these GPUs), created or updated in "
              "place, which the fused operators' auto path reads")
@click.option("--ops", "fused_ops", default="all", show_default=True, help="--fused: operators, comma-separated, or all")
@click.option("--shape", "shapes", multiple=True, metavar="OP[:FIELD=VALUE,...]",
              help="--fused: only the grid's shapes this names (as gc3 bench --fused --shape), whose entries "
                   "replace theirs alone")
@quiet_option
def command(model_only, ranks, nodes, cost, quick, collectives, minbytes, maxbytes, stepfactor, output, install,
            time_budget, ir_dir, prior_ratio, plot_path, dtype, graph_max, fused, fused_ops, shapes):
    """Choose, per collective, placement and size, the fastest gc3 algorithm and
    write the catalog the NCCL drop-in loads (GC3_CONFIG=FILE)."""
    if fused and dtype is not None:
        raise click.UsageError("--dtype: the fused operators are tuned per shape in the dtype their grid names; "
                               "no --dtype with --fused")
    if shapes and not fused:
        raise click.UsageError("--shape picks the fused operators' shapes to tune: use it with --fused")
    if fused:
        from .bench import check_shapes, fused_op_names, fused_runtime
        names = fused_op_names(fused_ops, "--ops")
        check_shapes(names, quick, shapes)
        bench_fused = fused_runtime("gc3 tune --fused")
        try:
            bench_fused.tune(names, quick, Path(output) if output else None, 10, 3, click.echo, shapes)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
        return
    from gc3.simulator.cost_config import PRESETS
    from runtime_cuda.nccl import library, perf, tune

    maxbytes = _size(None, None, maxbytes or ("16M" if quick and not model_only else "1G"))
    if graph_max is not None and model_only:
        raise click.UsageError("--graph-max chooses how a measured tune times a call; the cost model prices "
                               "the GPU's time alone")
    graph_max = tune.GRAPH_MAX if graph_max is None else graph_max
    cost = cost or tune.COST
    dtype = dtype or tune.DTYPE
    if install and (model_only or output or ir_dir):
        raise click.UsageError("--install stores a measured catalog where the drop-in looks for it: "
                               "no --model-only, -o or --ir-dir with it")
    if not install and not output:
        raise click.UsageError("name the catalog to write with -o FILE (or --install it into the cache)")
    host = None
    if not model_only:
        if not any(v in os.environ for v in _LAUNCHED_BY):
            raise click.UsageError("measured tuning runs one rank per process under mpirun (mpirun -np N gc3 tune "
                                   "...; processes may share a GPU); without GPUs use --model-only --ranks N")
        from runtime_cuda.nccl.perf_gpu import Host

        host = Host()
        if host.size < 2:
            raise click.UsageError(f"measured tuning needs >= 2 processes (mpirun -np N), got {host.size}")
        if ranks is not None and ranks != host.size:
            raise click.UsageError(f"--ranks {ranks} but mpirun started {host.size} processes")
        ranks = host.size
    if ranks is None:
        raise click.UsageError("--model-only needs --ranks N")
    if cost not in PRESETS:
        raise click.BadParameter(f"unknown preset {cost!r}; known: {', '.join(PRESETS)}", param_hint="--cost")
    out = None if install else writable(output, ".json", "catalog", "-o")
    try:
        tune.check_shape(ranks, nodes)
        sizes = perf.sweep(minbytes, maxbytes, stepfactor or (tune.QUICK_SIZE_FACTOR if quick else tune.SIZE_FACTOR))
    except (GC3Error, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    if not library.ALGORITHMS:
        raise click.UsageError(f"no algorithm library at {library.ALGORITHMS_DIR}: the package gc3.algorithms "
                               "holds no algorithm (is gc3 installed whole?)")
    colls = tune.applicable(ranks, nodes, collectives or tune.COLLECTIVES)
    if not colls:
        raise click.UsageError(f"no algorithm in the library for {', '.join(collectives or tune.COLLECTIVES)} on {ranks} ranks"
                               + (f" and {nodes} nodes" if nodes > 1 else ""))
    grid = tune.QUICK if quick else tune.FULL
    if prior_ratio is not None and model_only:
        raise click.UsageError("--prior rules out candidates before measuring them; with --model-only the cost model "
                               "times every candidate itself")
    if prior_ratio is not None and not (prior_ratio == 0 or 1 <= prior_ratio <= 1000):
        raise click.BadParameter(f"{prior_ratio:g}: 0 (no prior) or a factor in 1..1000", param_hint="--prior")
    prior = None
    if not model_only and prior_ratio != 0:
        prior = tune.Prior(tune.ModelTimer(cost, ranks, nodes, dtype), ratio=prior_ratio or tune.PRIOR_RATIO)
    if host is None:
        timer = tune.ModelTimer(cost, ranks, nodes, dtype)
    else:
        from runtime_cuda.nccl.tune_gpu import MeasuredTimer

        timer = MeasuredTimer(host, max(sizes), dtype=dtype, graph_max=graph_max)
    lead = host is None or host.rank == 0     # measured: rank 0 speaks and writes
    held = contextlib.ExitStack()             # --install: the fingerprint's tuning lock, on rank 0
    if install:
        from runtime_cuda.nccl import machine

        if not host.bcast(held.enter_context(machine.tuning_lock(timer.fingerprint)) if lead else None):
            timer.close()
            raise click.UsageError(f"another process is tuning GPUs {timer.fingerprint} (it holds "
                                   f"{machine.lock_path(timer.fingerprint)})")

    # On a terminal the per-size lines (they start with "[k/n]") redraw one line, a progress bar with
    # the time left; elsewhere (a log, CI) each stays a line of its own.
    redraw = lead and sys.stderr.isatty()
    pending = [False]

    def progress(line):
        if not lead or quiet():
            return
        if redraw and line.startswith("["):
            click.echo("\r\033[K" + line, err=True, nl=False)
            pending[0] = True
        else:
            click.echo(("\n" if pending[0] else "") + line, err=True)
            pending[0] = False
        sys.stderr.flush()

    if time_budget < 0:
        raise click.BadParameter(f"{time_budget:g}: a time budget is >= 0 seconds", param_hint="--time-budget")
    budget = tune.Budget(time_budget, agree=(lambda spent: spent) if host is None else host.bcast)
    try:
        results = tune.tune(ranks, nodes, colls, sizes, grid, timer, progress, budget, prior)
    finally:
        if pending[0]:
            click.echo("", err=True)      # end the redrawn line
        if host is not None:
            timer.close()
    words = ["gc3 tune", "--model-only" if host is None else f"(mpirun -np {ranks})", f"--ranks {ranks}"] + \
        ([f"--nodes {nodes}"] if nodes > 1 else []) + ([f"--cost {cost}"] if host is None else []) + \
        (["--quick"] if quick else []) + ([f"--time-budget {time_budget:g}"] if time_budget else []) + \
        ([f"-d {dtype}"] if dtype != tune.DTYPE else []) + \
        ([f"--graph-max {graph_max}"] if host is not None and graph_max != tune.GRAPH_MAX else []) + \
        ([f"--prior {prior.ratio:g} --cost {cost}"] if prior is not None else [])
    prov = tune.provenance(timer, ranks, nodes, sizes, grid, results, " ".join(words), prior)
    if not lead:
        host.barrier()      # rank 0 writes the catalog
        return
    try:
        if install:
            path = machine.store(timer.fingerprint,
                                 lambda folder: _write(results, folder / machine.CATALOG, ranks, prov, None, "it"))
            click.echo(f"installed {path}: the drop-in serves it by default on GPUs {timer.fingerprint}")
        else:
            _write(results, out, ranks, prov, ir_dir, output)
        if plot_path is not None:
            perf.plot_choices(prov["choices"], plot_path, title=choices_title(prov))
            click.echo(f"wrote {plot_path}")
    finally:
        held.close()
        if host is not None:
            host.barrier()


def _write(results, out: Path, ranks: int, prov: dict, ir_dir, output: str) -> None:
    from runtime_cuda.nccl import tune

    # The IRs get a folder named after the catalog, so that a catalog written into /tmp or a project
    # folder does not scatter its dozens of IR files there.
    catalog = tune.write_catalog(results, out, ranks, prov, Path(ir_dir) if ir_dir else out.with_suffix(".d"))
    for line in tune.summary(results):
        click.echo(line)
    click.echo(f"wrote {output}: {len(catalog['algorithms'])} entries, "
               f"{len({e['file'] for e in catalog['algorithms'] if 'file' in e})} IR files ({prov['nccl']})")
    if prov["unmeasured"]:
        click.echo(f"time budget spent: {len(prov['unmeasured'])} (collective, placement, size) decisions left to "
                   "NCCL unmeasured (provenance 'unmeasured')")
    if prov.get("shippable") is False:
        click.echo(f"NOT SHIPPABLE: {prov['not_shippable']}")
    for label, why in sorted(prov.get("rejected", {}).items()):
        click.echo(f"rejected {label}: {why}", err=True)
