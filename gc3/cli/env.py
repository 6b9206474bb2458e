"""`gc3 env`: every GC3_* environment variable (gc3.settings), its effective value and
where the value came from; `--markdown` prints the README's table of them."""
from __future__ import annotations

import click


@click.command("env")
@click.option("--markdown", is_flag=True, help="Print the README's table of settings instead.")
def command(markdown: bool) -> None:
    """Print every GC3_* setting, one per line: name, effective value, and whether it came
    from the environment or is the default.  A value that cannot be read is shown with
    the reason, so one bad variable does not hide the others."""
    from .. import settings

    if markdown:
        click.echo(settings.markdown())
        return
    rows = settings.effective()
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        click.echo(f"{name:<{width}}  {value}  ({source})")
