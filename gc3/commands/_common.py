"""What every subcommand does with a GC3Error: one line naming the input, the exit status of its kind."""
from __future__ import annotations

from typing import NoReturn

import click

from ..errors import GC3Error, exit_status


def fail(source: str, exc: GC3Error) -> NoReturn:
    click.echo(f"{source}: FAILED: {type(exc).__name__}: {exc}", err=True)
    raise SystemExit(exit_status(exc))
