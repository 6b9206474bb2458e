"""Runtime limits: what the CUDA runtime's fixed tables can hold (`gc3.limits`)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import limits
from ..errors import LimitError
from ..ir import Program
from .model import where


@dataclass(frozen=True)
class Limits:
    max_tbs: int = limits.MAX_TBS
    max_steps: int = limits.MAX_STEPS_PER_TB
    max_cnt: int = limits.MAX_CNT
    max_channels: int = limits.MAX_CHANNELS
    max_fanin: int = limits.MAX_REDUCE_FANIN


def check(prog: Program, lim: Limits) -> None:
    if prog.nchannels > lim.max_channels:
        raise LimitError(f"nchannels={prog.nchannels} exceeds the runtime's {lim.max_channels} channels")
    if prog.ngpus > limits.MAX_RANKS:
        raise LimitError(f"ngpus={prog.ngpus} exceeds gc3.limits.MAX_RANKS={limits.MAX_RANKS}")
    for g in prog.gpus:
        for name in ("i_chunks", "o_chunks", "s_chunks"):
            if getattr(g, name) > limits.MAX_CHUNKS:
                raise LimitError(f"rank {g.id}: {name}={getattr(g, name)} exceeds gc3.limits.MAX_CHUNKS="
                                 f"{limits.MAX_CHUNKS} (the runtime's tables hold chunk offsets as int32)")
        if len(g.threadblocks) > lim.max_tbs:
            raise LimitError(
                f"rank {g.id} has {len(g.threadblocks)} threadblocks, more than max_tbs={lim.max_tbs} "
                f"(all TBs of a rank must be co-resident)")
        for tb in g.threadblocks:
            if len(tb.steps) > lim.max_steps:
                raise LimitError(f"{where(g.id, tb.id)} has {len(tb.steps)} steps, more than {lim.max_steps}")
            chain = 0
            for k, st in enumerate(tb.steps):
                at = where(g.id, tb.id, k, st)
                if st.cnt > lim.max_cnt:
                    raise LimitError(f"{at}: cnt={st.cnt} exceeds the runtime's {lim.max_cnt} chunks per step")
                chain = _fanin(tb.steps, k, chain)
                if chain > lim.max_fanin:
                    raise LimitError(
                        f"{at}: {chain} consecutive 're' steps reduce into {st.dstbuf}[{st.dstoff}]; "
                        f"the runtime fuses at most {lim.max_fanin}")


def _fanin(steps, k: int, chain: int) -> int:
    """Length of the run of `re` steps ending at step k that the runtime fuses into one pass.

    A run continues while the steps reduce into the same operand with the
    same count and nothing outside the TB has to wait or be waited for in the
    middle of it (a dependency splits the pass).
    """
    st = steps[k]
    if st.type != "re":
        return 0
    prev = steps[k - 1] if k else None
    if (chain and prev is not None and (prev.dstbuf, prev.dstoff, prev.cnt) == (st.dstbuf, st.dstoff, st.cnt)
            and st.depid == -1 and not prev.hasdep):
        return chain + 1
    return 1
