"""The memory-bound operators as gc3 programs (gc3/algorithms/fused/): the interpreter runs their
compute steps, each chunk computed right before it is sent.  The operators themselves run as
kernels (memory_bound); these programs serve the interpreter's compute benchmark
(runtime_cuda/benchmarks/fused_memory_bound.py, `--compute-only`), `gc3 run` of their IR, and
the tests of the DSL's compute steps."""
from __future__ import annotations

import functools
from typing import Optional, Tuple

from gc3 import algorithms, settings


@functools.lru_cache(maxsize=64)
def fused_program(algo: str, args: Tuple[int, ...], dtype: Optional[str]):
    """The lowered IR of gc3.algorithms.fused.<algo> with positional `args` and `dtype` (None: a
    program that holds no dtype, such as an epilogue's, which serves calls of every type)."""
    from gc3.toolchain import lower

    fn = algorithms.builder(f"fused.{algo}")
    return lower(fn(*args) if dtype is None else fn(*args, dtype=dtype))


def compute_tbs(blocks: int, ranks_here: int) -> int:
    """Compute TBs per rank (the algorithms' S): as many as the split axis has blocks, within the
    SMs each rank of this GPU gets, less a few for the communication TBs, rounded down to a power
    of two so blocks share them evenly.  GC3_FUSED_COMPUTE_TBS overrides (0: compute in the
    sending TBs)."""
    forced = settings.get("GC3_FUSED_COMPUTE_TBS")
    if forced is not None:
        return min(forced, blocks)
    import cupy

    sms = _sm_count(cupy.cuda.Device().id)
    room = max(1, min(blocks, sms // max(ranks_here, 1) - 8))
    return 1 << (room.bit_length() - 1)


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import cupy

    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


# The embedding-bag program's blocks (rank slices x sample blocks): as many as its compute TBs can
# take on a GPU of 132 SMs and more (each computes whole blocks, so the blocks bound the SMs that
# pool: 4 blocks per slice left 16 compute TBs at 4 ranks and 8 at 2), of at least a few samples each.
EBAG_MAX_BLOCKS = 128
EBAG_MIN_BLOCK_SAMPLES = 8


def ebag_chunks(n: int, b: int) -> int:
    """Sample blocks per rank slice of b samples, for n slices: the largest power of two that
    divides b into blocks of at least EBAG_MIN_BLOCK_SAMPLES with n * chunks <= EBAG_MAX_BLOCKS
    (1 where none does)."""
    c = 1
    while n * c * 2 <= EBAG_MAX_BLOCKS and b % (c * 2) == 0 and b // (c * 2) >= EBAG_MIN_BLOCK_SAMPLES:
        c *= 2
    return c


def ebag_args(n: int, t: int, rows: int, dim: int, b: int, pooling: int, ranks_here: int) -> Tuple[int, ...]:
    """(ranks, tables, rows, dim, samples per rank, pooling, chunks, bf16 flag (unused: dtype says),
    compute TBs)."""
    chunks = ebag_chunks(n, b)
    return (n, t, rows, dim, b, pooling, chunks, 0, compute_tbs(n * chunks, ranks_here))


__all__ = ["fused_program", "compute_tbs", "ebag_chunks", "ebag_args", "EBAG_MAX_BLOCKS", "EBAG_MIN_BLOCK_SAMPLES"]
