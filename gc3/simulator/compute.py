"""Compute steps on the CPU, and the unfused reference a fused program is checked against.

A fused IR (`gc3.ir.ComputeSpec`) names per-rank compute inputs instead of
taking the collective's input buffer from the caller.  Here they are made
(seeded, exactly representable in the operator's dtype), a compute step is
evaluated as the interpreter would (float inputs in bf16/fp16/fp32, fp32
accumulation, the result rounded to the dtype, laid out as `ComputeSpec`
says), and the expected output is computed the *unfused* way: each rank's
operator on its own, rounded as that kernel would store it, then the
collective on those results, as the operator followed by an NCCL call would.

One table, `OPERATORS`, says per operator how to make its inputs, evaluate a
range of its split axis, and compute the unfused reference; everything else
(range checks, dtype handling, the comparison) is shared.

* gemv + AllReduce: x_r @ w_r per rank, summed across ranks.
* ebag + AllToAll: each rank pools its T tables (sum) for the whole global
  batch, [B, T*dim]; rank p then receives every rank's rows of its slice
  p*b .. (p+1)*b, rank-major: its output is [N, b, T*dim]
  (gc3.collectives.EmbeddingBagAllToAll).
* gemm + ReduceScatter / AllReduce / AllToAll: C_r = a_r @ b_r per rank, split
  by rows; summed across ranks and scattered by row slices (ReduceScatter) or
  kept whole (AllReduce), or each rank's row slice p sent to rank p
  (AllToAll, rank-major like ebag).  With `accum="float32"` (ComputeSpec) the
  partials are not rounded before the sum: the reference is the exact sum,
  held to float32's tolerance, which per-hop rounding to bf16 would exceed.

Tolerance: the fused and unfused results differ by rounding only (the order
of the cross-rank sum, the dtype's rounding of partial sums), which is bounded
by a few ulps of the *magnitudes* added, not of the result: an element that
cancels to about zero may carry an absolute error of an ulp of its largest
partial.  So an element passes when |got - expected| <= rtol * (sum of the
magnitudes added) (+ a tiny atol), rtol = 2e-2 for bf16 (bf16's 8-bit mantissa),
and finer for wider types.  A wrong range (a shifted step) changes values by
their own magnitude, far outside that bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..dtypes import dtype_info
from ..ir import ComputeSpec, Step

# rtol against the sum of the partial magnitudes, per dtype.
RTOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5, "float64": 1e-12}


def _values(rng, shape, dt):
    """Small integers over 8 (exact in bf16), signed so sums cancel."""
    return (rng.integers(-8, 9, size=shape) / 8.0).astype(dt)


def _blocks(y: np.ndarray, nblocks: int) -> np.ndarray:
    """[batch, cols] -> the gemv buffer layout: nblocks column blocks, each row-major."""
    batch, cols = y.shape
    return y.reshape(batch, nblocks, cols // nblocks).transpose(1, 0, 2).reshape(-1)


# --- gemv: y = x @ w, split by columns, AllReduce ---------------------------------------
def _gemv_make(spec: ComputeSpec, rng) -> Dict[str, np.ndarray]:
    dt = dtype_info(spec.dtype).np
    return {name: _values(rng, shape, dt) for name, shape in spec.inputs}


def _gemv_tile(spec: ComputeSpec, args, a: int, b: int, cnt: int) -> np.ndarray:
    x, w = args
    return _blocks(x.astype(np.float32) @ w[:, a:b].astype(np.float32), cnt)     # fp32 accumulation


def _gemv_reference(spec: ComputeSpec, inputs, chunks: int, coll: str):
    dt = dtype_info(spec.dtype).np
    partial = [(d["x"].astype(np.float32) @ d["w"].astype(np.float32)).astype(dt) for d in inputs]
    total = np.sum([p.astype(np.float64) for p in partial], axis=0)
    scale = np.sum([np.abs(p.astype(np.float64)) for p in partial], axis=0)
    want = (_blocks(total, chunks), _blocks(RTOL.get(spec.dtype, 2e-2) * scale + 1e-6, chunks))
    return [want] * len(inputs)


# --- ebag: pooled embedding bags, split by samples, AllToAll -----------------------------
def _ebag_make(spec: ComputeSpec, rng) -> Dict[str, np.ndarray]:
    t, rows, dim, nnz, batch = spec.ebag_dims()
    offsets = np.sort(rng.integers(0, nnz + 1, size=(t, batch + 1)), axis=1)   # some bags empty
    offsets[:, 0], offsets[:, -1] = 0, nnz
    return {"tables": _values(rng, (t, rows, dim), dtype_info(spec.dtype).np),
            "indices": rng.integers(0, rows, size=(t, nnz)).astype(np.int32),
            "offsets": offsets.astype(np.int32)}


def _pool(tables: np.ndarray, indices: np.ndarray, offsets: np.ndarray, a: int, b: int) -> np.ndarray:
    """Sum-pooled bags of samples [a, b) of every table, fp32: [b - a, T*dim] row-major."""
    t_count, _, dim = tables.shape
    out = np.zeros((b - a, t_count, dim), np.float32)
    for t in range(t_count):
        seg = offsets[t, a:b + 1].astype(np.int64)
        bag = np.repeat(np.arange(b - a), np.diff(seg))
        np.add.at(out[:, t], bag, tables[t][indices[t, seg[0]:seg[-1]]].astype(np.float32))
    return out.reshape(b - a, t_count * dim)


def _ebag_tile(spec: ComputeSpec, args, a: int, b: int, cnt: int) -> np.ndarray:
    return _pool(*args, a, b).reshape(-1)      # samples are rows: a range is already chunk order


def _ebag_reference(spec: ComputeSpec, inputs, chunks: int, coll: str):
    """Pool locally (the whole global batch, stored in the dtype), then AllToAll by sample slice."""
    dt = dtype_info(spec.dtype).np
    _, _, _, _, batch = spec.ebag_dims()
    n = len(inputs)
    b = batch // n
    pooled = [_pool(d["tables"], d["indices"], d["offsets"], 0, batch).astype(dt).astype(np.float64)
              for d in inputs]
    scale = [_pool(np.abs(d["tables"]), d["indices"], d["offsets"], 0, batch).astype(np.float64) for d in inputs]
    rtol = RTOL.get(spec.dtype, 2e-2)
    return [(np.concatenate([pooled[r][p * b:(p + 1) * b].reshape(-1) for r in range(n)]),
             np.concatenate([rtol * scale[r][p * b:(p + 1) * b].reshape(-1) + 1e-6 for r in range(n)]))
            for p in range(n)]


# --- gemm: C = a @ b, split by rows; ReduceScatter, AllReduce or AllToAll ------------------
def _gemm_tile(spec: ComputeSpec, args, a: int, b: int, cnt: int) -> np.ndarray:
    x, w = args
    return (x[a:b].astype(np.float32) @ w.astype(np.float32)).reshape(-1)     # rows are contiguous


def _gemm_reference(spec: ComputeSpec, inputs, chunks: int, coll: str):
    """Each rank's C_r as one GEMM would store it (fp32 when the buffers carry fp32 partials,
    else rounded to the dtype), then the collective on those, summed in float64."""
    store = dtype_info(spec.buffer_dtype).np
    n = len(inputs)
    parts = [(d["a"].astype(np.float32) @ d["b"].astype(np.float32)).astype(store).astype(np.float64)
             for d in inputs]
    rtol = RTOL.get(spec.buffer_dtype, 2e-2)
    rows = parts[0].shape[0] // n
    if coll == "alltoall" and spec.splits:
        return _gemm_alltoallv(spec, parts, rtol)
    if coll == "alltoall":
        return [(np.concatenate([parts[r][p * rows:(p + 1) * rows].reshape(-1) for r in range(n)]),
                 np.concatenate([rtol * np.abs(parts[r][p * rows:(p + 1) * rows]).reshape(-1) + 1e-6
                                 for r in range(n)]))
                for p in range(n)]
    total = np.sum(parts, axis=0)
    tol = rtol * np.sum(np.abs(parts), axis=0) + 1e-6
    if coll == "allreduce":
        return [(total.reshape(-1), tol.reshape(-1))] * n
    return [(total[p * rows:(p + 1) * rows].reshape(-1), tol[p * rows:(p + 1) * rows].reshape(-1))
            for p in range(n)]          # reducescatter: rank p's row slice


# --- agemm: AllGather + GEMM, C_r = concat_p(A_p) @ b_r from the A blocks that arrived -------
def _agemm_make(spec: ComputeSpec, rng) -> Dict[str, np.ndarray]:
    return _gemv_make(spec, rng)        # a is [M, K]: rank r's input is its own rows of it


def _padded(rows: np.ndarray, lanes: int, nchunks: int) -> np.ndarray:
    """Row blocks of `rows` [R*nchunks, w] in the agemm chunk grid: each block from its chunk's start."""
    out = np.zeros((nchunks, lanes), rows.dtype)
    block = rows.reshape(nchunks, -1)
    out[:, :block.shape[1]] = block
    return out.reshape(-1)


