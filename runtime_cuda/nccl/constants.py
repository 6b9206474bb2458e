"""NCCL's datatype and reduction-op codes, with the same values as
`cupy.cuda.nccl` (they are NCCL's own enum values), and their gc3 names.

Kept free of cupy so that selection and its tests run on machines without a GPU.
"""
from __future__ import annotations

import numpy as np

NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9

NCCL_SUM = 0
NCCL_PROD = 1
NCCL_MAX = 2
NCCL_MIN = 3
NCCL_AVG = 4

# NCCL datatype code -> gc3 dtype name (numpy spelling; bfloat16 via ml_dtypes).
DTYPE_NAMES = {
    NCCL_INT8: "int8", NCCL_UINT8: "uint8", NCCL_INT32: "int32", NCCL_UINT32: "uint32",
    NCCL_INT64: "int64", NCCL_UINT64: "uint64", NCCL_FLOAT16: "float16",
    NCCL_FLOAT32: "float32", NCCL_FLOAT64: "float64", NCCL_BFLOAT16: "bfloat16",
}
DTYPE_CODES = {name: code for code, name in DTYPE_NAMES.items()}
ITEMSIZE = {
    NCCL_INT8: 1, NCCL_UINT8: 1, NCCL_INT32: 4, NCCL_UINT32: 4, NCCL_INT64: 8,
    NCCL_UINT64: 8, NCCL_FLOAT16: 2, NCCL_FLOAT32: 4, NCCL_FLOAT64: 8, NCCL_BFLOAT16: 2,
}

OP_NAMES = {NCCL_SUM: "sum", NCCL_PROD: "prod", NCCL_MAX: "max", NCCL_MIN: "min", NCCL_AVG: "avg"}
OP_CODES = {name: code for code, name in OP_NAMES.items()}


def dtype_name(code: int) -> str:
    try:
        return DTYPE_NAMES[code]
    except KeyError:
        raise ValueError(f"unknown NCCL datatype code {code} (known: {sorted(DTYPE_NAMES)})") from None


def op_name(code: int) -> str:
    try:
        return OP_NAMES[code]
    except KeyError:
        raise ValueError(f"unknown NCCL reduction op code {code} (known: {sorted(OP_NAMES)})") from None


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def code_of_dtype(dtype) -> int:
    """NCCL datatype code of a numpy/cupy dtype."""
    name = np.dtype(dtype).name
    try:
        return DTYPE_CODES[name]
    except KeyError:
        raise ValueError(f"dtype {name} has no NCCL datatype (supported: {', '.join(DTYPE_CODES)})") from None


def code_of_op(op) -> int:
    """NCCL op code from a name ('sum') or a code (NCCL_SUM)."""
    if isinstance(op, str):
        try:
            return OP_CODES[op.lower()]
        except KeyError:
            raise ValueError(f"unknown reduction op {op!r} (supported: {', '.join(OP_CODES)})") from None
    op_name(op)
    return int(op)
