"""One process driving several GPUs through peer access: rank r runs on
devices[r] (default GPU r), in its own launch on its own device.

Each rank's FIFOs, credit words and control area live on its own GPU exactly
as with one process per GPU (`ipc`), but peers reach them through plain peer
pointers (cudaDeviceEnablePeerAccess) instead of IPC handles.  A call
prepares every rank's launch first (kernels compiled, scratch grown), then
launches them back to back, one per device: a rank whose kernel started
while a peer's was still being compiled would spin into its timeout.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from gc3.errors import GC3Error, RuntimeTimeoutError
from gc3.ir import Program

from ..core import streams, tables as tables_mod
from ..core.connections import control_words, rank_layout, records
from ..core.group import LaunchGroup, PreparedCall
from ..core.launcher import Executor, PREPARED_CALLS_MAX, abort_words, runtime_protocol
from ..core.tables import Tables

_PEER_ACCESS_ALREADY_ENABLED = 704   # cudaErrorPeerAccessAlreadyEnabled


def choose_devices(nranks: int, devices: Optional[Sequence[int]], ndev: int,
                   can_access: Callable[[int, int], bool]) -> List[int]:
    """The GPU of each rank, or a GC3Error saying why this machine cannot run
    the program in one process."""
    if devices is None:
        if ndev < nranks:
            raise GC3Error(f"peer mode runs rank r on GPU r: a {nranks}-rank program needs {nranks} GPUs, "
                           f"this machine has {ndev} (use virtual ranks on one GPU instead)")
        devices = list(range(nranks))
    devices = [int(d) for d in devices]
    if len(devices) != nranks:
        raise GC3Error(f"peer mode: {len(devices)} devices given ({devices}) for a {nranks}-rank program")
    bad = [d for d in devices if not 0 <= d < ndev]
    if bad:
        raise GC3Error(f"peer mode: device(s) {bad} do not exist (this machine has GPUs 0..{ndev - 1})")
    if len(set(devices)) != len(devices):
        raise GC3Error(f"peer mode: devices {devices} name a GPU twice; every rank needs its own GPU "
                       f"(several ranks on one GPU: virtual ranks)")
    for a in devices:
        for b in devices:
            if a != b and not can_access(a, b):
                raise GC3Error(f"peer mode: GPU {a} cannot access GPU {b}'s memory (cudaDeviceCanAccessPeer = 0); "
                               f"run one process per GPU under mpirun instead")
    return devices


def enable_peer_access(devices: Sequence[int]) -> None:
    """Let every device of the group read and write every other's memory."""
    import cupy

    rt = cupy.cuda.runtime
    for a in devices:
        with cupy.cuda.Device(a):
            for b in devices:
                if a == b:
                    continue
                try:
                    rt.deviceEnablePeerAccess(b)
                except rt.CUDARuntimeError as exc:
                    if getattr(exc, "status", None) != _PEER_ACCESS_ALREADY_ENABLED:
                        raise GC3Error(f"peer mode: enabling access from GPU {a} to GPU {b} failed: {exc}") from None


class _RankOnDevice(LaunchGroup):
    """One rank of a PeerRanks group: its tables and executor on its own GPU.
    Calls to it must run with that GPU current."""

    def __init__(self, prog: Program, proto: str, tables: Tables, executor: Executor):
        self.prog, self.proto, self.tables, self.executor = prog, proto, tables, executor
        self._init_calls()


