"""The numbers the host and the kernel must agree on, read from the kernel's
own header (kernels/common.cuh) so that they are written down once."""
from __future__ import annotations

import re
from typing import Dict

from gc3.dtypes import DTYPES
from gc3.ir.opcodes import DEVICE_OPCODES

from .. import KERNEL_DIR

_DEFINE = re.compile(r"^#define\s+(GC3_[A-Z0-9_]+)\s+\(?(-?\d+)\)?", re.M)


def _read_constants() -> Dict[str, int]:
    text = (KERNEL_DIR / "common.cuh").read_text()
    return {name: int(value) for name, value in _DEFINE.findall(text)}


C: Dict[str, int] = _read_constants()

OPCODE = {t: C[f"GC3_OP_{t.upper()}"] for t in DEVICE_OPCODES}   # the opcodes the kernel executes
OPNAME = {v: k for k, v in OPCODE.items()}
BUF = {"i": C["GC3_BUF_I"], "o": C["GC3_BUF_O"], "s": C["GC3_BUF_S"], None: C["GC3_BUF_NONE"]}
# Every gc3 dtype has a kernel build: a name without its GC3_DT_ code fails here, at import.
DTYPE = {name: C[f"GC3_DT_{name.upper()}"] for name in DTYPES}
REDOP = {name: C[f"GC3_RED_{name.upper()}"] for name in ("sum", "prod", "max", "min")}
PROTO = {"Simple": C["GC3_PROTO_SIMPLE"], "LL": C["GC3_PROTO_LL"], "LL128": C["GC3_PROTO_LL128"]}

TB_NFIELDS = C["GC3_TB_NFIELDS"]
ST_NFIELDS = C["GC3_ST_NFIELDS"]
CONN_NFIELDS = C["GC3_CONN_NFIELDS"]
ERR_NFIELDS = C["GC3_ERR_NFIELDS"]


def _plan_fields() -> tuple:
    """Field names of `struct Plan` (all 8 bytes wide) in declaration order."""
    text = (KERNEL_DIR / "common.cuh").read_text()
    body = text[text.index("struct Plan {"):].split("};")[0]
    body = re.sub(r"//.*", "", body)
    return tuple(re.findall(r"(\w+);", body))


PLAN_FIELDS = _plan_fields()
# Progress values pack (epoch, tile, step): see progress_value() in sync.cuh.
STEP_BITS = 11
TILE_BITS = 21


def field(prefix: str, name: str) -> int:
    return C[f"GC3_{prefix}_{name.upper()}"]
