"""Several virtual ranks on one GPU in one cooperative launch: block b runs
(rank, tb) = tables.blocks[b].  Every rank has its own buffers, FIFOs and
counters, exactly as separate GPUs would, so 4- and 8-rank schedules run
unchanged on one device."""
from __future__ import annotations

from typing import Optional

from gc3.ir import Program

from ..core import streams, tables as tables_mod
from ..core.connections import control_words, rank_layout, records
from ..core.group import LaunchGroup
from ..core.launcher import Executor, runtime_protocol


class VirtualRanks(LaunchGroup):
    def __init__(self, prog: Program, *, proto: Optional[str] = None, timeout: Optional[float] = None):
        import cupy

        self.prog = prog
        self.proto = runtime_protocol(prog.proto, proto)
        self.nranks = prog.ngpus
        self.tables = tables_mod.build(prog)
        layouts = {r: rank_layout(prog, r, self.proto) for r in range(self.nranks)}
        # Zeroed on the set-up stream, which the Executor synchronizes before the first launch.
        with streams.current(streams.setup_stream()):
            self._fifo = {r: cupy.zeros(L.fifo_bytes, dtype=cupy.uint8) for r, L in layouts.items()}
            self._sync = {r: cupy.zeros(L.sync_words, dtype=cupy.uint64) for r, L in layouts.items()}
            control = cupy.zeros(control_words(self.tables.nblocks), dtype=cupy.uint64)
        sends, recvs = records(self.tables, layouts, lambda r: self._fifo[r].data.ptr,
                               lambda r: self._sync[r].data.ptr)
        self.executor = Executor(self.tables, self.proto, sends, recvs, control, timeout=timeout)
        self._init_calls()
