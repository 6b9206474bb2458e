"""`gc3 simulate x.xml`: run an XML IR on the CPU, check it against numpy, time it."""
from __future__ import annotations

import click

from ..dtypes import DTYPES, OPS
from ..errors import GC3Error
from ._common import existing_file, fail, output_path
from ._progress import Progress, quiet_option
from ..simulator.cost_config import DEFAULT, PRESETS


@click.command("simulate", context_settings={"ignore_unknown_options": True})
@click.argument("file", type=click.Path(dir_okay=False), callback=existing_file)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--size", default=None,
              help="Bytes of each rank's input buffer: 4096, 64K, 1MiB, 1.5MB ... [default: 1MiB; a fused "
                   "IR's own output size]")
@click.option("--count", type=click.IntRange(min=0), default=None,
              help="Elements of each rank's input buffer (instead of --size).")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default=None,
              help="[default: float32; a fused IR's own dtype]")
@click.option("--op", type=click.Choice(sorted(OPS)), default="sum", show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the input data.")
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="FIFO slots per connection (default: gc3.limits.FIFO_SLOTS for the protocol).")
@click.option("--inplace/--out-of-place", default=None,
              help="Call in place or out of place (default: as the program declares).")
@click.option("--root", type=click.IntRange(min=0), default=None,
              help="Root rank of broadcast/reduce (default: a DSL program's own root; 0 for XML).")
@click.option("--interleave-seed", type=click.IntRange(min=0), default=None,
              help="Schedule threadblocks in a seeded random order instead of round-robin.")
@click.option("--cost", "cost", type=click.Choice(sorted(PRESETS)), default=DEFAULT, show_default=True,
              help="Cost-model preset: h200 is calibrated on nvidia-h200-x2 (NVLink); h100 is derived from it, "
                   "uncalibrated.")
@click.option("--timeline", type=click.Path(dir_okay=False), default=None,
              help="Draw the predicted per-threadblock timeline into this image.")
@click.option("--unproven", is_flag=True,
              help="Run a custom collective whose IR has no <postcondition>: structure, deadlocks and races are "
                   "still checked, its outputs cannot be (nothing is proven).")
@quiet_option
def command(file: str, args, size, count, dtype, op, seed, slots, inplace, root, interleave_seed, cost,
            timeline, unproven) -> None:
    """Execute an XML IR (or a DSL program FILE.py [ARGS], lowered first) on numpy
    buffers of every rank; check outputs, report deadlocks and races, predict time.

    Memory is estimated from the IR and the size before anything is allocated, and a run
    over GC3_SIM_MAX_BYTES (default 8 GiB) is refused.
    Exit status: 0 correct; 1 wrong (outputs, deadlock, races); 2 an input that cannot be used."""
    from ..simulator import load_program, simulate
    from ..simulator.driver import program_root

    try:
        output_path(timeline, "--timeline")
        with Progress("simulate") as progress:
            if file.endswith(".py"):
                from ..dsl.program import run_script
                progress.phase(f"running {file}")
                source = run_script(file, list(args))
            elif args:
                raise click.UsageError(f"unexpected arguments {' '.join(args)} (only a DSL program FILE.py takes them)")
            else:
                source = file
            if root is None:
                root = program_root(source)
            progress.phase("lowering" if file.endswith(".py") else "reading the IR")
            prog = load_program(source)
            res = simulate(prog, size=size if count is None else None, count=count, dtype=dtype, op=op, seed=seed,
                           slots=slots, inplace=inplace, root=root, interleave_seed=interleave_seed, cost=cost,
                           unproven=unproven, progress=progress)
    except GC3Error as exc:
        fail(file, exc)
    except MemoryError as exc:
        # the estimate was too low for this machine: still a size the user must lower, as for the limit
        click.echo(f"{file}: FAILED: not enough memory to simulate every rank's buffers ({exc}); "
                   f"use a smaller --size or --count", err=True)
        raise SystemExit(2)
    click.echo(res.summary())
    if timeline:
        if res.timing is None:
            click.echo(f"timeline   not drawn: the run did not complete", err=True)
        else:
            click.echo(f"timeline   {res.draw_timeline(timeline)}")
    if not res.ok:
        raise SystemExit(1)
