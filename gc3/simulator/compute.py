"""Compute steps on the CPU, and the unfused reference a fused program is checked against.

A fused IR (`gc3.ir.ComputeSpec`) names per-rank compute inputs instead of
taking the collective's input buffer from the caller.  Here they are made
(seeded, exactly representable in the operator's dtype), a `gemv` step is
evaluated as the interpreter would (inputs in bf16/fp16/fp32, fp32
accumulation, the result rounded to the dtype, laid out column block by column
block), and the expected output is computed the *unfused* way: each rank's
x_r @ w_r on its own, rounded as that kernel would store it, then summed across
ranks, as a GEMV followed by an NCCL AllReduce would.

Tolerance: the fused and unfused results differ by rounding only (the order
of the cross-rank sum, the dtype's rounding of partial sums), which is bounded
by a few ulps of the *magnitudes* added, not of the result: an element that
cancels to about zero may carry an absolute error of an ulp of its largest
partial.  So an element passes when |got - expected| <= rtol * sum_r |y_r|
(+ a tiny atol), rtol = 2e-2 for bf16 (issue 16's figure), and finer for
wider types.  A wrong column (a shifted step) changes values by their own
magnitude, far outside that bound.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..dtypes import dtype_info
from ..ir import ComputeSpec, Program, Step

# rtol against the sum of the partial magnitudes, per dtype.
RTOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5, "float64": 1e-12}


def make_compute_inputs(spec: ComputeSpec, nranks: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """Per rank, each named input: small integers over 8 (exact in bf16), signed so sums cancel."""
    rng = np.random.default_rng(seed)
    dt = dtype_info(spec.dtype).np
    return [{name: (rng.integers(-8, 9, size=shape) / 8.0).astype(dt) for name, shape in spec.inputs}
            for _ in range(nranks)]


def _blocks(y: np.ndarray, nblocks: int) -> np.ndarray:
    """[batch, cols] -> the buffer layout: nblocks column blocks, each row-major."""
    batch, cols = y.shape
    return y.reshape(batch, nblocks, cols // nblocks).transpose(1, 0, 2).reshape(-1)


def gemv_tile(spec: ComputeSpec, inputs: Dict[str, np.ndarray], st: Step, cs: int) -> Tuple[np.ndarray, str]:
    """The tile a gemv step writes (cnt chunks of cs lanes), or (None, why) when its operands cannot be
    evaluated.  Columns are taken as the step says, so a wrong range computes wrong data."""
    batch, _, n = spec.gemv_dims()
    args = st.compute
    x, w = (inputs[name] for name in args.inputs)
    a, b = args.col0, args.col1
    if not 0 <= a < b <= n:
        return None, f"columns [{a}, {b}) are outside y's {n} columns"
    if (b - a) % st.cnt or batch * (b - a) != st.cnt * cs:
        return None, (f"columns [{a}, {b}) x batch {batch} do not fill {st.cnt} chunk(s) of {cs} elements")
    y = x.astype(np.float32) @ w[:, a:b].astype(np.float32)       # fp32 accumulation
    return _blocks(y, st.cnt).astype(x.dtype), ""


def fused_reference(prog: Program, inputs: Sequence[Dict[str, np.ndarray]], chunks: int):
    """(expected buffer, per-element tolerance) of the unfused operator, the same on every rank."""
    spec = prog.compute
    dt = dtype_info(spec.dtype).np
    partial = [(d["x"].astype(np.float32) @ d["w"].astype(np.float32)).astype(dt) for d in inputs]
    total = np.sum([p.astype(np.float64) for p in partial], axis=0)
    scale = np.sum([np.abs(p.astype(np.float64)) for p in partial], axis=0)
    tol = RTOL.get(spec.dtype, 2e-2) * scale + 1e-6
    return _blocks(total, chunks), _blocks(tol, chunks)
