"""The measuring `Timer` of `gc3 tune` (runtime_cuda.nccl.tune.Timer): under
mpirun, one process per rank; processes may share a GPU.

Each candidate runs on a launch group of its own (runtime_cuda.ipc.IpcRanks, or
runtime_cuda.small_allreduce.SmallAllreduce for the small-message kernels),
set up collectively when it is first timed and closed when the tune moves on
to the next collective.  Every (candidate, size, placement) is checked on data
first and then timed, by the method of `gc3 bench` (perf_gpu.run_case:
generated inputs, poisoned outputs, every element compared on the GPU, then
CUDA-event timing averaged over ranks).  The ranks agree on every time and on
every failure, so each makes the same choices.  A candidate that fails
anywhere -- set-up, launch, a timed-out wait, one wrong element -- is out, and
the catalog's provenance says why.

NCCL, the baseline, runs in the same processes through cupy.cuda.nccl when
every process has a GPU of its own.  Processes sharing a GPU cannot have NCCL
(it refuses two ranks on one device): the catalog then records "NCCL
unavailable" and is marked never to be shipped.
"""
from __future__ import annotations

import re
import socket
import subprocess
from collections import Counter
from typing import Callable, Dict, Optional, Tuple

from gc3 import limits
from gc3.errors import GC3Error

from .call import REDUCING, Call
from .catalog import run_kwargs
from .perf_gpu import BenchConfig, Host, local_device, nccl_issue, run_case
from .tune import DTYPE, Candidate, call_elems

TIMEOUT_S = 2.0     # a candidate that cannot run (e.g. not co-resident beside its peer) fails fast


class MeasuredTimer:
    # Measured through the runtime's own call path, so an in-place IR serving an
    # out-of-place call includes the runtime's copy of the input.
    prices_inplace_copy = True

    def __init__(self, host: Host, max_bytes: int, warmup: int = 3, iters: int = 10):
        import cupy

        self.host = host
        self.device = local_device(host.rank)
        cupy.cuda.Device(self.device).use()
        # One round: the tune times many candidates, and its budget is the scarce part.
        self.cfg = BenchConfig(collectives=(), sizes=(), dtype=DTYPE, warmup=warmup, iters=iters, rounds=1)
        biggest = (max_bytes + 256 + 15) // 16 * 16    # whole elements of every dtype, as run_bench
        self.sendbuf = cupy.empty(biggest, dtype=cupy.uint8)
        self.recvbuf = cupy.empty(biggest, dtype=cupy.uint8)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.gpu_name = cupy.cuda.runtime.getDeviceProperties(self.device)["name"]
        if isinstance(self.gpu_name, bytes):
            self.gpu_name = self.gpu_name.decode()
        gpus = host.comm.allgather((socket.gethostname(), cupy.cuda.Device(self.device).pci_bus_id))
        self.gpus = len(set(gpus))
        self._groups: Dict[str, object] = {}
        self._coll: Optional[str] = None
        self.rejected: Dict[str, str] = {}
        self._nccl_times: Dict[Tuple[str, int, bool], Optional[float]] = {}
        self._nccl = None
        if self.gpus < host.size:
            self.nccl_note = (f"NCCL unavailable: {host.size} processes share {self.gpus} GPU(s) "
                              "(NCCL refuses two ranks on one device)")
        else:
            from cupy.cuda import nccl

            self._nccl = nccl_issue(host)
            self.nccl_note = f"NCCL {nccl.get_version()} (default settings, same processes)"

    # -- the Timer protocol ------------------------------------------------------
    def time(self, cand: Candidate, nbytes: int, inplace: bool) -> Optional[float]:
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

        t_us, wrong, first, _ = run_case(issue, self.host, self.cfg, cand.collective, nbytes, inplace,
                                         self.sendbuf, self.recvbuf, self.stream)
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
        return t_us * 1e-6

    def baseline(self, coll: str, nbytes: int, inplace: bool) -> Optional[float]:
        if self._nccl is None:
            return None
        key = (coll, nbytes, inplace)
        if key not in self._nccl_times:
            t_us, wrong, _, _ = run_case(self._nccl, self.host, self.cfg, coll, nbytes, inplace,
                                         self.sendbuf, self.recvbuf, self.stream)
            self._nccl_times[key] = None if wrong else t_us * 1e-6
        return self._nccl_times[key]

    def provenance(self) -> Dict[str, object]:
        out: Dict[str, object] = {
            "timer": "measured", "measured": True, "device": self.gpu_name, "processes": self.host.size,
            "gpus": self.gpus, "nccl": self.nccl_note, "warmup": self.cfg.warmup, "iters": self.cfg.iters,
            "shippable": self._nccl is not None and self.gpus == self.host.size}
        if self.host.rank == 0:     # the lead writes the catalog: the links as its node sees them
            out["topology"] = topology()
        if not out["shippable"]:
            out["not_shippable"] = (self.nccl_note if self._nccl is None else
                                    f"{self.host.size} processes on {self.gpus} GPU(s)") + \
                "; a catalog measured this way must never be shipped"
        if self.rejected:
            out["rejected"] = dict(self.rejected)
        return out

    def _serves(self, group, cand: Candidate, nbytes: int) -> bool:
        """Whether this size splits into the program's chunks and tiles (the
        same answer on every rank: it depends on the program alone)."""
        from runtime_cuda.binding import call_shape

        from .constants import DTYPE_CODES, ITEMSIZE

        elems = call_elems(cand.collective, nbytes, self.host.size)
        if not elems:
            return False
        if cand.kernel:
            from runtime_cuda.small_allreduce import refusal
            return refusal(DTYPE, "sum", elems, limits.SMALL_ALLREDUCE_MAX_BYTES, cand.collective,
                           self.host.size) is None
        try:
            call_shape(cand.program, elems, ITEMSIZE[DTYPE_CODES[DTYPE]], group.proto, group.tables.max_cnt)
        except GC3Error:
            return False
        return True

    # -- launch groups -------------------------------------------------------------
    def _group(self, cand: Candidate):
        from runtime_cuda.ipc import IpcRanks
        from runtime_cuda.small_allreduce import SmallAllreduce

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

    def _reject(self, cand: Candidate, why: str) -> None:
        self.rejected[cand.label] = why
        group = self._groups.pop(cand.label, None)
        if group is not None:
            group.close()

    def close(self) -> None:
        groups, self._groups = self._groups, {}
        for label in sorted(groups):            # the same order on every rank: close is collective
            groups[label].close()