class PeerRanks(LaunchGroup):
    def __init__(self, prog: Program, devices: Optional[Sequence[int]] = None, *, proto: Optional[str] = None,
                 timeout: Optional[float] = None):
        import cupy

        rt = cupy.cuda.runtime
        self.cupy = cupy
        self.prog = prog
        self.proto = runtime_protocol(prog.proto, proto)
        n = prog.ngpus
        self.devices = choose_devices(n, devices, rt.getDeviceCount(), lambda a, b: bool(rt.deviceCanAccessPeer(a, b)))
        enable_peer_access(self.devices)
        layouts = {r: rank_layout(prog, r, self.proto) for r in range(n)}
        tables = [tables_mod.build(prog, ranks=[r]) for r in range(n)]
        self._fifo, self._sync, self._control = [], [], []
        for r, d in enumerate(self.devices):
            # Zeroed on each device's set-up stream, which its Executor synchronizes.
            with cupy.cuda.Device(d), streams.current(streams.setup_stream()):
                self._fifo.append(cupy.zeros(layouts[r].fifo_bytes, dtype=cupy.uint8))
                self._sync.append(cupy.zeros(layouts[r].sync_words, dtype=cupy.uint64))
                self._control.append(cupy.zeros(control_words(tables[r].nblocks), dtype=cupy.uint64))
        aborts = abort_words(self._control)
        self.parts: List[_RankOnDevice] = []
        for r, d in enumerate(self.devices):
            with cupy.cuda.Device(d):
                sends, recvs = records(tables[r], layouts, lambda q: self._fifo[q].data.ptr,
                                       lambda q: self._sync[q].data.ptr)
                ex = Executor(tables[r], self.proto, sends, recvs, self._control[r],
                              abort_peers=[a for q, a in enumerate(aborts) if q != r], timeout=timeout)
                self.parts.append(_RankOnDevice(prog, self.proto, tables[r], ex))
        self._prepared: Dict[tuple, List[PreparedCall]] = {}
        self._set_device, self._get_device = rt.setDevice, rt.getDevice

    @property
    def ranks(self):
        return tuple(range(self.prog.ngpus))

    def rank_device(self, rank: int) -> int:
        return self.devices[rank]

    def _streams(self, stream) -> List:
        """One stream per rank: the given ones, or each device's current stream."""
        if stream is None:
            out = []
            for d in self.devices:
                with self.cupy.cuda.Device(d):
                    out.append(self.cupy.cuda.get_current_stream())
            return out
        if not isinstance(stream, (list, tuple)) or len(stream) != len(self.devices):
            raise GC3Error(f"{self.prog.name}: peer mode runs one stream per GPU; pass {len(self.devices)} streams "
                           f"(one per rank, each on that rank's GPU) or None")
        return list(stream)

    def run_ptrs(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                 stream=None) -> None:
        """Enqueue one call: rank r reads in_ptrs[r] and writes out_ptrs[r] on its own GPU."""
        streams = self._streams(stream)
        key = (tuple(in_ptrs), tuple(out_ptrs), in_elems, dtype, op)
        prev = self._get_device()
        try:
            for part, d, s in zip(self.parts, self.devices, streams):
                self._set_device(d)
                part.executor.order.enter(s.ptr)
            calls = self._prepared.get(key)
            if calls is None:
                if len(self._prepared) >= PREPARED_CALLS_MAX:
                    for part, d in zip(self.parts, self.devices):
                        self._set_device(d)
                        part.executor.order.retire(self._prepared)
                    self._prepared = {}
                calls = []
                for k, (part, d) in enumerate(zip(self.parts, self.devices)):
                    self._set_device(d)
                    calls.append(part._prepare([in_ptrs[k]], [out_ptrs[k]], in_elems, dtype, op, streams[k].ptr))
                self._prepared[key] = calls
            for part, call, d, s in zip(self.parts, calls, self.devices, streams):
                self._set_device(d)
                call(s.ptr)
                part.executor.order.leave(s.ptr)
        finally:
            self._set_device(prev)

    def prepared(self, *args, **kwargs):
        raise GC3Error(f"{self.prog.name}: peer mode prepares one call per GPU; ask its parts (.parts[r].prepared)")

    def reissue(self, *args, **kwargs) -> None:
        """None: a peer-mode call switches devices per rank, which only run_ptrs does."""
        return None

    def check(self) -> None:
        """Synchronise every GPU of the group and raise RuntimeTimeoutError if a wait gave up
        (with the record of the rank that timed out; its peers were only told to stop)."""
        for d in self.devices:
            self.cupy.cuda.Device(d).synchronize()
        timed_out, told = [], []
        for part, d in zip(self.parts, self.devices):
            with self.cupy.cuda.Device(d):
                try:
                    part.executor.check(synchronize=False)
                except RuntimeTimeoutError as exc:
                    (timed_out if "timed out" in str(exc) else told).append(str(exc))
        if timed_out or told:
            msg = "; ".join(timed_out or told)
            for part in self.parts:
                part.executor.broken = part.executor.broken or msg
            raise RuntimeTimeoutError(msg)

    def close(self) -> None:
        for d in self.devices:
            self.cupy.cuda.Device(d).synchronize()
        self._prepared.clear()
