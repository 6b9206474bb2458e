"""`gc3 compile FILE.py [ARGS...] -o x.xml`: trace a program, lower it, verify it, write the XML IR."""
from __future__ import annotations

import time
from collections import Counter
from typing import List, Optional

import click

from .. import limits
from ..errors import GC3Error, InputError
from ._common import existing_file, fail, output_path
from ._progress import Progress, quiet_option


def summary(prog, *, out: str, seconds: float, verified: Optional[str]) -> List[str]:
    """A one-screen description of a compiled program."""
    steps = [st for g in prog.gpus for tb in g.threadblocks for st in tb.steps]
    tbs = [len(g.threadblocks) for g in prog.gpus]
    per_tb = [len(tb.steps) for g in prog.gpus for tb in g.threadblocks]
    kinds = Counter(st.type for st in steps)
    types = ", ".join(f"{t} {kinds[t]}" for t in ("s", "r", "rcs", "rrc", "rrs", "rrcs", "cpy", "re", "nop") if kinds[t])
    deps = sum(st.depid >= 0 for st in steps)
    g0 = prog.gpus[0] if prog.gpus else None
    lines = [
        f"{prog.name}: {prog.coll}, {prog.ngpus} ranks, proto {prog.proto}, "
        f"{'in place' if prog.inplace else 'out of place'}",
        f"chunks: {prog.nchunksperloop} per loop"
        + (f"; rank 0 i/o/s = {g0.i_chunks}/{g0.o_chunks}/{g0.s_chunks}" if g0 else ""),
        f"threadblocks per rank: {min(tbs, default=0)}..{max(tbs, default=0)}, {prog.nchannels} channel(s)",
        f"steps: {len(steps)} ({types}); per threadblock at most {max(per_tb, default=0)}",
        f"cross-threadblock dependencies: {deps}",
    ]
    if verified is not None:
        lines.append(verified)
    lines.append(f"wrote {out} in {seconds:.2f} s")
    return lines


@click.command("compile", context_settings={"ignore_unknown_options": True})
@click.argument("file", type=click.Path(dir_okay=False), callback=existing_file)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the XML IR.")
@click.option("--instances", type=click.IntRange(min=1, max=limits.MAX_INSTANCES), default=None,
              help="Override the program's instances (at most gc3.limits.MAX_INSTANCES).")
@click.option("--protocol", type=click.Choice(["Simple", "LL", "LL128"]), default=None,
              help="Override the program's protocol.")
@click.option("--no-fusion", is_flag=True, help="Do not fuse receives with sends (rcs/rrs/rrcs); implies --no-absorption.")
@click.option("--no-absorption", is_flag=True,
              help="Keep r+re and cpy+rrc pairs as traced instead of folding them into one rrc.")
@click.option("--no-tb-merge", is_flag=True,
              help="Keep a channel's lone send and lone receive threadblocks apart (merged by default for LL).")
@click.option("--max-tbs", type=click.IntRange(min=1), default=None,
              help="Threadblocks allowed per rank (default: gc3.limits.MAX_TBS).")
@quiet_option
def command(file: str, args, output: str, instances, protocol, no_fusion: bool, no_absorption: bool,
            no_tb_merge: bool, max_tbs) -> None:
    """Run FILE as a script with ARGS (as `python FILE ARGS`), lower the last
    GC3Program it traced, verify the schedule and write it as XML.

    Options given here override the program's own settings.  Put `--` before
    program arguments that look like options of this command.
    """
    from ..toolchain import lower
    from ..dsl.program import run_script
    from ..verify import verify
    from ..ir.xml_io import write_xml

    start = time.perf_counter()
    try:
        output_path(output, "-o", extensions=None)
        with Progress("compile") as progress:
            progress.phase(f"running {file}")
            program = run_script(file, list(args))
            # The program's own postcondition, checked on the trace first: its
            # errors name the user's file and line.  A collective that declares
            # none is refused here (TraceError), since nothing could be proven.
            progress.phase("checking the trace")
            program.check()
            progress.phase("lowering")
            prog = lower(program, instances=instances, protocol=protocol,
                         instr_fusion=False if no_fusion else None, max_tbs=max_tbs,
                         absorption=False if no_absorption else None, tb_merge=False if no_tb_merge else None)
            progress.phase("verifying")
            checked = verify(prog, max_tbs=max_tbs)
            verified = (f"verified: FIFO order of {checked.pairs} send/receive pairs, no deadlock with "
                        f"{checked.slots} slots per connection, within runtime limits, {prog.coll} postcondition "
                        f"proven on {checked.proven} output chunks")
            progress.phase(f"writing {output}")
            write_xml(prog, output)
    except GC3Error as exc:
        fail(file, exc)
    except OSError as exc:
        fail(output, InputError(f"cannot write: {exc.strerror}"))
    for line in summary(prog, out=output, seconds=time.perf_counter() - start, verified=verified):
        click.echo(line)
