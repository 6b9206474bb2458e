"""The measuring `Timer` of `gc3 tune` (runtime_cuda.nccl.tune.Timer): under
mpirun, one process per rank; processes may share a GPU.

Each candidate runs on a launch group of its own (runtime_cuda.ranks.ipc.IpcRanks, or
runtime_cuda.ranks.small_allreduce.SmallAllreduce for the small-message kernels),
set up collectively when it is first timed and closed when the tune moves on
to the next collective.  Every (candidate, size, placement) is checked on data
first and then timed, by the method of `gc3 bench` (perf_gpu.run_case:
generated inputs, poisoned outputs, every element compared on the GPU, then
CUDA-event timing averaged over ranks; up to `graph_max` bytes, where every
process has a GPU of its own, candidates rank by their time in a 100-call CUDA
graph and a call's time against NCCL's is its eager time plus that one,
tune.GRAPH_MAX says why).  The ranks agree on every time and on
every failure, so each makes the same choices.  A candidate that fails
anywhere -- set-up, launch, a timed-out wait, one wrong element -- is out, and
the catalog's provenance says why.

NCCL, the baseline, runs in the same processes through cupy.cuda.nccl when
every process has a GPU of its own.  Processes sharing a GPU cannot have NCCL
(it refuses two ranks on one device): the catalog then records "NCCL
unavailable" and is marked never to be shipped.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

from gc3 import limits
from gc3.errors import GC3Error

from . import machine
from .call import REDUCING, Call
from .catalog import run_kwargs
from .perf_gpu import GRAPH_CALLS, BenchConfig, Host, local_device, nccl_issue, run_case
from .tune import DTYPE, GRAPH_MAX, GRAPH_ROUNDS, ROUNDS, Variant, call_elems

TIMEOUT_S = 2.0     # a candidate that cannot run (e.g. not co-resident beside its peer) fails fast


class MeasuredTimer:
    # Measured through the runtime's own call path, so an in-place IR serving an
    # out-of-place call includes the runtime's copy of the input.
    prices_inplace_copy = True

    def __init__(self, host: Host, max_bytes: int, warmup: int = 3, iters: int = 10, device: Optional[int] = None,
                 dtype: str = DTYPE, graph_max: int = GRAPH_MAX):
        import cupy

        self.host, self.dtype = host, dtype
        self.device = local_device(host.rank) if device is None else device
        cupy.cuda.Device(self.device).use()
        self.cfg = BenchConfig(collectives=(), sizes=(), dtype=dtype, warmup=warmup, iters=iters, rounds=ROUNDS,
                               graph_max=graph_max)
        biggest = (max_bytes + 256 + 15) // 16 * 16    # whole elements of every dtype, as run_bench
        self.sendbuf = cupy.empty(biggest, dtype=cupy.uint8)
        self.recvbuf = cupy.empty(biggest, dtype=cupy.uint8)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.gpu_name = cupy.cuda.runtime.getDeviceProperties(self.device)["name"]
        if isinstance(self.gpu_name, bytes):
            self.gpu_name = self.gpu_name.decode()
        devices = host.comm.allgather(machine.local_device(self.device))
        self.gpus = len({(d.host, d.bus_id) for d in devices})
        if self.gpus < host.size:
            # Processes sharing a GPU take turns on it in time slices: a graph of 100 calls that
            # each wait for the other processes' kernels would time the slicing, and slowly.
            self.cfg.graph_max = 0
        self.graph_cfg = dataclasses.replace(self.cfg, rounds=GRAPH_ROUNDS)
        # What the catalog is keyed by where it is shipped or cached: rank 0's view, as a communicator's.
        self.fingerprint = host.bcast(str(machine.fingerprint_of(devices)) if host.rank == 0 else None)
        self._groups: Dict[str, object] = {}
        self._coll: Optional[str] = None
        self.rejected: Dict[str, str] = {}
        self._nccl_times: Dict[Tuple[str, int, bool], Optional[float]] = {}
        # (eager, graph) us per call behind each time that added a graph's, by (label or None for
        # NCCL, collective, bytes, in place): the provenance shows both halves of each choice.
        self._halves: Dict[Tuple[Optional[str], str, int, bool], Tuple[float, float]] = {}
        self._nccl = None
        if self.gpus < host.size:
            self.nccl_note = (f"NCCL unavailable: {host.size} processes share {self.gpus} GPU(s) "
                              "(NCCL refuses two ranks on one device)")
        else:
            from cupy.cuda import nccl

            self._nccl = nccl_issue(host)
            self.nccl_note = f"NCCL {nccl.get_version()} (default settings, same processes)"

    # -- the Timer protocol ------------------------------------------------------
    def time(self, cand: Variant, nbytes: int, inplace: bool) -> Optional[float]:
        if cand.label in self.rejected:
            return None
        group = self._group(cand)
        if group is None or not self._serves(group, cand, nbytes):
            return None
        err = []

        def issue(coll, send, recv, count, dtype, op, stream, root):
            if err:         # this rank failed already: its peers time out and see it too
                return cand.label
            call = Call(coll, send, recv, count, dtype, op, stream, self.host.size, self.host.rank, root)
            try:
                group.run_ptrs([send], [recv], call.in_elems, call.dtype_name,
                               call.op_name if coll in REDUCING else "sum", stream,
                               **run_kwargs(cand.kernel, coll))
            except Exception as exc:   # agreed on below, after the case's collectives
                err.append(f"rank {self.host.rank}: {type(exc).__name__}: {exc}")
            return cand.label

        graphs: Dict[str, float] = {}
        t_us, wrong, first, _ = run_case(issue, self.host, self._cfg(nbytes), cand.collective, nbytes, inplace,
                                         self.sendbuf, self.recvbuf, self.stream, graphs)
        if math.isnan(graphs.get("graph100", 0.0)) and self.host.rank == 0:   # every rank has the nan
            err.append("its calls cannot be captured in a CUDA graph")
        try:
            group.executor.check()
        except GC3Error as exc:
            err.append(f"rank {self.host.rank}: {exc}")
        why = "; ".join(e for errs in self.host.comm.allgather(err) for e in errs)
        if wrong:
            why = f"{wrong} wrong element(s) at {nbytes} bytes{' (' + first + ')' if first else ''}" + \
                  (f"; {why}" if why else "")
        if why:
            self._reject(cand, why)
            return None
        return self._time(cand.label, cand.collective, nbytes, inplace, t_us, graphs)

    def baseline(self, coll: str, nbytes: int, inplace: bool) -> Optional[float]:
        if self._nccl is None:
            return None
        key = (coll, nbytes, inplace)
        if key not in self._nccl_times:
            graphs: Dict[str, float] = {}
            t_us, wrong, _, _ = run_case(self._nccl, self.host, self._cfg(nbytes), coll, nbytes, inplace,
                                         self.sendbuf, self.recvbuf, self.stream, graphs)
            bad = wrong or math.isnan(graphs.get("graph100", 0.0))
            self._nccl_times[key] = None if bad else self._time(None, coll, nbytes, inplace, t_us, graphs)
        return self._nccl_times[key]

    def _time(self, label: Optional[str], coll: str, nbytes: int, inplace: bool, eager_us: float,
              graphs: Dict[str, float]) -> float:
        """Seconds a call takes by this tune's measure: eager, plus the graph's time where one was timed."""
        if "graph100" not in graphs:
            return eager_us * 1e-6
        self._halves[(label, coll, nbytes, inplace)] = (eager_us, graphs["graph100"])
        return (eager_us + graphs["graph100"]) * 1e-6

    def _cfg(self, nbytes: int) -> BenchConfig:
        return self.graph_cfg if self.measure(nbytes) else self.cfg

    def measure(self, nbytes: int) -> bool:
        """Whether a call of `nbytes` is timed in a graph as well (tune.Timer.measure)."""
        return nbytes <= self.cfg.graph_max

    def rank(self, cand: Variant, nbytes: int, inplace: bool, t: float) -> float:
        """tune.Timer.rank: a candidate's graph time where one was timed (tune.GRAPH_MAX says why), else t."""
        halves = self._halves.get((cand.label, cand.collective, nbytes, inplace))
        return t if halves is None else halves[1] * 1e-6

    def parts(self, label: Optional[str], coll: str, nbytes: int, inplace: bool) -> Optional[Tuple[float, float]]:
        """(eager, graph) us per call behind time() of candidate `label` (None: baseline(), NCCL's)."""
        return self._halves.get((label, coll, nbytes, inplace))

    def provenance(self) -> Dict[str, object]:
        out: Dict[str, object] = {
            "timer": "measured", "measured": True, "device": self.gpu_name, "fingerprint": self.fingerprint,
            "processes": self.host.size,
            "gpus": self.gpus, "nccl": self.nccl_note, "warmup": self.cfg.warmup, "iters": self.cfg.iters,
            "time": (f"eager us per call (median of {GRAPH_ROUNDS} rounds) + us per call in a {GRAPH_CALLS}-call "
                     f"CUDA graph up to {self.cfg.graph_max} bytes, eager (one round) above" if self.cfg.graph_max
                     else "eager us per call"),
            "shippable": self._nccl is not None and self.gpus == self.host.size}
        if self.host.rank == 0:     # the lead writes the catalog: the links as its node sees them
            out["topology"] = machine.topology()
        if not out["shippable"]:
            out["not_shippable"] = (self.nccl_note if self._nccl is None else
                                    f"{self.host.size} processes on {self.gpus} GPU(s)") + \
                "; a catalog measured this way must never be shipped"
        if self.rejected:
            out["rejected"] = dict(self.rejected)
        return out

    def _serves(self, group, cand: Variant, nbytes: int) -> bool:
        """Whether this size splits into the program's chunks and tiles (the
        same answer on every rank: it depends on the program alone)."""
        from runtime_cuda.core.binding import call_shape

        from .constants import DTYPE_CODES, ITEMSIZE

        elems = call_elems(cand.collective, nbytes, self.host.size, self.dtype)
        if not elems:
            return False
        if cand.kernel:
            from runtime_cuda.ranks.small_allreduce import refusal
            return refusal(self.dtype, "sum", elems, limits.SMALL_ALLREDUCE_MAX_BYTES, cand.collective,
                           self.host.size) is None
        try:
            call_shape(cand.program, elems, ITEMSIZE[DTYPE_CODES[self.dtype]], group.proto, group.tables.max_cnt)
        except GC3Error:
            return False
        return True

    # -- launch groups -------------------------------------------------------------
    def _group(self, cand: Variant):
        from runtime_cuda.ranks.ipc import IpcRanks
        from runtime_cuda.ranks.small_allreduce import SmallAllreduce

        if cand.collective != self._coll:       # the tune moved on: free the last collective's groups
            self.close()
            self._coll = cand.collective
        group = self._groups.get(cand.label)
        if group is None:
            try:    # set-up agrees across ranks: it raises on every rank or on none
                group = (SmallAllreduce.ipc(self.host.comm, device=self.device, timeout=TIMEOUT_S,
                                            max_bytes=limits.SMALL_ALLREDUCE_MAX_BYTES) if cand.kernel
                         else IpcRanks(cand.program, self.host.comm, timeout=TIMEOUT_S, device=self.device))
            except GC3Error as exc:
                self.rejected[cand.label] = f"set-up failed: {exc}"
                return None
            self._groups[cand.label] = group
        return group

    def _reject(self, cand: Variant, why: str) -> None:
        self.rejected[cand.label] = why
        group = self._groups.pop(cand.label, None)
        if group is not None:
            group.close()

    def close(self) -> None:
        groups, self._groups = self._groups, {}
        for label in sorted(groups):            # the same order on every rank: close is collective
            groups[label].close()

