"""Inputs and float64 references for checking the GEMM fusions on a GPU
(the GPU check program and the benchmark share them).

Inputs are drawn per (seed, rank, name), so every process can rebuild any
rank's inputs and compute the whole reference itself; the reference is the
unfused result in float64 of the same (bf16) inputs, and a result passes when
every element is within 2e-2 of it relatively, with an absolute floor of
1e-3 of the largest reference magnitude (elements that cancel to ~0 carry
the rounding of their large terms).  NaN (the poison) never passes.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .memory_bound import from_f32, storage, to_f32, value_dtype

RTOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}
FLOOR = 1e-3


def to_float(x):
    """float32 values of a device matrix (a uint16 one holds bf16 bits, widened exactly)."""
    return to_f32(x, value_dtype(x, "to_float"))


def from_float(x, dtype: str):
    """Round `x` to `dtype`'s storage (bf16: nearest even, NaN kept NaN)."""
    import cupy

    return from_f32(x.astype(cupy.float32), dtype)


def matrix(seed: int, rank: int, name: str, shape, dtype: str, stream=None):
    """A standard-normal matrix scaled by 1/sqrt(columns of A), the same in every process."""
    import cupy
    import numpy as np

    from runtime_cuda.core import streams

    key = [seed, rank, sum(ord(c) * 131 ** i for i, c in enumerate(name)) % (1 << 31)]
    with streams.current(stream if stream is not None else cupy.cuda.get_current_stream()):
        rs = cupy.random.RandomState(int(np.random.SeedSequence(key).generate_state(1)[0]))
        x = rs.standard_normal(shape, dtype=cupy.float32)
        return from_float(x, dtype)


def poison(shape, dtype: str):
    """An output buffer full of NaN, so that anything the operator misses shows."""
    import cupy

    return cupy.full(shape, 0x7FC0 if dtype == "bfloat16" else float("nan"), dtype=storage(dtype))


def f64(x):
    import cupy

    return to_float(x).astype(cupy.float64)


def reduce_scatter_ref(As: Sequence, Bs: Sequence):
    return sum(f64(a) @ f64(b) for a, b in zip(As, Bs))


# The unit roundoff of each 16-bit type (round to nearest: half an ulp at 1.0).
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}


def partials_slack(As: Sequence, Bs: Sequence, dtype: str):
    """What rounding each rank's partial product A_s @ B_s to `dtype` before the sum may add
    (GC3_FUSED_PARTIALS=input, or the plain path: matmul in `dtype`, then the collective):
    sum_s |A_s @ B_s| times the unit roundoff, per element."""
    return UNIT[dtype] * sum(abs(f64(a) @ f64(b)) for a, b in zip(As, Bs))


def all_gather_ref(As: Sequence, B):
    import cupy

    return cupy.concatenate([f64(a) for a in As]) @ f64(B)


def all_to_all_ref(As: Sequence, Bs: Sequence, splits: Sequence[Sequence[int]], dest: int):
    import cupy

    blocks = []
    for s, (a, b) in enumerate(zip(As, Bs)):
        off = sum(splits[s][:dest])
        blocks.append(f64(a[off:off + splits[s][dest]]) @ f64(b))
    return cupy.concatenate(blocks)


def mismatch(got, ref, dtype: str, what: str, slack=0) -> Optional[str]:
    """None when `got` matches the float64 reference `ref` within the tolerance plus
    `slack` (per element, or one number), else where it does not."""
    import cupy

    if tuple(got.shape) != tuple(ref.shape):
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    g = f64(got)
    tol = RTOL[dtype] * cupy.abs(ref) + FLOOR * float(cupy.abs(ref).max()) + slack if ref.size else 0
    bad = ~(cupy.abs(g - ref) <= tol)
    nbad = int(bad.sum())
    if not nbad:
        return None
    i = [int(v) for v in cupy.argwhere(bad)[0]]
    return (f"{what}: {nbad} of {ref.size} elements wrong, first at {tuple(i)}: got {float(g[tuple(i)])}, "
            f"expected {float(ref[tuple(i)])}")

