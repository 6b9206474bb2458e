"""`gc3 catalog check FILE`: validate a catalog (JSON or XML) as the NCCL drop-in loads it.
`gc3 catalog plot FILE -o p.png`: draw what `gc3 tune` chose for a catalog it wrote.
`gc3 catalog merge A.json B.json -o OUT.json`: one catalog from tunes of other collectives.
`gc3 catalog build [--out DIR] [--check]`: compile the shipped samples and their index
(ir_samples/), or say how the folder differs from what that would write.

The drop-in (`runtime_cuda.nccl`) is imported only when the command runs, as
`gc3 run` and `gc3 bench` import the runtime: the compiler never needs it.
"""
from __future__ import annotations

import click

from gc3.errors import EXIT_WRONG, GC3Error, InputError
from gc3.cli._common import fail
from gc3.cli._progress import Progress, quiet_option

from .tune import choices_title, png_option, writable


@click.group("catalog")
def command() -> None:
    """Algorithm catalogs of the NCCL drop-in (GC3_CONFIG, ir_samples/index.json)."""


@command.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@quiet_option
def check(file: str) -> None:
    """Load FILE exactly as the drop-in would (every entry's fields, every IR it
    lists, each IR proven by `gc3 check`); list what it would skip.
    Exit status: 0 every entry usable; 1 some entry skipped; 2 FILE unreadable."""
    from pathlib import Path

    from runtime_cuda.nccl.catalog import check_config

    try:
        with Progress("catalog check") as progress:
            progress.phase("loading and proving every entry")
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


@command.command("plot")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), callback=png_option,
              help="PNG to write")
@quiet_option
def plot(file: str, output) -> None:
    """Draw, from the provenance `gc3 tune` wrote into catalog FILE (JSON), the
    algorithm chosen per collective, placement and size, its time and its margin
    over NCCL (where NCCL was measured), as `gc3 tune --plot` does.
    Exit status: 0 written; 2 FILE unreadable or without tune's provenance."""
    import json

    from runtime_cuda.nccl.perf import plot_choices

    try:
        with open(file) as fh:
            catalog = json.load(fh)
    except (OSError, ValueError) as exc:
        fail(file, InputError(f"cannot read it as a JSON catalog: {exc}"))
    prov = catalog.get("provenance") if isinstance(catalog, dict) else None
    if not isinstance(prov, dict) or not prov.get("choices"):
        fail(file, InputError('no provenance "choices" to plot: only a catalog written by `gc3 tune` has them '
                              "(its provenance records what won at each size)"))
    with Progress("catalog plot") as progress:
        progress.phase(f"drawing {output}")
        plot_choices(prov["choices"], output, title=choices_title(prov))
    click.echo(f"wrote {output}")


@command.command("merge")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="catalog JSON to write")
@click.option("--ir-dir", type=click.Path(file_okay=False), default=None,
              help="folder to copy the IR files into [default: -o's folder]")
def merge(files, output: str, ir_dir) -> None:
    """Merge catalogs that `gc3 tune` wrote on the same GPUs for the same ranks, each for
    other collectives (tuned in pieces, within a job's time limit or on two GPU pairs at
    once), into one: every entry, its IR copied, the provenance of all.
    Exit status: 0 written; 2 a catalog unreadable, not tune's, or not mergeable with the others."""
    from pathlib import Path

    from runtime_cuda.nccl.tune import MergeError, merge_catalogs

    if len(files) < 2:
        raise click.UsageError("name at least two catalogs to merge")
    out = writable(output, ".json", "catalog", "-o")
    try:
        catalog = merge_catalogs([Path(f) for f in files], out, Path(ir_dir) if ir_dir else None)
    except MergeError as exc:
        fail(exc.source, exc)
    except OSError as exc:
        fail(output, InputError(f"cannot write the merged catalog: {exc.strerror or exc}"))
    prov = catalog["provenance"]
    click.echo(f"wrote {output}: {len(catalog['algorithms'])} entries for {', '.join(prov['choices'])} "
               f"from {len(files)} catalogs")
    if prov.get("shippable") is False:
        click.echo(f"NOT SHIPPABLE: {prov['not_shippable']}")

