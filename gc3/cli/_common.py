"""What every subcommand does with a GC3Error: one line naming the input, the exit status of its kind."""
from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional, Sequence

import click

from ..errors import GC3Error, InputError, exit_status

# What matplotlib can write, by extension (timelines, DAG drawings).
IMAGE_EXTENSIONS = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def fail(source: str, exc: GC3Error) -> NoReturn:
    click.echo(f"{source}: FAILED: {type(exc).__name__}: {exc}", err=True)
    raise SystemExit(exit_status(exc))


def output_path(path: Optional[str], option: str,
                extensions: Optional[Sequence[str]] = IMAGE_EXTENSIONS) -> Optional[str]:
    """`path` if a file can be written there with one of `extensions` (None: any);
    checked before any work so that a typo does not cost a whole run."""
    if path is None:
        return None
    p = Path(path)
    if extensions is not None and p.suffix.lower() not in extensions:
        raise InputError(f"{option} {path}: unknown extension {p.suffix or '(none)'!r}; expected one of "
                         f"{', '.join(extensions)}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{option} {path}: folder {parent} does not exist")
    return path


def existing_file(ctx, param, value):
    """Click callback: a DSL program `value` if it exists; else a usage error (exit 2) which, for
    a path into algorithms/ (as older copies of the docs spell the library's files), says where the
    algorithm library is.  Other files are left to their reader, whose error names what it expected."""
    if value is not None and Path(value).suffix == ".py" and not Path(value).exists():
        hint = ""
        if Path(value).parts[:1] == ("algorithms",):
            hint = ("; the algorithm library is the package gc3.algorithms: gc3/algorithms/ in a checkout, and "
                    "`python -m gc3.algorithms.NAME ARGS` traces one wherever gc3 is installed")
        raise click.BadParameter(f"{value} does not exist{hint}")
    return value
