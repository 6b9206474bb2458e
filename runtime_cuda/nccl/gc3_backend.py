"""gc3's CUDA runtime behind the communicator: one `runtime_cuda.ranks.ipc.IpcRanks`
launch group per selected algorithm, set up on its first call.

The rendezvous is the communicator's exchange: its own NCCL communicator
(`NcclExchange`, standing in for the mpi4py communicator IpcRanks expects),
so this works for any launcher that can start a cupy.cuda.nccl program, or
MPI (`MpiExchange`, for `NcclCommunicator.from_mpi`).

Set-up is collective: every rank selects the same algorithm for the same
call, builds its launch group at that call, and then all ranks agree on the
outcome, so that a failure anywhere sends every rank to NCCL together.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Tuple

from gc3 import limits
from gc3.errors import GC3Error

from .call import REDUCING, Call
from .catalog import Candidate
from .selection import Decision

if TYPE_CHECKING:
    from runtime_cuda.core.group import CollectiveGroup


def _kernel_op(call: Call) -> str:
    """The interpreter build a call runs: avg is served by the sum build plus a division pass."""
    return "sum" if call.op_name == "avg" else call.op_name


def _group_op(call: Call) -> str:
    # Non-reducing collectives never reduce: they share the sum build of the kernel.
    return _kernel_op(call) if call.coll in REDUCING else "sum"


def _key(cand: Candidate) -> Tuple:
    # The small-message kernels share one group: one scratch per communicator.
    return ("kernel",) if cand.kernel else (str(cand.path), cand.name, cand.program.proto)


class Gc3Backend:
    def __init__(self, exchange, rank: int, size: int, device: int, catalog=None):
        # Imported here so that a machine without the runtime's dependencies
        # gets an `Unavailable` backend from make_backend instead of an error.
        from runtime_cuda.core import abi, binding, launcher, tables
        from runtime_cuda.ranks import small_allreduce
        from runtime_cuda.ranks.ipc import IpcRanks

        self._abi, self._binding, self._launcher, self._tables_mod = abi, binding, launcher, tables
        self._IpcRanks = IpcRanks
        self._small = small_allreduce
        self.exchange = exchange
        # The communicator's issue order, which its launch groups take as theirs (prepare); the
        # communicator sets it once it has made this backend.
        self.order = None
        self.rank, self.size, self.device = rank, size, device
        self._groups: Dict[Tuple, "CollectiveGroup"] = {}
        self._failed: Dict[Tuple, str] = {}
        self._tables: Dict[Tuple, object] = {}
        self._small_bytes = catalog.kernel_bytes(size) if catalog else limits.SMALL_ALLREDUCE_DEFAULT_BYTES

    # -- what the runtime can run ------------------------------------------------
    def check(self, cand: Candidate, call: Call) -> Optional[str]:
        key = _key(cand)
        if key in self._failed:
            return self._failed[key]
        if cand.kernel:
            return self._small.refusal(call.dtype_name, _group_op(call), call.in_elems, self._small_bytes,
                                       call.coll, call.nranks)
        if call.dtype_name not in self._abi.DTYPE:
            return f"the interpreter is not built for {call.dtype_name} (it has {', '.join(self._abi.DTYPE)})"
        if call.coll in REDUCING and _kernel_op(call) not in self._abi.REDOP:
            return f"the interpreter has no {call.op_name} reduction (it has {', '.join(self._abi.REDOP)})"
        try:
            proto = self._launcher.runtime_protocol(cand.program.proto)
            tables = self._tables.get(key)
            if tables is None:
                tables = self._tables[key] = self._tables_mod.build(cand.program, ranks=[self.rank])
            self._binding.call_shape(cand.program, call.in_elems, call.itemsize, proto, tables.max_cnt)
        except GC3Error as exc:
            return str(exc)
        return None

    # -- collective set-up ---------------------------------------------------------
    def prepare(self, decision: Decision) -> Optional[str]:
        cand = decision.candidate
        key = _key(cand)
        if key in self._groups:
            return None
        if key in self._failed:
            return self._failed[key]
        why = ""
        try:
            if cand.kernel:
                group = self._small.SmallAllreduce.ipc(self.exchange, device=self.device,
                                                       max_bytes=self._small_bytes)
            else:
                group = self._IpcRanks(cand.program, self.exchange, device=self.device)
        except Exception as exc:  # reported to every rank below, then NCCL serves the call
            group, why = None, f"{type(exc).__name__}: {exc}"
        reasons = self.exchange.all_agree(group is not None, why)
        bad = [f"rank {r}: {w}" for r, w in enumerate(reasons) if w]
        if bad:
            self._failed[key] = "launch group set-up failed (" + "; ".join(bad) + ")"
            if group is not None:
                group.close()
            return self._failed[key]
        # One issue order for the whole communicator: a group ordering its calls apart
        # would mark each call's end a second time (an event record, about a microsecond
        # of host time on every repeat).
        if self.order is not None and not group.executor.order.pending:   # nothing of its own to keep alive
            group.executor.order = self.order
        self._groups[key] = group
        return None

    # -- calls -----------------------------------------------------------------------
    def run(self, decision: Decision) -> None:
        c = decision.call
        group = self._groups[_key(decision.candidate)]
        group.run_ptrs([c.sendbuf], [c.recvbuf], c.in_elems, c.dtype_name, _group_op(c), c.stream,
                       **decision.candidate.run_kwargs)
        if c.coll in REDUCING and c.op_name == "avg" and (c.coll != "reduce" or c.rank == c.root):
            # A catalog program is a plain sum program: avg is its sum, then NCCL's division
            # in a second pass on the same stream (only where the call defines the output).
            from runtime_cuda.core import avg
            avg.divide(c.recvbuf, c.out_elems, c.dtype_name, c.nranks, c.stream)

    def reissue(self, decision: Decision):
        """The call `run` just issued, bound for repeats that skip selection and set-up
        (runtime_cuda.core.group.Reissue), or None where a repeat must take the full path:
        avg, whose division pass runs here, not in the group."""
        c = decision.call
        group = self._groups.get(_key(decision.candidate))
        if group is None or (c.coll in REDUCING and c.op_name == "avg"):
            return None
        return group.reissue([c.sendbuf], [c.recvbuf], c.in_elems, c.dtype_name, _group_op(c),
                             **decision.candidate.run_kwargs)

    def adopt(self, stream: int) -> None:
        """Every launch group takes `stream` as its last one with no event hand-over
        (see StreamOrder.adopt: a CUDA graph capture stream)."""
        for group in self._groups.values():
            group.executor.order.adopt(stream)

    def check_async_error(self) -> None:
        """Raise RuntimeTimeoutError if a gc3 kernel of this communicator gave up waiting."""
        for group in self._groups.values():
            group.executor.check(synchronize=False)

    def close(self) -> None:
        groups, self._groups = self._groups, {}
        for group in groups.values():
            group.close()

    def abandon(self) -> None:
        """After NCCL's abort: drop the launch groups without the collective close."""
        self._groups = {}