@command.command("projection")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--place", type=click.Choice(("outofplace", "inplace")), default="outofplace", show_default=True)
def projection(files, place: str) -> None:
    """The projection table of each catalog `gc3 tune --model-only` wrote (the README's
    8- and 16-rank tables): per collective, the size range of each algorithm chosen, its
    predicted time and busbw.  Exit status: 0 printed; 2 a file is measured or not tune's."""
    from pathlib import Path

    from runtime_cuda.nccl.tune import projection as table

    for k, path in enumerate(files):
        try:
            lines = table(Path(path), place)
        except InputError as exc:
            fail(path, exc)
        click.echo(("\n" if k else "") + "\n".join(lines))


@command.command("protocol")
@click.option("--ranks", type=click.IntRange(2, None), required=True, help="rank count the catalog serves")
@click.option("--protocol", "proto", type=click.Choice(("Simple", "LL", "LL128")), default="LL128", show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="catalog JSON to write")
@click.option("--ir-dir", type=click.Path(file_okay=False), default=None,
              help="folder for the library's IRs [default: X.d/ beside -o X.json]")
def protocol(ranks: int, proto: str, output: str, ir_dir) -> None:
    """A catalog (for GC3_CONFIG) that runs every shipped sample and library algorithm for
    RANKS ranks under one protocol, each in turn over bands of sizes, so that `gc3 fuzz`
    exercises every one of them with it.  Exit status: 0 written; 2 nothing ships for
    RANKS ranks or the file cannot be written."""
    import json
    from pathlib import Path

    from runtime_cuda.nccl.protocol_catalog import config

    out = writable(output, ".json", "catalog", "-o")
    try:
        catalog = config(ranks, Path(ir_dir) if ir_dir else out.with_suffix(".d"), proto)
        out.write_text(json.dumps(catalog, indent=1) + "\n")
    except InputError as exc:
        fail(output, exc)
    except OSError as exc:
        fail(output, InputError(f"cannot write the catalog: {exc.strerror or exc}"))
    click.echo(f"wrote {output}: {len(catalog['algorithms'])} entries, every program for {ranks} ranks as {proto}")


@command.command("build")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder to write (default: the shipped samples' folder, ir_samples/ in a checkout).")
@click.option("--check", is_flag=True,
              help="Write nothing: list each file of the folder that differs from what would be written.")
@quiet_option
def build(out, check: bool) -> None:
    """Compile the shipped algorithm samples (runtime_cuda/nccl/samples.py) into XML IRs
    and the index.json the drop-in reads them from, removing stale *.xml there.
    Exit status: 0 written (or, with --check, the folder is up to date); 1 with --check,
    the folder differs; 2 a sample does not compile or the folder cannot be written."""
    from pathlib import Path

    from runtime_cuda.nccl import samples

    folder = Path(out) if out is not None else samples.SAMPLES_DIR
    try:
        with Progress("catalog build") as progress:
            progress.phase("compiling and proving every sample")
            if check:
                diff = samples.differences(folder)
            else:
                written = samples.generate(folder)
    except GC3Error as exc:
        fail(str(folder), exc)
    except OSError as exc:
        fail(str(folder), InputError(f"cannot write the samples there: {exc.strerror or exc}"))
    if check:
        for line in diff:
            click.echo(line)
        if diff:
            again = "" if out is None else f" --out {out}"
            click.echo(f"{folder}: FAILED: {len(diff)} file(s) differ; run: gc3 catalog build{again}", err=True)
            raise SystemExit(EXIT_WRONG)
        click.echo(f"{folder}: OK: up to date")
        return
    total = sum(p.stat().st_size for p in written)
    click.echo(f"wrote {len(written) - 1} samples and index.json to {folder} ({total / 1024:.0f} KiB)")
