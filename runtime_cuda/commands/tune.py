"""`gc3 tune`: write the drop-in's algorithm catalog from predicted or measured times.

    gc3 tune --model-only --ranks 4 -o catalog.json            # cost model, no GPU
    GC3_CONFIG=catalog.json python train.py                    # the drop-in uses it

The candidates, the size grid and the catalog writer are runtime_cuda.nccl.tune;
only the timer differs between the modes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from gc3.errors import GC3Error

from .bench import _colls, _size


def _collectives(ctx, param, value):
    return _colls(ctx, param, value) if value else None     # none given: every collective (bench: allreduce)


@click.command("tune")
@click.option("--model-only", is_flag=True, help="predict times with the simulator's cost model (no GPU)")
@click.option("--ranks", type=int, help="rank count to tune for (--model-only)")
@click.option("--nodes", type=int, default=1, show_default=True, help="nodes the ranks span (ranks = nodes x GPUs)")
@click.option("--cost", default="h200", show_default=True, help="cost-model preset (gc3 simulate --cost)")
@click.option("--quick", is_flag=True, help="a small grid (instances 1 and 4; Simple and LL) and sizes x64 apart")
@click.option("-c", "--collective", "collectives", multiple=True, callback=_collectives,
              help="collective(s), comma-separated or repeated, or all (default: all)")
@click.option("-b", "--minbytes", default="1K", callback=_size, show_default=True, help="smallest size")
@click.option("-e", "--maxbytes", default="1G", callback=_size, show_default=True, help="largest size")
@click.option("-f", "--stepfactor", type=int, help="multiply the size by this each step [default: 4; --quick 64]")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="catalog JSON to write")
@click.option("--ir-dir", type=click.Path(file_okay=False), help="folder for the IR files [default: beside -o]")
def command(model_only, ranks, nodes, cost, quick, collectives, minbytes, maxbytes, stepfactor, output, ir_dir):
    """Choose, per collective, placement and size, the fastest gc3 algorithm and
    write the catalog the NCCL drop-in loads (GC3_CONFIG=FILE)."""
    from gc3.simulator.cost_config import PRESETS
    from runtime_cuda.nccl import library, perf, tune

    if not model_only:
        raise click.UsageError("measured tuning runs on GPUs under mpirun and is not available yet; "
                               "use --model-only --ranks N for a catalog from the cost model")
    if ranks is None:
        raise click.UsageError("--model-only needs --ranks N")
    if cost not in PRESETS:
        raise click.BadParameter(f"unknown preset {cost!r}; known: {', '.join(PRESETS)}", param_hint="--cost")
    out = Path(output)
    if out.suffix.lower() != ".json":
        raise click.BadParameter(f"{output}: the catalog is written as JSON; name it *.json", param_hint="-o")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise click.BadParameter(f"{output}: folder {out.parent} does not exist", param_hint="-o")
    try:
        tune.check_shape(ranks, nodes)
        sizes = perf.sweep(minbytes, maxbytes, stepfactor or (tune.QUICK_SIZE_FACTOR if quick else tune.SIZE_FACTOR))
    except (GC3Error, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    if not library.ALGORITHMS:
        raise click.UsageError(f"no algorithm library at {library.ALGORITHMS_DIR} (it ships with a checkout "
                               "of gc3, not with an installed wheel)")
    colls = tune.applicable(ranks, nodes, collectives or tune.COLLECTIVES)
    if not colls:
        raise click.UsageError(f"no algorithm in the library for {', '.join(collectives or tune.COLLECTIVES)} on {ranks} ranks"
                               + (f" and {nodes} nodes" if nodes > 1 else ""))
    grid = tune.QUICK if quick else tune.FULL
    timer = tune.ModelTimer(cost, ranks, nodes)

    def progress(line):
        click.echo(line, err=True)
        sys.stderr.flush()

    results = tune.tune(ranks, nodes, colls, sizes, grid, timer, progress)
    words = ["gc3 tune --model-only", f"--ranks {ranks}"] + ([f"--nodes {nodes}"] if nodes > 1 else []) + \
        [f"--cost {cost}"] + (["--quick"] if quick else [])
    prov = tune.provenance(timer, ranks, nodes, sizes, grid, results, " ".join(words))
    catalog = tune.write_catalog(results, out, ranks, prov, Path(ir_dir) if ir_dir else None)
    for line in tune.summary(results):
        click.echo(line)
    click.echo(f"wrote {output}: {len(catalog['algorithms'])} entries, "
               f"{len({e['file'] for e in catalog['algorithms']})} IR files ({prov['nccl']})")
