"""`gc3 catalog check FILE`: validate a catalog (JSON or XML) as the NCCL drop-in loads it.

The drop-in (`runtime_cuda.nccl`) is imported only when the command runs, as
`gc3 run` and `gc3 bench` import the runtime: the compiler never needs it.
"""
from __future__ import annotations

import click

from gc3.errors import EXIT_WRONG, GC3Error
from gc3.cli._common import fail


@click.group("catalog")
def command() -> None:
    """Algorithm catalogs of the NCCL drop-in (GC3_CONFIG, ir_samples/index.json)."""


@command.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
def check(file: str) -> None:
    """Load FILE exactly as the drop-in would (every entry's fields, every IR it
    lists, each IR proven by `gc3 check`); list what it would skip.
    Exit status: 0 every entry usable; 1 some entry skipped; 2 FILE unreadable."""
    from pathlib import Path

    from runtime_cuda.nccl.catalog import check_config

    try:
        good, problems = check_config(Path(file))
    except GC3Error as exc:      # the file itself: missing, not JSON/XML, wrong schema
        fail(file, exc)
    for c in good:
        click.echo(f"ok       {c.name}: {c.collective}, {c.ranks} ranks, {c.proto}, "
                   f"{c.min_bytes}..{'inf' if c.max_bytes is None else c.max_bytes} bytes")
    for p in problems:
        click.echo(f"skipped  {p}", err=True)
    if problems:
        click.echo(f"{file}: FAILED: {len(problems)} bad entr{'y' if len(problems) == 1 else 'ies'} "
                   f"of {len(problems) + len(good)}", err=True)
        raise SystemExit(EXIT_WRONG)
    click.echo(f"{file}: OK: {len(good)} entr{'y' if len(good) == 1 else 'ies'}")
