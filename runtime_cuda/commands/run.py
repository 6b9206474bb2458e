"""`gc3 run`: execute an XML IR on GPUs with the CUDA interpreter, check the
data against numpy and report time and bandwidth.

Modes (--mode): `virtual`, all ranks on one GPU in one launch; `ipc`, one
process per GPU under `mpirun -np N` (CUDA IPC); `peer`, this one process
drives GPUs 0..N-1 through peer access.  `auto` (the default) is ipc under
mpirun and virtual otherwise."""
from __future__ import annotations

import os

import click

from gc3 import limits
from gc3.errors import GC3Error, InputError, PostconditionUnprovableError
from gc3.units import env_number
from gc3.cli._common import fail


def _world_size() -> int:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(var):
            return env_number(var, os.environ[var], 1, limits.MAX_RANKS)
    return 1


def _mode(mode: str, world: int) -> str:
    """The mode to run in, or a usage error (exit 2) when it contradicts how the process was started."""
    if mode == "auto":
        return "ipc" if world > 1 else "virtual"
    if mode == "ipc" and world < 2:
        raise click.UsageError("--mode ipc needs one process per GPU: start it with mpirun -np N")
    if mode != "ipc" and world > 1:
        raise click.UsageError(f"--mode {mode} runs every rank in one process; start it without mpirun "
                                   f"(this is process {os.environ.get('OMPI_COMM_WORLD_RANK', '?')} of {world})")
    return mode


