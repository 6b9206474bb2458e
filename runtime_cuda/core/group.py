"""The call path shared by every way of running ranks: bind buffers, size
scratch, launch.  A launch group is the set of ranks one kernel launch runs
(all of them for virtual ranks, one per process with CUDA IPC)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Optional, Protocol, Sequence

from gc3.dtypes import dtype_info
from gc3.errors import GC3Error
from gc3.ir import Program

from . import abi, faults, streams
from .binding import Binding, Copy, Shape, bind, call_shape
from .connections import tile_split
from .launcher import Executor, PREPARED_CALLS_MAX, Launch
from .tables import Tables, epilogue_words

_D2D = 3  # cudaMemcpyDeviceToDevice
_LEGACY = streams.LEGACY_PTRS
_LASTING = streams.LASTING


class CollectiveGroup(Protocol):
    """What the drop-in (nccl/gc3_backend.py) asks of every launch group it serves calls
    from: the interpreter's ranks over CUDA IPC (ipc.IpcRanks) and the small-message kernels
    (small_allreduce.SmallAllreduce).  `executor` carries the group's stream order
    (`executor.order`, a streams.StreamOrder) and its error record (`executor.check`)."""
    executor: Any

    def run_ptrs(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                 stream=None, **kind) -> None: ...

    def reissue(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                **kind) -> Optional["Reissue"]: ...

    def close(self) -> None: ...


class PreparedCall:
    """One cached call: the copies an in-place/out-of-place mismatch needs, and the launch."""
    __slots__ = ("launch", "pre", "post", "shape", "keep", "_memcpy")

    def __init__(self, launch: Optional[Launch], pre: List[Copy], post: List[Copy], shape: Shape, keep):
        import cupy

        self.launch, self.pre, self.post, self.shape = launch, pre, post, shape
        self.keep = keep   # scratch/temp buffers this call's addresses point into
        self._memcpy = cupy.cuda.runtime.memcpyAsync

    def __call__(self, stream_ptr: int, captured: bool = False) -> None:
        for c in self.pre:
            self._memcpy(c.dst, c.src, c.nbytes, _D2D, stream_ptr)
        if self.launch is not None:
            self.launch(stream_ptr, captured)
        for c in self.post:
            self._memcpy(c.dst, c.src, c.nbytes, _D2D, stream_ptr)


class Reissue:
    """One prepared call of a launch group, bound for re-issue on a raw stream
    handle with no lookup at all: for a caller that caches it under its own key
    (the drop-in's per-call fast path).  Calling it, or its `issue` (the same in
    one Python frame: what the drop-in calls), returns False, issuing nothing,
    once the group has dropped its prepared calls (scratch grew, or the cache
    was full) or its executor is broken: the caller then takes the full path,
    which binds again or raises why."""
    __slots__ = ("group", "call", "epoch", "issue")

    def __init__(self, group: "LaunchGroup", call: PreparedCall):
        self.group, self.call, self.epoch = group, call, group._epoch
        self.issue = _issuer(group, call, self.epoch)

    def bind(self, stream_ptr: int, outer: Optional[streams.StreamOrder] = None, tally: Optional[List[int]] = None):
        """`issue` for a caller that keys it by the stream too (the drop-in's repeat
        cache): callable with no argument for `stream_ptr`; it enters the caller's own
        StreamOrder `outer` before the group's (with the capture state it queried
        anyway) and adds 1 to tally[0] per call issued, so the caller's bookkeeping
        costs no frame of its own."""
        return _issuer(self.group, self.call, self.epoch, stream_ptr, outer, tally)

    @property
    def launch(self) -> Optional[Launch]:
        """The kernel launch this re-issues (its function, grid, block and packed
        parameters); None once stale, or for a call with nothing to launch."""
        return self.call.launch if self.group._epoch == self.epoch else None

    def __call__(self, stream_ptr: int) -> bool:
        return self.issue(stream_ptr)


def _issuer(group: "LaunchGroup", call: PreparedCall, epoch: int, stream: Optional[int] = None,
            outer: Optional[streams.StreamOrder] = None, tally: Optional[List[int]] = None):
    """run_ptrs' ordering and capture rules for one prepared call, without its
    lookup, as one closure: everything it reads per call is bound here (an
    executor keeps its order, a group its capture table, for life), and a call
    with no copies around its launch goes straight to the launch's bound driver
    calls, so a repeat is one Python frame above the driver.  `stream`, `outer`,
    `tally`: see Reissue.bind."""
    order, query, kept, key = group.executor.order, streams.capture_query(), group._captured, id(call)
    if outer is order:   # the caller's order is the group's (a communicator's launch groups share it)
        outer = None
    # What keeps the bound stream alive (weakly: the caller's cache must not), so that the
    # order marks its end at the next switch instead of on every call.
    keep = streams.owner_ref(stream) if stream is not None else None
    launch = call.launch if call.launch is not None and not call.pre and not call.post else None
    whole = None if launch is not None else call.__call__
    in_capture, eager, params = launch.driver_calls() if launch is not None else (None, None, 0)
    ex = launch.ex if launch is not None else group.executor
    # A launch whose blocks count themselves on a stream order (StreamOrder.counted): its eager
    # call adds its blocks to that order's total, and where that order is the only one to mark,
    # the count is the stream's end mark: no leave(), no event record.
    counting = getattr(launch, "counting", None)
    cparams = launch.captured_params_ptr if counting is not None else params
    counter_order, nblocks = counting if counting is not None else (None, 0)
    counts_mark = counter_order is order and outer is None

    def issue(stream_ptr: int = stream) -> bool:
        if group._epoch != epoch or ex.broken:
            return False
        # The capture query runs on every repeat, even on an unchanged stream: the user may
        # begin a capture on that very stream between two calls, and a call captured unawares
        # would be launched cooperatively (not a plain kernel node) and not kept for the graph's
        # life once the group drops its prepared calls.  The legacy stream never captures
        # (streams.is_capturing).
        captured = stream_ptr not in _LEGACY and query(stream_ptr) != 0
        # StreamOrder's public fast-path fields, read here so that a steady repeat calls none of
        # its methods.
        if outer is not None and outer.ready != stream_ptr:
            outer.enter(stream_ptr, captured)
        if order.ready != stream_ptr:
            order.enter(stream_ptr, captured)
        if captured:
            kept[key] = call
        if whole is not None:
            whole(stream_ptr, captured)
        elif captured or eager is None:   # Launch.__call__'s choice (Launch.driver_calls)
            in_capture(stream_ptr, cparams if captured else params, 0)
        else:
            eager(stream_ptr, params, 0)
            if counter_order is not None:
                counter_order.total += nblocks
                if counts_mark and stream_ptr not in _LASTING:
                    if counter_order.counted_on != stream_ptr:
                        counter_order.counted(stream_ptr, 0)
                    if tally is not None:
                        tally[0] += 1
                    return True
        if order.held != stream_ptr or outer is not None:
            owner = keep() if keep is not None and stream_ptr == stream else None
            order.leave(stream_ptr, captured, owner)
            if outer is not None:
                outer.leave(stream_ptr, captured, owner)
        if tally is not None:
            tally[0] += 1
        return True
    return issue


class LaunchGroup:
    prog: Program
    proto: str
    tables: Tables
    executor: Executor

    def _init_calls(self) -> None:
        import cupy

        self.cupy = cupy
        self._scratch: Dict[int, object] = {}
        self._temp: Dict[int, object] = {}
        self._prepared: Dict[tuple, PreparedCall] = {}
        # Bumped whenever _prepared is dropped, so a Reissue knows its call is stale.
        self._epoch = 0
        # Calls captured into a CUDA graph, by id: a graph may be replayed at
        # any time, so what its launches address lives as long as the group.
        self._captured: Dict[int, PreparedCall] = {}
        split = tile_split(self.proto)   # fixed for the group's life, like its slot size
        self._shape = lru_cache(maxsize=64)(
            lambda n, itemsize: call_shape(self.prog, n, itemsize, self.proto, self.tables.max_cnt, split))

    @property
    def ranks(self):
        """The ranks this process runs, in the order calls take their buffers."""
        return self.tables.ranks

    def rank_device(self, rank: int) -> int:
        """The GPU that holds `rank`'s buffers (all ranks share one unless a mode says otherwise)."""
        return self.executor.device.id

    def _grown(self, pool: Dict[int, object], rank: int, nbytes: int, stream: int, captured: bool = False) -> int:
        if nbytes == 0:
            return 0
        buf = pool.get(rank)
        if buf is None or buf.nbytes < nbytes:
            nbytes = 1 << (nbytes - 1).bit_length()   # grow geometrically: few replacements
            order = self.executor.order
            if faults.active("pool-stream"):
                buf = self.cupy.zeros(nbytes, dtype=self.cupy.uint8)
                self._drop_prepared()
            else:
                # Under the call's stream, so the pool reuses it only for work
                # ordered after this call there; zeroed on that stream too.
                # While it captures a graph: made now, on the set-up stream.
                s = streams.setup_stream() if captured else streams.wrap(stream)
                with streams.current(s):
                    buf = self.cupy.empty(nbytes, dtype=self.cupy.uint8)
                self.cupy.cuda.runtime.memsetAsync(buf.data.ptr, 0, nbytes, s.ptr)
                if captured:
                    s.synchronize()
                # Queued launches still address the old buffer through their
                # prepared calls: both go only once those launches are done.
                order.retire((pool.get(rank), self._prepared))
                self._drop_prepared()
            pool[rank] = buf
        return buf.data.ptr

    def _compute_table(self, compute, in_elems: int, dtype: str, cs: int) -> List[int]:
        """A fused IR's part of the buffer table: zeros up to GC3_MAX_BUFS, then per rank of the
        group its compute input addresses (kernels/common.cuh, GC3_CMP_PTRS).  Refuses a call the
        compute steps would evaluate out of shape, naming what differs."""
        spec = self.prog.compute
        where = f"{self.prog.name} ({spec.op} + {self.prog.coll})"
        if compute is None or len(compute) != len(self.ranks):
            raise GC3Error(f"{where}: a fused program's call needs the compute inputs "
                           f"({', '.join(spec.names)}) of each of its {len(self.ranks)} rank(s) here")
        if dtype != spec.dtype:
            raise GC3Error(f"{where}: the program computes in {spec.dtype}; the call is {dtype}")
        if in_elems != spec.out_elems:
            raise GC3Error(f"{where}: the operator fills {spec.out_elems} elements per rank; the call has {in_elems}")
        _, _, unit = spec.split()
        if any(u * unit != cs for u in self.tables.chunk_units):
            raise GC3Error(f"{where}: compute steps fill chunks of {sorted(u * unit for u in self.tables.chunk_units)} "
                           f"elements but {in_elems} elements make chunks of {cs}")
        width = abi.C["GC3_CMP_PTRS"]
        table = [0] * abi.C["GC3_MAX_BUFS"]
        for k, ptrs in enumerate(compute):
            if len(ptrs) != len(spec.names) or len(ptrs) > width:
                raise GC3Error(f"{where}: rank {self.ranks[k]} gives {len(ptrs)} compute input(s); "
                               f"the operator reads {', '.join(spec.names)}")
            table += [int(p) for p in ptrs] + [0] * (width - len(ptrs))
        return table

    def _epilogue_table(self, epilogue, dtype: str, op: str) -> List[int]:
        """An epilogue IR's part of the buffer table, in the compute inputs' place (the two never
        meet: tables.check_epilogue): zeros up to GC3_MAX_BUFS, then per rank of the group the
        epilogue's words (tables.epilogue_words) with that rank's bias and residual addresses.
        The caller vouches for their sizes: the bias holds cols elements, the residual the
        output's, both of the call's dtype."""
        epi = self.prog.epilogue
        where = f"{self.prog.name} ({self.prog.coll} + {epi})"
        names = epi.names
        if epilogue is None and not names:
            epilogue = [()] * len(self.ranks)
        if epilogue is None or len(epilogue) != len(self.ranks):
            raise GC3Error(f"{where}: the call needs the epilogue's inputs ({', '.join(names) or 'none'}) of each "
                           f"of its {len(self.ranks)} rank(s) here")
        if op != "sum":
            raise GC3Error(f"{where}: an epilogue program runs as a sum (its epilogue says the rest); the call "
                           f"asks for {op}")
        floats_only = [k for k, _ in epi.items if k in ("scale", "bias", "residual")]
        if floats_only and not dtype_info(dtype).is_float:
            raise GC3Error(f"{where}: {', '.join(floats_only)} on integer data ({dtype}); only avg is defined "
                           f"for integers")
        table = [0] * abi.C["GC3_MAX_BUFS"]
        for k, ptrs in enumerate(epilogue):
            if len(ptrs) != len(names) or not all(int(p) for p in ptrs):
                raise GC3Error(f"{where}: rank {self.ranks[k]} gives the addresses {list(ptrs)}; the epilogue "
                               f"reads {', '.join(names) or 'none'}, each a non-null device address")
            named = dict(zip(names, (int(p) for p in ptrs)))
            table += epilogue_words(self.prog, named.get(epi.arg("bias"), 0), named.get(epi.arg("residual"), 0))
        return table

    def _prepare(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                 stream: int, captured: bool = False, compute=None, epilogue=None) -> "PreparedCall":
        info = dtype_info(dtype)
        itemsize = info.np.itemsize
        lay, shape = self._shape(in_elems, itemsize)
        if self.prog.fused:
            cmp_table = self._compute_table(compute, in_elems, info.name, lay.cs)
        elif compute is not None:
            raise GC3Error(f"{self.prog.name}: compute inputs given to a program without compute steps")
        if self.prog.epilogue is not None:
            cmp_table = self._epilogue_table(epilogue, info.name, op)
        elif epilogue is not None:
            raise GC3Error(f"{self.prog.name}: epilogue inputs given to a program without an epilogue")
        ptrs: List[int] = []
        pre: List[Copy] = []
        post: List[Copy] = []
        # Compute steps fill the buffers: a fused program that never names `i` gets no address
        # bound to it (binding an unused input would cost an out-of-place program a copy per call).
        no_input = self.prog.fused and not self.tables.uses_input
        for k, r in enumerate(self.tables.ranks):
            b = Binding(0, out_ptrs[k]) if no_input else bind(self.prog, lay, r, in_ptrs[k], out_ptrs[k], itemsize)
            if b.temp_bytes:
                b = bind(self.prog, lay, r, in_ptrs[k], out_ptrs[k], itemsize,
                         temp_ptr=self._grown(self._temp, r, b.temp_bytes, stream, captured))
            pre += [b.pre] if b.pre else []
            post += [b.post] if b.post else []
            scratch = self._grown(self._scratch, r, self.prog.gpu(r).s_chunks * shape.cs * itemsize, stream, captured)
            ptrs.extend((b.i, b.o, scratch))
        if self.prog.fused or self.prog.epilogue is not None:
            ptrs += cmp_table[len(ptrs):]
        keep = (self._scratch.copy(), self._temp.copy())
        bufs = self.executor.buffer_table(tuple(ptrs), stream, captured)
        return PreparedCall(self.executor.prepare(info.name, op, bufs, shape), pre, post, shape, keep)

    def run_ptrs(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                 stream=None, compute: Optional[Sequence[Sequence[int]]] = None,
                 epilogue: Optional[Sequence[Sequence[int]]] = None) -> None:
        """Enqueue one call on raw device addresses (one per rank of the group),
        on `stream` (a CuPy stream, a raw handle, or None for CuPy's current one).
        A fused program's call also takes, per rank, the addresses of its compute
        inputs in the operator's order (`gc3.ir.ComputeSpec.names`); an epilogue program's call,
        per rank, the addresses of its epilogue's named inputs (`gc3.ir.epilogue.Epilogue.names`).
        Everything but the launch itself is cached per (addresses, size, dtype, op).
        A call on a stream capturing a CUDA graph is captured (streams.py, point 6)."""
        ptr = streams.handle(stream)
        captured = streams.is_capturing(ptr)
        self.executor.order.enter(ptr, captured)
        key = self._key(in_ptrs, out_ptrs, in_elems, dtype, op, compute, epilogue)
        cmp, epi = key[-2], key[-1]
        call = self._prepared.get(key)
        if call is None:
            if len(self._prepared) >= PREPARED_CALLS_MAX:
                self.executor.order.retire(self._prepared)
                self._drop_prepared()
            call = self._prepare(in_ptrs, out_ptrs, in_elems, dtype, op, ptr, captured, cmp, epi)
            self._prepared[key] = call
        if captured:
            self._captured[id(call)] = call
        call(ptr, captured)
        self.executor.order.leave(ptr, captured)

    def _drop_prepared(self) -> None:
        self._prepared = {}
        self._epoch += 1

    @staticmethod
    def _key(in_ptrs, out_ptrs, in_elems: int, dtype: str, op: str, compute=None, epilogue=None) -> tuple:
        cmp = None if compute is None else tuple(tuple(int(p) for p in ptrs) for ptrs in compute)
        epi = None if epilogue is None else tuple(tuple(int(p) for p in ptrs) for ptrs in epilogue)
        return (tuple(in_ptrs), tuple(out_ptrs), in_elems, dtype, op, cmp, epi)

    def prepared(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str, op: str,
                 compute=None) -> Optional[PreparedCall]:
        """The prepared call run_ptrs issues for exactly these arguments, once one
        such call has been made (None before, or after the group dropped it):
        its `launch` is the kernel launch with its packed parameters."""
        return self._prepared.get(self._key(in_ptrs, out_ptrs, in_elems, dtype, op, compute))

    def reissue(self, in_ptrs: Sequence[int], out_ptrs: Sequence[int], in_elems: int, dtype: str,
                op: str) -> Optional[Reissue]:
        """A Reissue of the prepared call of these arguments, or None when there is none."""
        call = self.prepared(in_ptrs, out_ptrs, in_elems, dtype, op)
        return None if call is None else Reissue(self, call)

    def __call__(self, inputs: Sequence, outputs: Sequence, op: str = "sum", dtype: Optional[str] = None,
                 stream=None) -> List:
        """Enqueue one collective: rank ranks[k] reads inputs[k] and
        writes outputs[k] (cupy arrays; views of one allocation for an in-place
        call).  `dtype` names the element type where the arrays' own cannot
        (bfloat16 travels as uint16)."""
        n = len(self.ranks)
        if len(inputs) != n or len(outputs) != n:
            raise ValueError(f"{self.prog.name}: need {n} input and {n} output buffers")
        self.run_ptrs([a.data.ptr for a in inputs], [a.data.ptr for a in outputs], inputs[0].size,
                      dtype or inputs[0].dtype, op, stream)
        return list(outputs)

    def check(self) -> None:
        """Synchronise and raise RuntimeTimeoutError if a wait gave up."""
        self.executor.check()