def _agemm_rows(spec: ComputeSpec, a: np.ndarray, rank: int, nranks: int) -> np.ndarray:
    m = spec.gemm_dims()[0] // nranks
    return a[rank * m:(rank + 1) * m]


def _agemm_tile(spec: ComputeSpec, args, a: int, b: int, cnt: int, operand: np.ndarray) -> np.ndarray:
    (w,) = args
    _, k, n = spec.gemm_dims()
    lanes = operand.size // cnt
    rows = (b - a) // cnt
    blocks = operand.reshape(cnt, lanes)[:, :rows * k].reshape(cnt * rows, k)
    return _padded(blocks.astype(np.float32) @ w.astype(np.float32), lanes, cnt)


def _agemm_reference(spec: ComputeSpec, inputs, chunks: int, coll: str):
    """Gather every rank's A rows, then each rank's GEMM with its own b, rounded once; with return_a
    the gathered A follows, bit-exact (tolerance 0: a copy).  Padding lanes are not checked
    (tolerance infinite)."""
    dt = dtype_info(spec.dtype).np
    n = len(inputs)
    m, k, cols = spec.gemm_dims()
    lanes = (m // (n * chunks)) * max(k, cols)
    a = np.concatenate([_agemm_rows(spec, d["a"], r, n) for r, d in enumerate(inputs)])

    def grid(values, tol):
        t = _padded(np.full(values.shape, tol), lanes, n * chunks)
        t[_padded(np.ones(values.shape), lanes, n * chunks) == 0] = np.inf
        return _padded(values.astype(np.float64), lanes, n * chunks), t
    gathered = grid(a.astype(dt), 0.0) if spec.return_a else None
    out = []
    for d in inputs:
        c = grid((a.astype(np.float32) @ d["b"].astype(np.float32)).astype(dt), 1e-6)
        out.append(c if gathered is None else tuple(np.concatenate(pair) for pair in zip(c, gathered)))
    return out


def initial_buffer(spec: ComputeSpec, inputs: Dict[str, np.ndarray], rank: int, nranks: int, elems: int,
                   cs: int, dt) -> np.ndarray:
    """Rank `rank`'s input buffer of a fused call (chunks of `cs` lanes): poison (NaN) for the operators
    that fill it, the rank's A rows in the chunk grid for agemm."""
    if spec.op != "agemm" or not cs:
        return np.full(elems, np.nan, dtype=dt)
    return _padded(_agemm_rows(spec, inputs["a"], rank, nranks), cs, elems // cs).astype(dt)


def _gemm_alltoallv(spec: ComputeSpec, parts, rtol: float):
    """Skewed split: rank p gets splits[p] row blocks of every rank's C, rank-major, each rank's
    slice padded to max(splits) blocks (padding unchecked: infinite tolerance)."""
    n, c = len(parts), max(spec.splits)
    R = parts[0].shape[0] // sum(spec.splits)
    cols = parts[0].shape[1]
    off = np.concatenate([[0], np.cumsum(spec.splits)]) * R
    out = []
    for p in range(n):
        want = np.zeros((n, c * R, cols))
        tol = np.full((n, c * R, cols), np.inf)
        for r in range(n):
            rows = parts[r][off[p]:off[p + 1]]
            want[r, :len(rows)] = rows
            tol[r, :len(rows)] = rtol * np.abs(rows) + 1e-6
        out.append((want.reshape(-1), tol.reshape(-1)))
    return out


@dataclass(frozen=True)
class Operator:
    colls: Tuple[str, ...]  # the collectives it is fused with (whose unfused reference follows it)
    make: Callable          # (spec, rng) -> {input name: array} of one rank
    tile: Callable          # (spec, input arrays in the step's order, col0, col1, cnt) -> fp32 tile
    reference: Callable     # (spec, every rank's inputs, chunks per block, collective) -> [(expected, tol)]


# Keyed by operator (= opcode) name: tests/test_opcode_coverage.py checks every compute row has one.
OPERATORS = {
    "gemv": Operator(("allreduce",), _gemv_make, _gemv_tile, _gemv_reference),
    "ebag": Operator(("alltoall",), _ebag_make, _ebag_tile, _ebag_reference),
    "gemm": Operator(("reducescatter", "allreduce", "alltoall"), _gemv_make, _gemm_tile, _gemm_reference),
    "agemm": Operator(("allgather_gemm",), _agemm_make, _agemm_tile, _agemm_reference),
}


def make_compute_inputs(spec: ComputeSpec, nranks: int, seed: int) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [OPERATORS[spec.op].make(spec, rng) for _ in range(nranks)]


def compute_tile(spec: ComputeSpec, inputs: Dict[str, np.ndarray], st: Step, cs: int,
                 operand: Optional[np.ndarray] = None) -> Tuple[np.ndarray, str]:
    """The tile a compute step writes (cnt chunks of cs lanes), or (None, why) when its operands cannot be
    evaluated.  The range is taken as the step says, so a wrong range computes wrong data; `operand`:
    the chunks an agemm step read (its A rows), whose rows must be the ones it writes into the output."""
    axis, n, unit = spec.split()
    a, b = st.compute.col0, st.compute.col1
    if not 0 <= a < b <= n:
        return None, f"{axis}s [{a}, {b}) are outside the operator's {n} {axis}s"
    if (b - a) % st.cnt or unit * (b - a) != st.cnt * cs:
        return None, f"{axis}s [{a}, {b}) x {unit} elements do not fill {st.cnt} chunk(s) of {cs} elements"
    if any(name not in inputs for name in st.compute.inputs):
        return None, f"reads inputs {','.join(st.compute.inputs)}; the operator has {','.join(inputs)}"
    args = [inputs[name] for name in st.compute.inputs]
    if operand is None:
        tile = OPERATORS[spec.op].tile(spec, args, a, b, st.cnt)
    else:
        rows = (b - a) // st.cnt
        if st.dstbuf == "o" and a != st.dstoff * rows:
            return None, f"writes rows [{a}, {b}) into output chunk {st.dstoff}, which holds rows from {st.dstoff * rows}"
        tile = OPERATORS[spec.op].tile(spec, args, a, b, st.cnt, operand)
    return tile.astype(dtype_info(spec.buffer_dtype).np), ""


def fused_reference(spec: ComputeSpec, inputs: Sequence[Dict[str, np.ndarray]], chunks: int, coll: str):
    """Per rank, (expected buffer, per-element tolerance) of the unfused operator then its collective."""
    return OPERATORS[spec.op].reference(spec, inputs, chunks, coll)
