"""`gc3 calibrate`: fit the simulator's cost model to the runtime's measured sweeps
(runtime_cuda/calibrate.py; `gc3 calibrate --help` for its options).

The fit and numpy are imported only when the command runs, so that every other
`gc3` command starts as fast as before."""
from __future__ import annotations

import sys

import click


@click.command("calibrate", context_settings={"ignore_unknown_options": True, "help_option_names": []},
               add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args) -> None:
    """Fit the cost model to the measured sweeps and write its h200 preset (--help for its options)."""
    from runtime_cuda.calibrate import main

    sys.exit(main(list(args)))
