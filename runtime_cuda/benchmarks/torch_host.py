"""Host time per call of a torch-level operation, and a profile of its calls, for the
profiling scripts under scripts/."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def host_us(fn: Callable[[], object], calls: int = 20, rounds: int = 5) -> float:
    """Microseconds of host time per call: a timer around `calls` calls with no synchronisation,
    the median of `rounds`, every rank starting each round together (torch.distributed's group)."""
    import torch
    import torch.distributed as dist

    fn()
    per = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(per)


def profile(fn: Callable[[], object], title: str, show: bool, calls: int = 20, lines: int = 14) -> None:
    """cProfile of `calls` calls of `fn`, the top `lines` by own time printed under `title`
    where `show` (rank 0)."""
    import cProfile
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    if show:
        print(f"--- cProfile, {title}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(lines)