def _need_gpu() -> None:
    """Exit 2 (an environment that cannot be used, as the README's contract says) without a GPU."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no cupy, no driver: all mean the same to the user
        fail("gc3 run", InputError(f"needs a CUDA GPU and cupy (found none: {exc}); "
                                   f"use `gc3 simulate` on a machine without one"))
    if n < 1:
        fail("gc3 run", InputError("needs a CUDA GPU; cupy sees none"))


@click.command("run")
@click.argument("xml", type=click.Path(exists=True, dir_okay=False))
@click.option("--size", default="64MiB", show_default=True,
              help="bytes per rank of the larger buffer, as nccl-tests counts them")
@click.option("--dtype", default="float32", show_default=True)
@click.option("--op", default="sum", show_default=True, type=click.Choice(["sum", "prod", "max", "min"]))
@click.option("--iters", default=20, show_default=True, help="calls per timed round (the median of 3 is reported)")
@click.option("--warmup", default=5, show_default=True)
@click.option("--inplace/--outofplace", default=False, show_default=True)
@click.option("--proto", default=None, type=click.Choice(["Simple", "LL", "LL128"]),
              help="override the XML's protocol")
@click.option("--check/--no-check", default=True, show_default=True, help="compare the result with numpy")
@click.option("--timeout", type=float, default=None, help="seconds any GPU wait may take (default GC3_TIMEOUT_S or 5)")
@click.option("--mode", default="auto", show_default=True, type=click.Choice(["auto", "virtual", "ipc", "peer"]),
              help="virtual: all ranks on one GPU; ipc: one process per GPU (mpirun); "
                   "peer: this process drives one GPU per rank; auto: ipc under mpirun, else virtual")
@click.option("--unproven", is_flag=True,
              help="Run a custom collective whose IR has no <postcondition>: structure, limits, FIFO order, "
                   "deadlock freedom and races are still checked; the data is checked against gc3 simulate's "
                   "buffers, and nothing is proven.")
def command(xml, size, dtype, op, iters, warmup, inplace, proto, check, timeout, mode, unproven):
    """Run XML on GPUs: virtual ranks on one GPU, one rank per process under mpirun,
    or one process driving one GPU per rank (--mode peer)."""
    from gc3.dtypes import dtype_info
    from gc3.ir.xml_io import read_xml

    from gc3.verify import verify

    try:
        mode = _mode(mode, _world_size())
        prog = read_xml(xml)
        if prog.fused and mode == "peer":
            raise GC3Error(f"{prog.name} is a fused IR ({prog.compute.op}): it runs in --mode virtual or ipc")
        # Nothing unproven reaches a GPU unless asked: a wrong IR could hang it or return wrong data.
        try:
            verify(prog)
            unproven = False
        except PostconditionUnprovableError as exc:
            if not unproven:
                raise PostconditionUnprovableError(f"{exc}; --unproven runs it anyway (every check but the "
                                                   f"postcondition's)") from None
            _check_unproven(prog)
    except GC3Error as exc:
        fail(xml, exc)
    _need_gpu()
    try:
        _run(prog, size, dtype_info(dtype).name, op, iters, warmup, inplace, proto, check, timeout, mode, unproven)
    except GC3Error as exc:
        raise click.ClickException(str(exc)) from None


def _check_unproven(prog) -> None:
    """Everything `verify` checks but the postcondition, for an IR that has none: structure,
    limits, FIFO order and deadlock freedom, then races, which the simulator finds on one
    element per chunk (its vector clocks see every unordered pair, whatever the interleaving)."""
    from gc3.errors import VerificationError
    from gc3.ir.layout import layout_for
    from gc3.simulator import simulate
    from gc3.verify import verify

    verify(prog, semantics=False)
    L = layout_for(prog, 0)
    res = simulate(prog, count=L.blocks_in * L.chunks_per_block, unproven=True)
    if not res.ok:
        raise VerificationError("; ".join(res.errors[:4]))
    click.echo(f"{prog.name}: custom collective without <postcondition>: structure, limits, FIFO order, deadlock "
               f"freedom and races checked; NOTHING PROVEN about what it computes (--unproven)")


def _simulated_case(prog, n, dtype, op, inplace):
    """(inputs, expected outputs) of an IR with no postcondition: gc3 simulate's buffers, the
    normative meaning of every opcode, on the same seeded inputs as a checked run."""
    from gc3.simulator import simulate

    res = simulate(prog, count=n, dtype=dtype, op=op, inplace=inplace, unproven=True, detect_races=False)
    if not res.ok:
        raise GC3Error("gc3 simulate fails on this IR: " + "; ".join(res.errors[:4]))
    return res.inputs, res.outputs


def _run(prog, size, dtype, op, iters, warmup, inplace, proto, check, timeout, mode, unproven=False):
    from runtime_cuda.core.checking import device_buffers, reference_case, run_checked
    from gc3.units import bus_factor, parse_size
    from runtime_cuda.core.perf import ROUNDS, in_elems_for, nbytes_of
    from gc3.dtypes import dtype_info

    itemsize = dtype_info(dtype).np.itemsize
    if mode == "ipc":
        from runtime_cuda.ranks.ipc import IpcRanks

        group = IpcRanks(prog, proto=proto, timeout=timeout)
        where = f"rank {group.rank} of {prog.ngpus} processes"
        lead = group.rank == 0
    elif mode == "peer":
        from runtime_cuda.ranks.peer import PeerRanks

        group = PeerRanks(prog, proto=proto, timeout=timeout)
        where = f"{prog.ngpus} ranks on GPUs {', '.join(map(str, group.devices))} in one process (peer access)"
        lead = True
    else:
        from runtime_cuda.ranks.virtual import VirtualRanks

        group = VirtualRanks(prog, proto=proto, timeout=timeout)
        where = f"{prog.ngpus} virtual ranks on one GPU"
        lead = True
    if prog.fused:
        return _run_fused(prog, group, iters, warmup, check, mode)
    n = in_elems_for(prog, parse_size(size), itemsize)
    nbytes = nbytes_of(prog, n, itemsize)
    say = click.echo if lead else (lambda *a, **k: None)
    say(f"{prog.name}: {prog.coll}, {where}, {group.proto} protocol, {dtype} {op}, "
        f"{nbytes} bytes per rank, {'in place' if inplace else 'out of place'}")
    if unproven:
        say("check: against gc3 simulate's buffers, not a postcondition (nothing proven)")
        case = _simulated_case(prog, n, dtype, op, inplace)
    else:
        case = reference_case(prog, n, dtype, op)
    ins, outs = device_buffers(group, case[0], n, dtype, inplace)

    def report(us):
        algbw = nbytes / us / 1e3
        say(f"time {us:.1f} us  algbw {algbw:.2f} GB/s  busbw {algbw * bus_factor(prog.coll, prog.ngpus):.2f} "
            f"GB/s (median of {ROUNDS} rounds of {iters} calls)")
    _check_and_time(group, lead, lambda: run_checked(group, n, dtype, op, inplace, case=case),
                    lambda: group(ins, outs, op=op, dtype=dtype), report, iters, warmup, check)


def _check_and_time(group, lead, checked, call, report, iters, warmup, check) -> None:
    """The one check-then-time step of `gc3 run`: `checked()` runs one call on seeded data and
    compares it (when `check`), then `warmup` untimed calls of `call()` and timed rounds of `iters`
    (runtime_cuda.core.perf.time_rounds), and `report(us per call of the median round)`.  Wrong results raise after the report, so the time is still shown."""
    from runtime_cuda.core.perf import time_rounds

    ok = True
    if check:
        res = checked()
        ok = res.wrong == 0
        click.echo(f"check{'' if lead else f' (rank {group.ranks[0]})'}: {res.wrong} wrong of "
                   f"{res.checked} elements{'' if ok else ': ' + str(res.first)}")
    for _ in range(warmup):
        call()
    group.check()
    if hasattr(group, "comm"):
        group.comm.Barrier()
    us, _ = time_rounds(call, iters)
    group.check()
    report(us)
    if hasattr(group, "close"):
        group.close()
    if not ok:
        raise GC3Error("wrong results (see above)")


def _run_fused(prog, group, iters, warmup, check, mode):
    """A fused IR: its operator's shapes and dtype are the XML's (--size and --dtype do not
    apply); seeded compute inputs, checked against the unfused reference, then timed."""
    from runtime_cuda.core.checking import fused_buffers, fused_case, run_fused, run_fused_checked
    from runtime_cuda.core.perf import ROUNDS

    lead = getattr(group, "rank", 0) == 0
    say = click.echo if lead else (lambda *a, **k: None)
    spec = prog.compute
    say(f"{prog.name}: {spec.op} + {prog.coll}, {prog.ngpus} ranks ({mode}), {group.proto} protocol, "
        f"{spec.dtype}, operator inputs {', '.join(f'{n} {list(s)}' for n, s in spec.inputs)}")
    ins, outs = fused_buffers(group, fused_case(prog)[0])
    _check_and_time(group, lead, lambda: run_fused_checked(group), lambda: run_fused(group, ins, outs),
                    lambda us: say(f"time {us:.1f} us per call (median of {ROUNDS} rounds of {iters} calls)"),
                    iters, warmup, check)
