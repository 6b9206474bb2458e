"""The cost model's estimate for the dedicated small-message allreduce kernels
(runtime_cuda/ranks/small_allreduce.py; kernels/small_allreduce.cu says what they do).

They run no IR, so the tile-level model does not apply; the estimate is built
from the same preset's figures:

    one-shot  launch_s + alpha_LL + (n-1) * B / bw + n * B / red
    two-shot  launch_s + 2 * alpha_LL + 2 * (n-1)/n * B / bw + B / red

B: the call's bytes; blocks: the group's most blocks per rank.  A call launches
one LL line per thread (gc3.limits.small_allreduce_blocks); one that fits in
fewer blocks than the most has every line in flight at once and is bound by
latency, not by a block's rate, so the rates are those of the most blocks.
bw: what one rank's blocks move over the slowest link to a peer,
min(blocks * tb_Bps[LL], port_Bps * LL's payload fraction) (every rank sends at
once, each over its own links); red: blocks * tb_reduce_Bps, the local
reduction of the n contributions (one-shot: all of them on every rank; two-shot:
each rank its 1/n segment).  With the calibrated h200 preset (launch 4.01 us,
LL hop 1.31 us, 4.38 GB/s LL and 38.9 GB/s reduction per block, 128 blocks):
2 ranks, 1 KiB: one-shot 5.3 us, two-shot 6.6 us; 256 KiB: 7.0 and 8.2 us;
2 MiB: 18.6 and 19.5 us (one-shot measured on 2x H200: 5.8 us at 256 KiB,
17.5 at 2 MiB); 8 ranks, 256 KiB: one-shot 16.7 us, two-shot 9.4 us.

The LL128 forms (gc3.limits.SMALL_LL128_KERNELS) carry LL128's payload fraction
and block rate, and their reader reads each line again once its flag is seen: one
more round trip per peer whose line it waits for, LL128_REREAD_S each (n - 1 for
one-shot, n for two-shot's two phases).

The one-shot allgather and reducescatter move one rank's block (1/n of
nccl-tests' size) to each peer and write (or reduce) n blocks: the one-shot
allreduce's estimate for a buffer of one block (small_kernel_seconds).
"""
from __future__ import annotations

from typing import Optional

from .. import limits
from ..errors import GC3Error
from .cost_config import PROTOCOL_EFFICIENCY, CostConfig


# What the second read costs an LL128 small kernel a peer: on 4 and 2 H100s (2026-11-27,
# measured/small_ll128_2x4xH100_2026-11-27.txt) the one-shot LL128 allreduce took 0.7 us a peer
# more than the LL one at 1-16 KiB in CUDA-graph replays.
LL128_REREAD_S = 0.7e-6


def small_allreduce_seconds(kind: str, nbytes: int, ranks: int, cfg: CostConfig,
                            blocks: int = limits.SMALL_ALLREDUCE_BLOCKS) -> Optional[float]:
    """Seconds per call; None where the kernels do not serve the size (0 or above
    gc3.limits.SMALL_ALLREDUCE_MAX_BYTES)."""
    if kind not in limits.SMALL_ALLREDUCE_KERNELS:
        raise GC3Error(f"unknown small allreduce kernel {kind!r} (have {', '.join(limits.SMALL_ALLREDUCE_KERNELS)})")
    if ranks < 1:
        raise GC3Error(f"small allreduce model: {ranks} ranks")
    if nbytes <= 0 or nbytes > limits.SMALL_ALLREDUCE_MAX_BYTES:
        return None
    links = [cfg.links[cfg.link_type(0, r)] for r in range(1, ranks)]
    if not links:
        return cfg.launch_s + nbytes / (blocks * cfg.tb_mem_Bps)
    # An LL128 line arrives with its flag as an LL line does (one hop's latency), carrying
    # 120 data bytes in 128.
    proto = limits.small_kernel_protocol(kind)
    alpha = max(link.alpha_s["LL"] for link in links)
    bw = min(min(blocks * link.tb_Bps[proto], link.port_Bps * PROTOCOL_EFFICIENCY[proto]) for link in links)
    red = blocks * cfg.tb_reduce_Bps
    n = ranks
    twoshot = limits.small_kernel_phases(kind) == 2
    reread = (n if twoshot else n - 1) * LL128_REREAD_S if proto == "LL128" else 0.0
    if not twoshot:
        return cfg.launch_s + alpha + reread + (n - 1) * nbytes / bw + n * nbytes / red
    return cfg.launch_s + 2 * alpha + reread + 2 * (n - 1) / n * nbytes / bw + nbytes / red


def small_kernel_seconds(collective: str, kind: str, nbytes: int, ranks: int, cfg: CostConfig,
                         blocks: int = limits.SMALL_ALLREDUCE_BLOCKS) -> Optional[float]:
    """Seconds per call of a small-message kernel (gc3.limits.SMALL_KERNELS) for
    nccl-tests size `nbytes`; None where the kernels do not serve the size."""
    if kind not in limits.SMALL_KERNELS.get(collective, ()):
        raise GC3Error(f"no small-message kernel {kind!r} for {collective}")
    if collective == "allreduce":
        return small_allreduce_seconds(kind, nbytes, ranks, cfg, blocks)
    if nbytes <= 0 or nbytes > limits.SMALL_ALLREDUCE_MAX_BYTES:
        return None
    return small_allreduce_seconds(kind, limits.small_kernel_block_bytes(collective, nbytes, ranks), ranks, cfg,
                                   blocks)
