"""Structural checks: the IR names real ranks, TBs, steps and chunks.

Everything later (matching, deadlock search, the runtimes) indexes by these
ids, so a bad id has to be caught here with a message saying where it is.
"""
from __future__ import annotations

from typing import Dict, Set, Tuple

from ..errors import IRStructureError
from ..ir import Gpu, Program, Step, local_output, step_reads
from .model import where


def check(prog: Program) -> None:
    _check_gpus(prog)
    for g in prog.gpus:
        tbs = {}
        for tb in g.threadblocks:
            if tb.id in tbs:
                raise IRStructureError(f"rank {g.id}: two threadblocks with id {tb.id}")
            tbs[tb.id] = tb
        _check_connections(prog, g)
        for tb in g.threadblocks:
            for k, st in enumerate(tb.steps):
                at = where(g.id, tb.id, k, st)
                if st.info.send and tb.send < 0:
                    raise IRStructureError(f"{at} sends but the threadblock has no send peer (send=-1)")
                if st.info.recv and tb.recv < 0:
                    raise IRStructureError(f"{at} receives but the threadblock has no recv peer (recv=-1)")
                _check_dep(g, tbs, tb.id, at, st)
                if st.type != "nop":
                    _check_operands(prog, g, at, st)
                if st.info.compute or st.compute is not None:
                    _check_compute(prog, at, st)


def _check_compute(prog: Program, at: str, st: Step) -> None:
    """A compute step names the operator's inputs in its order and columns inside y."""
    spec = prog.compute
    if not st.info.compute or st.compute is None:
        raise IRStructureError(f"{at}: compute operands on a {st.type!r} step, or a {st.type!r} step without them")
    if spec is None or spec.op != st.info.compute:
        raise IRStructureError(f"{at}: a {st.type!r} step in an IR whose <compute> declares "
                               f"{spec.op if spec else 'no operator'} (a fused IR needs fused=\"1\" and <compute>)")
    names = spec.step_inputs
    if st.compute.inputs != names:
        raise IRStructureError(f"{at}: reads compute inputs {','.join(st.compute.inputs)}; the operator "
                               f"declares {','.join(names)}")
    axis, n, _ = spec.split()
    if not 0 <= st.compute.col0 < st.compute.col1 <= n:
        raise IRStructureError(f"{at}: {axis}s [{st.compute.col0}, {st.compute.col1}) outside the operator's {n} "
                               f"{axis}s")


def _check_gpus(prog: Program) -> None:
    ids = [g.id for g in prog.gpus]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise IRStructureError(f"two <gpu> elements with id {dup}")
    if not prog.ranks_complete():
        raise IRStructureError(f"ngpus={prog.ngpus} but the <gpu> ids are {sorted(ids)}; expected 0..{prog.ngpus - 1}")
    for g in prog.gpus:
        for name in ("i_chunks", "o_chunks", "s_chunks"):
            if getattr(g, name) < 0:
                raise IRStructureError(f"rank {g.id}: {name}={getattr(g, name)}; a buffer cannot have a negative size")


def _check_connections(prog: Program, g: Gpu) -> None:
    owner: Dict[Tuple[str, int, int], int] = {}
    for tb in g.threadblocks:
        if not 0 <= tb.chan < prog.nchannels:
            raise IRStructureError(f"{where(g.id, tb.id)}: chan={tb.chan} outside 0..{prog.nchannels - 1} (nchannels={prog.nchannels})")
        for direction, peer in (("send", tb.send), ("recv", tb.recv)):
            if peer == -1:
                continue
            if not 0 <= peer < prog.ngpus or peer == g.id:
                raise IRStructureError(f"{where(g.id, tb.id)}: {direction}={peer} is not another rank in 0..{prog.ngpus - 1}")
            key = (direction, peer, tb.chan)
            if key in owner:
                raise IRStructureError(
                    f"{where(g.id, tb.id)}: the {direction} connection to rank {peer} on chan {tb.chan} "
                    f"is already used by {where(g.id, owner[key])}; one TB per connection and direction")
            owner[key] = tb.id


def _check_dep(g: Gpu, tbs, own: int, at: str, st: Step) -> None:
    if st.depid == -1 and st.deps == -1:
        return
    if st.depid < 0 or st.deps < 0:
        raise IRStructureError(f"{at}: depid={st.depid} deps={st.deps}; both must be -1 or both name a step")
    if st.depid == own:
        raise IRStructureError(f"{at}: depends on its own threadblock (depid={st.depid}); program order already covers that")
    target = tbs.get(st.depid)
    if target is None:
        raise IRStructureError(f"{at}: depid={st.depid} but rank {g.id} has no threadblock {st.depid}")
    if st.deps >= len(target.steps):
        raise IRStructureError(f"{at}: deps={st.deps} but {where(g.id, st.depid)} has only {len(target.steps)} steps")
    dep = target.steps[st.deps]
    if not dep.hasdep:
        raise IRStructureError(
            f"{at}: waits for {where(g.id, st.depid, st.deps, dep)}, which has hasdep=0 and so never signals completion")


def _check_operands(prog: Program, g: Gpu, at: str, st: Step) -> None:
    if st.cnt < 1:
        raise IRStructureError(f"{at}: cnt={st.cnt}; a step moves at least one chunk")
    size = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}
    operands: Set[Tuple[str, int]] = set(step_reads(st, prog.convention))
    out = local_output(st, prog.convention)
    if out is not None:
        operands.add(out)
    for buf, off in sorted(operands):
        if off < 0 or off + st.cnt > size[buf]:
            why = " (an in-place program has no output buffer)" if buf == "o" and prog.inplace and size[buf] == 0 else ""
            raise IRStructureError(
                f"{at}: operand {buf}[{off}:{off + st.cnt}] outside rank {g.id}'s {buf}_chunks={size[buf]}{why}")
