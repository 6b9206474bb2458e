"""The step opcodes, stated once: one row per opcode with its properties.

Every layer derives what it needs from this table instead of listing opcode
names: the IR's operand roles (`program.local_input`), the compiler's sets
(`RECVS`, `SENDS`, `FUSED`, `SEND_FUSION`), the verifier's and simulator's
step semantics (tables keyed by opcode, checked against this one by
tests/test_opcode_coverage.py) and the runtime's opcode numbers
(`runtime_cuda/core/abi.py` reads `DEVICE_OPCODES`; `runtime_cuda/core/tables.py` refuses
`NOT_ON_DEVICE`).  Adding an opcode starts with a
row here; the coverage test then names every layer that lacks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional


@dataclass(frozen=True)
class OpcodeInfo:
    recv: bool                  # consumes one tile from the TB's recv connection
    send: bool                  # produces one tile on the TB's send connection
    reduce: bool                # combines two operands with the reduction op
    writes: bool                # stores into its local dst operand
    local_in: Optional[str] = None   # the local operand it reads: "src", or "acc" (src in gc3's
                                     # convention, dst in msccl-tools'), or None
    reads_dst: bool = False     # also reads its dst (a local reduction into dst)
    device: bool = True         # the interpreter kernel has an opcode for it (GC3_OP_*)
    send_fusion: Optional[str] = None   # the opcode it becomes when its result is also sent on
    folded: bool = False        # not executed but removed by the runtime (a nop only waits, so its
                                # waits move onto the next step); a non-device step not folded makes
                                # the runtime refuse the IR
    compute: Optional[str] = None   # the operator a compute step evaluates from the program's named
                                    # compute inputs (<compute> in the XML) into its dst chunks


# In the order MSCCL documents them.
OPCODES: Dict[str, OpcodeInfo] = {
    "s": OpcodeInfo(recv=False, send=True, reduce=False, writes=False, local_in="src"),
    "r": OpcodeInfo(recv=True, send=False, reduce=False, writes=True, send_fusion="rcs"),
    "rcs": OpcodeInfo(recv=True, send=True, reduce=False, writes=True),
    "rrc": OpcodeInfo(recv=True, send=False, reduce=True, writes=True, local_in="acc", send_fusion="rrcs"),
    "rrs": OpcodeInfo(recv=True, send=True, reduce=True, writes=False, local_in="acc"),
    "rrcs": OpcodeInfo(recv=True, send=True, reduce=True, writes=True, local_in="acc"),
    "cpy": OpcodeInfo(recv=False, send=False, reduce=False, writes=True, local_in="src"),
    "re": OpcodeInfo(recv=False, send=False, reduce=True, writes=True, local_in="src", reads_dst=True),
    "nop": OpcodeInfo(recv=False, send=False, reduce=False, writes=False, device=False, folded=True),
    # gc3 extension (a fused="1" IR): dst chunks <- columns [col0, col1) of x @ w for this rank's
    # shard (runtime_cuda/kernels/prims_compute.cuh).
    "gemv": OpcodeInfo(recv=False, send=False, reduce=False, writes=True, compute="gemv"),
    # gc3 extension: dst chunks <- pooled rows (samples [col0, col1)) of this rank's embedding
    # tables (embedding-bag sum).
    "ebag": OpcodeInfo(recv=False, send=False, reduce=False, writes=True, compute="ebag"),
    # gc3 extension: dst chunks <- rows [col0, col1) of a @ b for this rank's operands.  The
    # device side is host-driven cuBLAS chunks outside the interpreter, so the interpreter refuses it.
    "gemm": OpcodeInfo(recv=False, send=False, reduce=False, writes=True, device=False, compute="gemm"),
    # gc3 extension: dst chunks <- (the A rows its src chunks hold) @ b: the GEMM of a chunk that
    # arrived (AllGather + GEMM), so unlike the producers above it reads a chunk.  CPU only.
    "agemm": OpcodeInfo(recv=False, send=False, reduce=False, writes=True, local_in="src", device=False,
                        compute="agemm"),
}

# --- what each opcode computes: the normative meaning of a step -----------------
# One statement for every reader: the simulator applies it to numpy tiles, the
# semantic checker to symbols.  value(reduce, read, src, dst, received, computed)
# -> what the step writes to dst and/or sends; None: the step moves no data.
# `read(buf, off)` reads the step's `cnt` chunks, `received` is what arrived (None
# for steps that receive nothing), `computed()` is a compute step's result, `computed(operand)`
# that of one that reads a chunk.
STEP_VALUE = {
    "s": lambda red, read, src, dst, got, computed: read(*src),
    "r": lambda red, read, src, dst, got, computed: got,
    "rcs": lambda red, read, src, dst, got, computed: got,
    "rrc": lambda red, read, src, dst, got, computed: red(got, read(*src)),
    "rrs": lambda red, read, src, dst, got, computed: red(got, read(*src)),
    "rrcs": lambda red, read, src, dst, got, computed: red(got, read(*src)),
    "cpy": lambda red, read, src, dst, got, computed: read(*src),
    "re": lambda red, read, src, dst, got, computed: red(read(*dst), read(*src)),
    "nop": None,
    "gemv": lambda red, read, src, dst, got, computed: computed(),
    "ebag": lambda red, read, src, dst, got, computed: computed(),
    "gemm": lambda red, read, src, dst, got, computed: computed(),
    "agemm": lambda red, read, src, dst, got, computed: computed(read(*src)),
}

# A step's epilogue (gc3.ir.epilogue, the step's `epilogue` attribute) transforms the value
# STEP_VALUE gives before it is stored into dst, and only that store: a tile the step also
# sends leaves raw.  So only opcodes that store may carry one (EPILOGUE_CARRIERS below).

# --- derived: no opcode is named below this line ----------------------------------
STEP_TYPES = tuple(OPCODES)
RECVS = frozenset(t for t, i in OPCODES.items() if i.recv)
SENDS = frozenset(t for t, i in OPCODES.items() if i.send)
REDUCES = frozenset(t for t, i in OPCODES.items() if i.reduce)
FUSED = RECVS & SENDS                                 # receive and send in one step
SEND_FUSION = {t: i.send_fusion for t, i in OPCODES.items() if i.send_fusion}
DEVICE_OPCODES = tuple(t for t, i in OPCODES.items() if i.device)
# What the runtime cannot run: an IR with one of these is refused, naming it.
NOT_ON_DEVICE = frozenset(t for t, i in OPCODES.items() if not i.device and not i.folded)
COMPUTE = frozenset(t for t, i in OPCODES.items() if i.compute)
EPILOGUE_CARRIERS = frozenset(t for t, i in OPCODES.items() if i.writes)

