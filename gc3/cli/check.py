"""`gc3 check x.xml`: every verification of pass 7, for gc3's and msccl-tools' XML."""
from __future__ import annotations

import click

from ..errors import GC3Error, IRFormatError
from ._common import existing_file, fail
from ._progress import Progress, quiet_option


@click.command("check")
@click.argument("xml", type=click.Path(dir_okay=False), callback=existing_file)
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="FIFO slots per connection (default: gc3.limits.FIFO_SLOTS for the protocol).")
@click.option("--max-tbs", type=click.IntRange(min=1), default=None,
              help="Threadblocks allowed per rank (default: gc3.limits.MAX_TBS).")
@quiet_option
def command(xml: str, slots, max_tbs) -> None:
    """Verify an XML IR: structure, runtime limits, FIFO order, deadlock freedom, and that it
    computes its collective on every rank for every call size.

    Exit status: 0 proven; 1 wrong or unsafe; 2 unreadable input; 3 a custom
    collective's IR without a <postcondition>, which cannot be proven."""
    from ..verify import check_report
    from ..ir.xml_io import read_xml

    try:
        if xml.endswith(".py"):
            raise IRFormatError(f"a DSL program, not an XML IR: compile it first (gc3 compile {xml} [ARGS] -o "
                                f"x.xml, then gc3 check x.xml), or `gc3 trace {xml} [ARGS]` checks the program "
                                f"itself")
        with Progress("check") as progress:
            progress.phase("reading the IR")
            prog = read_xml(xml)
            progress.phase("verifying structure, limits, FIFO order, deadlock freedom and semantics")
            lines = check_report(prog, slots=slots, max_tbs=max_tbs)
    except GC3Error as exc:
        fail(xml, exc)
    for line in lines:
        click.echo(line)
    click.echo(f"{xml}: OK")
