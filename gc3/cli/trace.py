"""`gc3 trace FILE.py [ARGS]`: run a program, check it, summarise what it traced."""
from __future__ import annotations

from collections import Counter

import click

from ..errors import GC3Error
from ._common import existing_file, fail, output_path
from ._progress import Progress, quiet_option


def summary(prog) -> str:
    from ..dsl.chunk_dag import depth

    coll = prog.collective
    kinds = Counter(("remote " if op.remote else "local ") + op.kind for op in prog.ops)
    scratch = Counter()
    for sizes in prog.scratch_sizes.values():
        for name, n in sizes.items():
            scratch[name] = max(scratch[name], n)
    groups = {op.parallel_group: op.parallel for op in prog.ops if op.parallel_group is not None}
    lines = [
        f"program      {prog.name} ({coll.name}, {'in-place' if coll.inplace else 'out-of-place'}, "
        f"protocol {prog.protocol}, instances {prog.instances})",
        f"ranks        {prog.num_ranks} ({prog.topology.name})",
        f"chunks       input {coll.input_size(0)}, output {coll.output_size(0)} per rank (rank 0), "
        f"scratch " + (", ".join(f"{k} {v}" for k, v in sorted(scratch.items())) or "none"),
        f"operations   {len(prog.ops)}: " + ", ".join(
            f"{kind} {kinds[kind]}" for kind in ("local copy", "remote copy", "local reduce", "remote reduce")),
        f"parallelize  " + (", ".join(f"block {g} x{n}" for g, n in sorted(groups.items())) or "none"),
        f"DAG depth    {depth(prog.chunk_dag)}",
        "check        passed",
    ]
    return "\n".join(lines)


@click.command("trace", context_settings={"ignore_unknown_options": True})
@click.argument("program", type=click.Path(dir_okay=False), callback=existing_file)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--dag", "dag_path", type=click.Path(dir_okay=False), default=None,
              help="also draw the Chunk DAG to this image file (small programs)")
@quiet_option
def command(program, args, dag_path):
    """Run PROGRAM (a gc3 .py file) with ARGS, check it, print a summary."""
    from ..dsl.program import run_script

    try:
        output_path(dag_path, "--dag")
        with Progress("trace") as progress:
            progress.phase(f"running {program}")
            prog = run_script(program, list(args))
            progress.phase("checking the postcondition")
            prog.check()
            text = summary(prog)
            if dag_path:
                from ..dsl.chunk_dag import draw
                progress.phase(f"drawing {dag_path}")
                draw(prog.chunk_dag, dag_path)
        click.echo(text)
        if dag_path:
            click.echo(f"dag          drawn to {dag_path}")
    except GC3Error as err:
        fail(program, err)
