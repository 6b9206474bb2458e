"""The `gc3` command line.  Each subcommand lives in its own module in this
folder and is added here, so the CLI is a table of contents.

Commands that need a GPU runtime (`run`, `bench`, `catalog`, `tune`) are not gc3's:
a runtime package declares them under the entry-point group `gc3.commands`
(runtime_cuda does, in pyproject.toml), and they are added from there, so the
compiler never imports a runtime."""
from __future__ import annotations

import click

# The compiler's own subcommands: each module defines `command`, a click command.
BUILTIN = ("check", "compile", "env", "show", "simulate", "trace")
PLUGIN_GROUP = "gc3.commands"


class _Group(click.Group):
    """Every subcommand reports its own errors; a GC3Error that escapes one
    still ends as one line and the status of its kind, never a traceback."""

    def invoke(self, ctx):
        from ._common import fail
        from ..errors import GC3Error
        try:
            return super().invoke(ctx)
        except GC3Error as exc:
            fail(ctx.invoked_subcommand or "gc3", exc)

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            hint = _no_runtime_hint(args[0] if args else "")
            if hint:
                raise click.UsageError(f"{exc.message.rstrip('.')}. {hint}", ctx) from None
            raise


def _no_runtime_hint(name: str) -> str:
    """Why a runtime command is missing, where no installed package declares any: from a
    checkout on PYTHONPATH the runtime's code is there but its entry points are not.  (The
    compiler names no runtime: the README says which module runs a checkout's commands.)"""
    if not name or name.startswith("-") or _plugins:
        return ""
    return (f"No installed package declares the GPU runtime's commands (bench, tune, catalog, run, ...; "
            f"entry points '{PLUGIN_GROUP}'): install gc3 with its runtime (`pip install -e .` in a "
            f"checkout), or run a checkout's runtime module with python -m (the README's command table)")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gc3")
def main() -> None:
    """gc3: write, compile, verify, simulate and run GPU collective algorithms."""


def _register() -> None:
    from importlib import import_module
    from importlib.metadata import entry_points

    for name in BUILTIN:
        main.add_command(import_module(f"{__name__}.{name}").command)
    # Installed packages' commands, by the name they declare; loaded at start
    # (cheap: a plugin module imports its runtime inside the command).
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        _plugins.append(ep.name)
        if ep.name not in main.commands:
            main.add_command(ep.load(), ep.name)


_plugins: list = []   # the commands installed packages declare, by name


_register()
