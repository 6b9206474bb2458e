"""The device's view of the tables: one fixed-size row per block.

A block starts by copying its row into shared memory with all its threads,
so everything it needs before its first step (its connections' addresses,
its running counters, its steps and their first waits) arrives in one round
trip to memory.  The kernel used to follow pointers from the plan to the TB
record to the connection record to the counter: four dependent loads, about
a microsecond, before the first step of every call.

Row layout (GC3_BK_*, GC3_BKQ_* in kernels/common.cuh): a header of int32
fields and u64 fields, then the block's device steps (GC3_DS_NFIELDS each:
the GC3_ST_* fields of `tables.Tables.steps` plus the step's first two waits
inline).  A long threadblock keeps its first steps in the row and the rest in
the `cold` table, read from global memory as it goes; every row is as long
as the longest row, so block b's row sits at b * row_words and the kernel
needs no offset table to find it.

The row's state words (slots sent and received, launches run, the last
credit value seen) belong to the block alone: it stores them back at exit,
so nothing is reset between calls.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gc3.errors import LimitError

from . import abi
from .tables import Tables

HEADER = abi.C["GC3_BK_HEADER_WORDS"]
DS = abi.C["GC3_DS_NFIELDS"]
HOT_STEPS = (abi.C["GC3_HOT_WORDS"] - HEADER) // DS
INLINE_DEPS = abi.C["GC3_DS_INLINE_DEPS"]
MAX_GROUP_RANKS = abi.C["GC3_MAX_BUFS"] // 3


@dataclass
class BlockRows:
    rows: np.ndarray        # int32 [nblocks, row_words]
    cold: np.ndarray        # int32 [ncold, DS] (never empty: the kernel may form its address)

    @property
    def row_words(self) -> int:
        return self.rows.shape[1]


def _bk(name: str) -> int:
    return abi.C[f"GC3_BK_{name}"]


def _bkq(name: str) -> int:
    return abi.C[f"GC3_BKQ_{name}"]


def device_step_rows(t: Tables, block: int) -> np.ndarray:
    """The block's steps as the kernel reads them: ST fields + inline waits."""
    tb = t.tbs[block]
    start, n = tb[abi.field("TB", "STEP_START")], tb[abi.field("TB", "NSTEPS")]
    st = t.steps[start:start + n]
    out = np.full((n, DS), -1, dtype=np.int32)
    out[:, :abi.ST_NFIELDS] = st
    d0 = abi.C["GC3_DS_DEP0"]
    dep_start, ndeps = st[:, abi.field("ST", "DEP_START")], st[:, abi.field("ST", "NDEPS")]
    for k in range(n):
        for d in range(min(int(ndeps[k]), INLINE_DEPS)):
            out[k, d0 + 2 * d:d0 + 2 * d + 2] = t.deps[dep_start[k] + d]
    return out


def build(t: Tables, send_records: np.ndarray, recv_records: np.ndarray) -> BlockRows:
    """Rows of the launch group `t`, given its connection records (connections.records)."""
    if 3 * len(t.ranks) > abi.C["GC3_MAX_BUFS"]:
        raise LimitError(f"{t.prog.name}: {len(t.ranks)} ranks in one launch; the kernel holds the buffers of "
                         f"at most {MAX_GROUP_RANKS}")
    steps = [device_step_rows(t, b) for b in range(t.nblocks)]
    nhot = [min(len(s), HOT_STEPS) for s in steps]
    row_words = HEADER + DS * max(nhot, default=0)
    rows = np.zeros((max(t.nblocks, 1), row_words), dtype=np.int32)
    q = rows.view(np.uint64)
    cold_parts = []
    ncold = 0
    conn = {name: abi.field("CONN", name) for name in ("FIFO", "TAIL", "HEAD", "PEER", "CHAN")}
    for b in range(t.nblocks):
        tb = t.tbs[b]
        r = rows[b]
        r[_bk("RANK_SLOT")] = tb[abi.field("TB", "RANK_SLOT")]
        r[_bk("RANK")] = tb[abi.field("TB", "RANK")]
        r[_bk("TB")] = tb[abi.field("TB", "ID")]
        r[_bk("NSTEPS")] = len(steps[b])
        r[_bk("NHOT")] = nhot[b]
        r[_bk("COLD_START")] = ncold
        r[_bk("SPEER")] = r[_bk("SCHAN")] = r[_bk("RPEER")] = r[_bk("RCHAN")] = -1
        s, rv = tb[abi.field("TB", "SEND")], tb[abi.field("TB", "RECV")]
        if s >= 0:
            rec = send_records[s]
            r[_bk("SPEER")], r[_bk("SCHAN")] = int(rec[conn["PEER"]]), int(rec[conn["CHAN"]])
            q[b, _bkq("SFIFO")], q[b, _bkq("DATA_OUT")] = rec[conn["FIFO"]], rec[conn["TAIL"]]
            q[b, _bkq("CREDIT_IN")] = rec[conn["HEAD"]]
        if rv >= 0:
            rec = recv_records[rv]
            r[_bk("RPEER")], r[_bk("RCHAN")] = int(rec[conn["PEER"]]), int(rec[conn["CHAN"]])
            q[b, _bkq("RFIFO")], q[b, _bkq("DATA_IN")] = rec[conn["FIFO"]], rec[conn["TAIL"]]
            q[b, _bkq("CREDIT_OUT")] = rec[conn["HEAD"]]
        r[HEADER:HEADER + DS * nhot[b]] = steps[b][:nhot[b]].reshape(-1)
        rest = steps[b][nhot[b]:]
        cold_parts.append(rest)
        ncold += len(rest)
    cold = np.concatenate(cold_parts) if ncold else np.zeros((1, DS), dtype=np.int32)
    return BlockRows(rows=np.ascontiguousarray(rows), cold=np.ascontiguousarray(cold))