def topology(run: Callable = subprocess.run) -> Dict[str, object]:
    """How this machine's GPUs are linked, as `nvidia-smi topo -m` says (what a tuned
    catalog was measured over: NV18 everywhere is not the same machine as PCIe pairs);
    {"unknown": why} where it cannot be asked."""
    cmd = ["nvidia-smi", "topo", "-m"]
    try:
        res = run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"unknown": f"{' '.join(cmd)}: {exc}"}
    if res.returncode != 0:
        return {"unknown": f"{' '.join(cmd)} exited {res.returncode}: {(res.stderr or '').strip()[:200]}"}
    return parse_topology(res.stdout)


def parse_topology(text: str) -> Dict[str, object]:
    """The GPU-to-GPU link of every pair in `nvidia-smi topo -m` output ({"GPU0-GPU1": "NV18", ...})
    and a one-line summary; {"unknown": why} when the output has no GPU matrix."""
    rows = [line.split() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
    head = next((r for r in rows if r and re.fullmatch(r"GPU\d+", r[0])
                 and (len(r) == 1 or not re.fullmatch(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC", r[1]))), None)
    if head is None:
        return {"unknown": "no GPU matrix in `nvidia-smi topo -m` output"}
    gpus = [c for c in head if re.fullmatch(r"GPU\d+", c)]
    matrix = {r[0]: r[1:1 + len(gpus)] for r in rows if len(r) > len(gpus) and r[0] in gpus and r is not head}
    links = {f"{a}-{b}": matrix[a][j] for i, a in enumerate(gpus) for j, b in enumerate(gpus)
             if j > i and a in matrix}
    kinds = Counter(links.values())
    summary = "; ".join(f"{k} between {'all ' if n == len(links) else ''}{n} GPU pair{'s' if n > 1 else ''}"
                        for k, n in kinds.most_common())
    return {"source": "nvidia-smi topo -m", "gpus": len(gpus), "links": links,
            "summary": summary or f"{len(gpus)} GPU, no pairs"}
