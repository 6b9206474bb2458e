"""Element types and reduction operators that gc3 collectives support.

The simulator, the numpy reference and the CUDA runtime all take their dtype
and op names from here, so a name means the same thing everywhere.  bfloat16
comes from ml_dtypes (numpy has none); its numpy `kind` is 'V', so code must
ask `is_float()` rather than look at `dtype.kind`.

Tolerances live in `TOLERANCES` and nowhere else.  They are for comparing a
collective's result with the numpy reference: integer types must match
exactly (wrap-around included); float types may differ by reduction order,
bounded by a few ulps per rank.  `make_inputs` in gc3.simulator.reference produces data
(small integers) for which every order is exact, so on that data a correct
schedule matches with zero error and any tolerance only matters for user data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import ml_dtypes
import numpy as np

from .errors import GC3Error


class DtypeError(GC3Error):
    """An unknown dtype or reduction-op name."""


@dataclass(frozen=True)
class DtypeInfo:
    name: str
    np: np.dtype
    is_float: bool
    # Largest integer magnitude the type represents exactly (every integer in
    # [-exact, exact], or [0, exact] for unsigned types, is representable):
    # sums of inputs stay below it.
    exact: int
    nccl: str           # the ncclDataType_t enumerator name
    # Whether the type has negative values: input generators draw from
    # [-m/2, m/2] for signed types and [0, m] for unsigned ones.
    signed: bool = True


DTYPES: Dict[str, DtypeInfo] = {
    "float16": DtypeInfo("float16", np.dtype(np.float16), True, 2 ** 11, "ncclFloat16"),
    "bfloat16": DtypeInfo("bfloat16", np.dtype(ml_dtypes.bfloat16), True, 2 ** 8, "ncclBfloat16"),
    "float32": DtypeInfo("float32", np.dtype(np.float32), True, 2 ** 24, "ncclFloat32"),
    "float64": DtypeInfo("float64", np.dtype(np.float64), True, 2 ** 53, "ncclFloat64"),
    "int32": DtypeInfo("int32", np.dtype(np.int32), False, 2 ** 31 - 1, "ncclInt32"),
    "int64": DtypeInfo("int64", np.dtype(np.int64), False, 2 ** 63 - 1, "ncclInt64"),
    "uint8": DtypeInfo("uint8", np.dtype(np.uint8), False, 255, "ncclUint8", signed=False),
    "int8": DtypeInfo("int8", np.dtype(np.int8), False, 127, "ncclInt8"),
    "uint32": DtypeInfo("uint32", np.dtype(np.uint32), False, 2 ** 32 - 1, "ncclUint32", signed=False),
    "uint64": DtypeInfo("uint64", np.dtype(np.uint64), False, 2 ** 64 - 1, "ncclUint64", signed=False),
}

_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32",
            "fp32": "float32", "double": "float64", "fp64": "float64", "int": "int32"}

# Reduction ops as numpy ufuncs (elementwise, same dtype in and out).
OPS: Dict[str, np.ufunc] = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    # NCCL's ncclAvg: steps sum; the result is then divided by the rank count
    # (gc3.ir.epilogue.avg_divide has NCCL's rule per dtype).
    "avg": np.add,
}

# (rtol, atol) per dtype for `allclose(got, expected)`.  Float rows allow
# roughly 4-8 ulps of relative error, enough for a different summation order
# over a handful of ranks; atol covers results that cancel to about zero.
TOLERANCES: Dict[str, Tuple[float, float]] = {
    "float16": (4e-3, 1e-3),
    "bfloat16": (3e-2, 1e-2),
    "float32": (1e-5, 1e-6),
    "float64": (1e-12, 1e-14),
    "int32": (0.0, 0.0),
    "int64": (0.0, 0.0),
    "uint8": (0.0, 0.0),
    "int8": (0.0, 0.0),
    "uint32": (0.0, 0.0),
    "uint64": (0.0, 0.0),
}


def dtype_info(name) -> DtypeInfo:
    """Look a dtype up by gc3 name, alias, or numpy dtype."""
    if isinstance(name, DtypeInfo):
        return name
    if not isinstance(name, str):
        dt = np.dtype(name)
        for info in DTYPES.values():
            if info.np == dt:
                return info
        raise DtypeError(f"unsupported dtype {dt}; gc3 supports {', '.join(DTYPES)}")
    key = _ALIASES.get(name, name)
    if key not in DTYPES:
        raise DtypeError(f"unknown dtype {name!r}; gc3 supports {', '.join(DTYPES)}")
    return DTYPES[key]


def np_dtype(name) -> np.dtype:
    return dtype_info(name).np


def reduce_op(name: str) -> np.ufunc:
    if name not in OPS:
        raise DtypeError(f"unknown reduction op {name!r}; gc3 supports {', '.join(OPS)}")
    return OPS[name]


def tolerance(name) -> Tuple[float, float]:
    return TOLERANCES[dtype_info(name).name]


def mismatches(got: np.ndarray, expected: np.ndarray, dtype) -> np.ndarray:
    """Indices where `got` differs from `expected` beyond the dtype's tolerance
    (NaN equals NaN, infinities must match exactly)."""
    info = dtype_info(dtype)
    if got.shape != expected.shape:
        raise ValueError(f"shape {got.shape} != expected {expected.shape}")
    if not info.is_float:
        return np.flatnonzero(got != expected)
    rtol, atol = TOLERANCES[info.name]
    g = got.astype(np.float64)
    e = expected.astype(np.float64)
    return np.flatnonzero(~np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True))
