"""`gc3 show`: what a schedule looks like (XML IR) or draw a DSL program's Chunk DAG."""
from __future__ import annotations

from collections import Counter
from itertools import groupby
from typing import List, Optional

import click

from ..errors import GC3Error
from ._common import existing_file, fail, output_path
from ..ir import STEP_TYPES, Program

_OPS_WIDTH = 60


def abbreviate(types: List[str], width: int = _OPS_WIDTH) -> str:
    """Opcode sequence with runs folded ("rrs*2") and cut to about `width` characters."""
    parts = []
    for t, run in groupby(types):
        n = len(list(run))
        parts.append(t if n == 1 else f"{t}*{n}")
    text = ""
    for i, p in enumerate(parts):
        if len(text) + len(p) + 1 > width:
            return f"{text} ...(+{len(parts) - i} more)"
        text = f"{text} {p}" if text else p
    return text


def describe(prog: Program) -> List[str]:
    lines = [f"{prog.name}: {prog.coll}, {prog.ngpus} ranks, proto {prog.proto}, nchannels {prog.nchannels}, "
             f"nchunksperloop {prog.nchunksperloop}, {'in-place' if prog.inplace else 'out-of-place'}, "
             f"{prog.convention} convention"]
    counts: Counter = Counter()
    chans = set()
    deps = 0
    for g in prog.gpus:
        lines.append(f"rank {g.id}: {len(g.threadblocks)} TBs, i_chunks {g.i_chunks}, o_chunks {g.o_chunks}, "
                     f"s_chunks {g.s_chunks}")
        lines.append(f"  {'tb':>4} {'send':>5} {'recv':>5} {'chan':>5} {'steps':>6}  ops")
        for tb in g.threadblocks:
            types = [st.type for st in tb.steps]
            counts.update(types)
            chans.add(tb.chan)
            deps += sum(st.depid >= 0 for st in tb.steps)
            lines.append(f"  {tb.id:>4} {tb.send:>5} {tb.recv:>5} {tb.chan:>5} {len(tb.steps):>6}  {abbreviate(types)}")
    total = sum(counts.values())
    lines.append("instructions: " + ", ".join(f"{t} {counts[t]}" for t in STEP_TYPES if counts[t]) + f" (total {total})")
    lines.append(f"channels: {len(chans)} used ({', '.join(map(str, sorted(chans)))}) of nchannels {prog.nchannels}")
    hasdep = sum(st.hasdep for g in prog.gpus for tb in g.threadblocks for st in tb.steps)
    lines.append(f"dependencies: {deps} cross-TB (depid/deps), {hasdep} steps signal completion (hasdep)")
    return lines


def _show_script(path: str, args, dag: Optional[str]) -> List[str]:
    from ..dsl.program import run_script
    from .trace import summary

    prog = run_script(path, list(args))
    prog.check()  # the summary reports the check as passed
    lines = summary(prog).splitlines()
    if dag:
        from ..dsl.chunk_dag import draw

        draw(prog.chunk_dag, dag)
        lines.append(f"wrote the chunk DAG to {dag}")
    return lines


@click.command("show", context_settings={"ignore_unknown_options": True})
@click.argument("file", type=click.Path(dir_okay=False), callback=existing_file)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--dag", type=click.Path(dir_okay=False), default=None,
              help="For a DSL program (FILE.py): draw its Chunk DAG into this image.")
def command(file: str, args, dag) -> None:
    """Show an XML IR (per-rank TB table, instruction counts, channels, dependencies),
    or summarize a DSL program FILE.py [ARGS] and draw its Chunk DAG with --dag."""
    from ..ir.xml_io import read_xml

    try:
        if file.endswith(".py"):
            lines = _show_script(file, args, output_path(dag, "--dag"))
        else:
            if dag or args:
                raise click.UsageError("--dag and program arguments need a DSL program (FILE.py)")
            lines = describe(read_xml(file))
    except GC3Error as exc:
        fail(file, exc)
    for line in lines:
        click.echo(line)
