"""The `gc3` command line.  Each subcommand lives in its own module under
`gc3/commands/` and is added here, so the CLI is a table of contents."""
from __future__ import annotations

import click


class _Group(click.Group):
    """Every subcommand reports its own errors; a GC3Error that escapes one
    still ends as one line and the status of its kind, never a traceback."""

    def invoke(self, ctx):
        from .commands._common import fail
        from .errors import GC3Error
        try:
            return super().invoke(ctx)
        except GC3Error as exc:
            fail(ctx.invoked_subcommand or "gc3", exc)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gc3")
def main() -> None:
    """gc3: write, compile, verify, simulate and run GPU collective algorithms."""


def _register() -> None:
    from importlib import import_module
    from pathlib import Path

    # Every module in gc3/commands/ exposes `command`, a click command.
    folder = Path(__file__).with_name("commands")
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        main.add_command(import_module(f"gc3.commands.{path.stem}").command)


_register()
