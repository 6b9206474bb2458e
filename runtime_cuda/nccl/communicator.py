"""`NcclCommunicator`: cupy.cuda.nccl's communicator, served by gc3 where a
catalog algorithm matches and by NCCL everywhere else.

Same constructor, methods and argument order as `cupy.cuda.nccl`
(raw pointers, counts, NCCL_* dtype and op codes, stream pointer), so a
program written for cupy.cuda.nccl runs after swapping its import.  Each
communicator owns a real NCCL communicator: it is the fallback, and the
channel over which gc3's runtime exchanges its IPC handles.

groupStart/groupEnd keep NCCL's meaning: calls between them are issued
together at groupEnd, on gc3 when gc3 serves all of them and otherwise all on
NCCL as one NCCL group (see `dispatch.run_group`).  The group is per thread,
as NCCL's is.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import Dict, List, Optional, Tuple

from gc3.errors import CommunicatorError
from runtime_cuda.core import faults
from runtime_cuda.core.streams import StreamOrder, owner_ref

from .arrays import ArrayCollectives, is_array
from .backend import make_backend, unavailable_backend
from .call import COLLECTIVES, Call
from .catalog import load_catalog, user_override
from .constants import DTYPE_NAMES, OP_NAMES, dtype_name, op_name
from .dispatch import P2P, Dispatcher, run_group
from .fallback import NcclFallback, orders_launches, originals
from .log import get_logger
from .autotune import agree
from .rendezvous import NcclExchange
from .selection import Selector
from .surface import CommunicatorSurface


class _GroupState(threading.local):
    # A class attribute, so that reading the depth of a thread that never opened a
    # group is a plain lookup (getattr with a default on a thread-local costs a
    # caught AttributeError: most of a repeat call's time).
    depth = 0

    def __init__(self):
        self.items = []


_group = _GroupState()
_CALLS = COLLECTIVES + P2P
# How many groups are open in all threads together: a repeat call reads this plain global
# first and the thread-local depth only while some thread has a group open (reading a
# thread-local costs several times a global).  A thread's own open group always shows
# here, since that thread counted it in; the lock keeps threads' counts from mixing.
_open_groups = 0
_open_lock = threading.Lock()
# What a named call finds where the repeat cache has nothing: an entry whose issue refuses
# (bool() is False, from C), so that hit and miss take the same test.
_MISS = (bool,)


def _pending() -> List[Tuple["NcclCommunicator", Call]]:
    return _group.items


def _count_open(delta: int) -> None:
    global _open_groups
    with _open_lock:
        _open_groups += delta


def groupStart() -> None:
    _pending()
    _group.depth += 1
    _count_open(1)


def groupEnd() -> None:
    _pending()
    if _group.depth == 0:
        raise CommunicatorError("groupEnd() without a matching groupStart()")
    _group.depth -= 1
    _count_open(-1)
    if _group.depth == 0:
        items, _group.items = _group.items, []
        decisions = run_group([(comm._dispatch, call) for comm, call in items])
        for (comm, _), decision in zip(items, decisions):
            comm._count(decision)


def get_unique_id() -> tuple:
    """NCCL's unique id (a tuple of 128 ints, as cupy.cuda.nccl returns it)."""
    return originals()["get_unique_id"]()


def get_version() -> int:
    from cupy.cuda import nccl
    return nccl.get_version()


def get_build_version() -> int:
    from cupy.cuda import nccl
    return nccl.get_build_version()


def __getattr__(name):
    if name == "NcclError":
        from cupy.cuda import nccl
        return nccl.NcclError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class NcclCommunicator(ArrayCollectives, CommunicatorSurface):
    """One rank of a communicator, for the GPU current at construction.

    Args (as cupy.cuda.nccl): ndev, total ranks; commId, from get_unique_id();
    rank, this process's rank.
    """

    def __init__(self, ndev: int, commId: tuple, rank: int):
        nccl_comm = originals()["NcclCommunicator"](ndev, commId, rank)
        self._setup(nccl_comm, ndev, rank, make_backend)

    @classmethod
    def from_mpi(cls, mpi_comm) -> "NcclCommunicator":
        """A communicator over an mpi4py communicator, for the current GPU, without
        NCCL: gc3's rendezvous goes over MPI and the calls gc3 does not serve go to
        a host-staged MPI stand-in (`hoststaged`).  For several processes sharing
        one GPU, which NCCL refuses: tests, the fuzz, debugging on one GPU."""
        import cupy

        from .hoststaged import HostStagedNccl
        from .rendezvous import MpiExchange

        fallback = HostStagedNccl(mpi_comm, cupy.cuda.runtime.getDevice())
        comm = cls.__new__(cls)
        comm._setup(fallback, mpi_comm.Get_size(), mpi_comm.Get_rank(), make_backend,
                    nccl_group=(fallback.group_start, fallback.group_end), exchange=MpiExchange(mpi_comm),
                    nccl=False)
        return comm

    @staticmethod
    def initAll(devices) -> list:
        """One communicator per device, all in this process (NCCL serves every call:
        gc3's runtime drives one GPU per process)."""
        raw = originals()["NcclCommunicator"].initAll(devices)
        why = "communicator from initAll: gc3's runtime drives one GPU per process"
        comms = []
        for rank, nccl_comm in enumerate(raw):
            comm = NcclCommunicator.__new__(NcclCommunicator)
            comm._setup(nccl_comm, len(raw), rank, unavailable_backend(why), identify=False)
            comms.append(comm)
        return comms

    @classmethod
    def without_nccl(cls, exchange, device: int, reason: str) -> "NcclCommunicator":
        """A communicator with no NCCL at all: gc3 serves what its catalog covers and
        every other call raises CommunicatorError saying `reason` (why NCCL is absent:
        ranks sharing one GPU, or the fallback switched off).  `exchange`: any
        rendezvous.*Exchange; its rank and size are the communicator's."""
        from .fallback import Refusing

        refusing = Refusing(device, reason)
        comm = cls.__new__(cls)
        comm._setup(refusing, exchange.size, exchange.rank, make_backend, exchange=exchange, fallback=refusing,
                    nccl=False)
        return comm

    def _setup(self, nccl_comm, ndev: int, rank: int, backend_factory, nccl_group=None, exchange=None,
               order=None, fallback=None, nccl: bool = True, identify: bool = True) -> None:
        # nccl: whether real NCCL serves what gc3 does not (the default catalog must then
        # never lose to it); identify: whether the runtime can serve at all, so that the
        # ranks' GPUs are worth fingerprinting (a collective step: initAll's ranks share a
        # thread and cannot take it).
        env = os.environ
        self._nccl = nccl_comm
        self._rank, self._size = rank, ndev
        self._device = nccl_comm.device_id()
        log = get_logger(env)
        order = order if order is not None else StreamOrder(fault=faults.active("stream-order"))
        if exchange is None:
            exchange = NcclExchange(nccl_comm, rank, ndev, order)
        # The catalog measured on GPUs like these, unless the user names one (`machine`).
        self.machine = (agree(exchange, self._device, env, nccl, log)
                        if identify and not user_override(env) else None)
        catalog = load_catalog(env, self.machine)
        self._backend = backend_factory(exchange, rank, ndev, self._device, catalog)
        if hasattr(self._backend, "order"):   # its launch groups order their calls by the communicator's
            self._backend.order = order
        fallback = fallback or NcclFallback(nccl_comm, nccl_group)
        self._dispatch = Dispatcher(Selector(catalog, log, self._backend.check), fallback, self._backend, order)
        if nccl and order.bridge is None and orders_launches() and hasattr(fallback, "bridge"):
            order.bridge = (fallback.bridge(rank) if not faults.active("nccl-bridge")
                            else lambda stream: None)
        self._order, self._log = order, log
        # Repeats of calls served before, by the call's own arguments, the stream included:
        # (what issues it again, taking no argument and returning False where it cannot;
        # route; what it was made from).
        self._repeats: Dict[tuple, tuple] = {}
        self._served: Counter = Counter()
        # Repeats counted per route in one-item lists, which the repeat itself bumps; folded
        # into `served` when that is read.
        self._tally: Dict[str, List[int]] = {}

    @property
    def served(self) -> Counter:
        """How many calls each gc3 algorithm (by name) and NCCL ("NCCL") served."""
        tally, served = self._tally, self._served
        for route, cell in tally.items():
            if cell[0]:
                served[route] += cell[0]
                cell[0] = 0
        return served

    # --- what cupy's communicator reports (device_id, rank_id, size: CommunicatorSurface) ---
    @property
    def comm(self) -> int:
        return self._nccl.comm

    def check_async_error(self) -> None:
        self._nccl.check_async_error()
        self._backend.check_async_error()

    def destroy(self) -> None:
        self._repeats = {}
        self._backend.close()
        self._nccl.destroy()

    def abort(self) -> None:
        self._repeats = {}
        self._backend.abandon()
        self._nccl.abort()

    def adopt_stream(self, stream: int) -> None:
        """The next call comes on `stream`, already ordered after this communicator's
        earlier calls by the caller (a CUDA graph capture stream): no event hand-over."""
        if self._dispatch.order is not None:
            self._dispatch.order.adopt(int(stream))
        adopt = getattr(self._backend, "adopt", None)   # the Unavailable backend has no launch groups
        if adopt is not None:
            adopt(int(stream))

    # --- collectives, cupy.cuda.nccl's signatures ---------------------------
    # Each named call looks its repeat up itself and calls what the cache holds, so a repeat is
    # two Python frames above the driver (the named call's and the launch group's): calling
    # submit first would add a third, and a generic entry point (*args) would cost as much as
    # that frame.  So every one spells out submit's repeat key for its own argument order (the
    # same tuple it passes to submit: collective, sendbuf, recvbuf, count, datatype, op, stream,
    # root) and takes submit's path on a miss.  While any thread has a group open, the call takes
    # submit's path, which reads this thread's depth.  Keep the key and submit's arguments alike
    # (tests/test_dropin_repeats.py reads both out of each method).

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        """allreduce with cupy.cuda.nccl's allReduce(sendbuf, recvbuf, count, datatype, op, stream)."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("allreduce", sendbuf, recvbuf, count, datatype, op, stream, 0), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("allreduce", sendbuf, recvbuf, count, datatype, op, stream, 0)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        """reducescatter with cupy.cuda.nccl's reduceScatter(sendbuf, recvbuf, recvcount, datatype, op,
        stream)."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("reducescatter", sendbuf, recvbuf, recvcount, datatype, op, stream, 0), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("reducescatter", sendbuf, recvbuf, recvcount, datatype, op, stream, 0)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        """allgather with cupy.cuda.nccl's allGather(sendbuf, recvbuf, count, datatype, stream)."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("allgather", sendbuf, recvbuf, count, datatype, None, stream, 0), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("allgather", sendbuf, recvbuf, count, datatype, None, stream, 0)

    def allToAll(self, sendbuf, recvbuf, count, datatype, stream):
        """alltoall with cupy.cuda.nccl's allToAll(sendbuf, recvbuf, count, datatype, stream).
        A gc3 extension (cupy.cuda.nccl has none): `count` elements to and from each peer."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("alltoall", sendbuf, recvbuf, count, datatype, None, stream, 0), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("alltoall", sendbuf, recvbuf, count, datatype, None, stream, 0)

    def bcast(self, buff, count, datatype, root, stream):
        """broadcast with cupy.cuda.nccl's bcast(buff, count, datatype, root, stream)."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("broadcast", buff, buff, count, datatype, None, stream, root), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("broadcast", buff, buff, count, datatype, None, stream, root)

    def send(self, sendbuf, count, datatype, peer, stream):
        """send with cupy.cuda.nccl's send(sendbuf, count, datatype, peer, stream)."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("send", sendbuf, 0, count, datatype, None, stream, peer), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("send", sendbuf, 0, count, datatype, None, stream, peer)

    def recv(self, recvbuf, count, datatype, peer, stream):
        """recv with cupy.cuda.nccl's recv(recvbuf, count, datatype, peer, stream)."""
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("recv", 0, recvbuf, count, datatype, None, stream, peer), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("recv", 0, recvbuf, count, datatype, None, stream, peer)

    # broadcast and reduce take cupy's pointer form or the array form (arrays.ArrayCollectives);
    # with all of the pointer form's arguments (the array form takes fewer) they are that form,
    # and a hasattr on an int would cost more than a repeat's lookup.

    def _pointer_reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        """reduce with cupy.cuda.nccl's _pointer_reduce(sendbuf, recvbuf, count, datatype, op, root, stream).
        """
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("reduce", sendbuf, recvbuf, count, datatype, op, stream, root), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("reduce", sendbuf, recvbuf, count, datatype, op, stream, root)

    def _pointer_broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        """broadcast with cupy.cuda.nccl's _pointer_broadcast(sendbuff, recvbuff, count, datatype, root, stream).
        """
        try:
            hit = _MISS if _open_groups else self._repeats.get(
                ("broadcast", sendbuff, recvbuff, count, datatype, None, stream, root), _MISS)
        except TypeError:   # an unhashable argument: submit's checks say what is wrong with it
            hit = _MISS
        if not hit[0]():
            self._submit("broadcast", sendbuff, recvbuff, count, datatype, None, stream, root)

    def broadcast(self, *args, **kwargs):
        """cupy's broadcast(sendbuff, recvbuff, count, datatype, root, stream), or the
        array form broadcast(x, root=0, out=None, stream=None)."""
        if len(args) == 6 and not kwargs and not _open_groups:
            sendbuff, recvbuff, count, datatype, root, stream = args
            try:
                hit = self._repeats.get(("broadcast", sendbuff, recvbuff, count, datatype, None, stream, root), _MISS)
            except TypeError:   # an unhashable argument: the pointer form's checks say what is wrong
                hit = _MISS
            if hit[0]():
                return
        if len(args) == 6 or not is_array(args, kwargs):
            return self._pointer_broadcast(*args, **kwargs)
        return self.array_broadcast(*args, **kwargs)

    def reduce(self, *args, **kwargs):
        """cupy's reduce(sendbuf, recvbuf, count, datatype, op, root, stream), or the
        array form reduce(x, root=0, op="sum", out=None, stream=None)."""
        if len(args) == 7 and not kwargs and not _open_groups:
            sendbuf, recvbuf, count, datatype, op, root, stream = args
            try:
                hit = self._repeats.get(("reduce", sendbuf, recvbuf, count, datatype, op, stream, root), _MISS)
            except TypeError:   # an unhashable argument: the pointer form's checks say what is wrong
                hit = _MISS
            if hit[0]():
                return
        if len(args) == 7 or not is_array(args, kwargs):
            return self._pointer_reduce(*args, **kwargs)
        return self.array_reduce(*args, **kwargs)

    def submit(self, coll: str, sendbuf, recvbuf, count, datatype, op, stream, root=0) -> str:
        """Any call by collective name (what `gc3 bench` drives); returns what served it:
        a gc3 algorithm's name, "NCCL", or "group" while a group is open."""
        # The hot path.  A repeat of a call gc3 served, with the same arguments, is one
        # dictionary hit: its checks, selection and set-up gave the same answers last time
        # (they depend on nothing else), so it goes straight to the prepared launch, still
        # ordered after this communicator's earlier calls (StreamOrder) and still captured
        # where the stream captures a graph (Reissue).  Inside a group it must be recorded.
        key = (coll, sendbuf, recvbuf, count, datatype, op, stream, root)
        try:
            hit = self._repeats.get(key)
        except TypeError:   # an unhashable argument: the checks below say what is wrong with it
            hit = None
        if hit is not None and not (_open_groups and _group.depth):
            if hit[0]():
                return hit[1]
            del self._repeats[key]   # the launch group dropped that prepared call: bind again below
        # A first call: plain lookups; the wordy checks run only once one fails.
        datatype, count, root = int(datatype), int(count), int(root)
        op = None if op is None else int(op)
        if (coll not in _CALLS or datatype not in DTYPE_NAMES or (op is not None and op not in OP_NAMES)
                or count < 0 or not 0 <= root < self._size):
            self._reject(coll, datatype, op, count, root)
        call = Call(coll, int(sendbuf), int(recvbuf), count, datatype, op, int(stream), self._size, self._rank, root)
        if _group.depth:
            _pending().append((self, call))
            return "group"
        decision = self._dispatch.run(call)
        route = self._count(decision)
        if decision is not None:
            self._remember(key, decision, route)
        return route

    # The named calls above come here with one Python call, not two.
    _submit = submit

    def _remember(self, key: tuple, decision, route: str) -> None:
        # GC3_DEBUG=TRACE logs every call, which only selection does: no repeats then.
        if self._log.isEnabledFor(logging.DEBUG):
            return
        if decision.uses_gc3:
            reissue = getattr(self._backend, "reissue", None)
            go = reissue(decision) if reissue is not None else None
        else:   # routed to NCCL: the same answer for the same arguments, so skip selection too
            bind = getattr(self._dispatch.nccl, "bind", None)
            go = bind(decision.call) if bind is not None else None
        if go is None:
            return
        if len(self._repeats) > 4096:   # addresses that come and go (a caching allocator): start over
            self._repeats = {}
        ptr, tally = decision.call.stream, self._tally.setdefault(route, [0])
        bind = getattr(go, "bind", None)
        if bind is not None:   # a launch group's Reissue: the order and the tally ride in its one frame
            issue = bind(ptr, self._order, tally)
        else:
            issue = _repeat_plain(go, ptr, self._order, tally, None if decision.uses_gc3 else decision.call)
        try:
            self._repeats[key] = (issue, route, go)
        except TypeError:   # an unhashable argument that int() takes (a 0-d array): never a repeat
            return

    def prepared_launch(self, coll: str, sendbuf, recvbuf, count, datatype, op, stream, root=0):
        """The kernel launch (runtime_cuda.core.launcher.Launch) that a repeat of exactly this
        call issues, once gc3 has served it; None when it has not (not called yet, served
        by NCCL, avg, or GC3_DEBUG=TRACE, which takes every call through selection).
        For measuring the drop-in's host path against a bare launch of the same kernel."""
        return getattr(self.prepared_reissue(coll, sendbuf, recvbuf, count, datatype, op, stream, root),
                       "launch", None)

    def prepared_reissue(self, coll: str, sendbuf, recvbuf, count, datatype, op, stream, root=0):
        """What a repeat of exactly this call runs under the communicator's own lookup
        (runtime_cuda.core.group.Reissue, called with the stream handle), or None as above."""
        hit = self._repeats.get((coll, sendbuf, recvbuf, count, datatype, op, stream, root))
        return None if hit is None else hit[2]

    def _reject(self, coll, datatype, op, count, root):
        where = f"rank {self._rank}: {coll}"
        if coll not in _CALLS:
            raise CommunicatorError(f"rank {self._rank}: unknown collective {coll!r} (known: {', '.join(_CALLS)})")
        try:
            dtype_name(datatype)
            if op is not None:
                op_name(op)
        except ValueError as exc:
            raise CommunicatorError(f"{where}: {exc}") from None
        if count < 0:
            raise CommunicatorError(f"{where}: count must be >= 0, got {count}")
        what = "peer" if coll in P2P else "root"
        raise CommunicatorError(f"{where}: {what} {root} is not a rank of this {self._size}-rank communicator")

    def _count(self, decision) -> str:
        route = decision.candidate.name if decision is not None and decision.uses_gc3 else "NCCL"
        self._served[route] += 1
        return route


def _repeat_plain(go, ptr: int, order: StreamOrder, tally: List[int], call: Optional[Call] = None):
    """A repeat through a callable taking the stream (NCCL's method with all else bound;
    a backend's re-issue without Reissue.bind), in the shape the repeat cache holds: no
    argument, False where `go` refused (it returned False; NCCL's methods return None).
    `call`: what NCCL serves.  NCCL orders it after the communicator's earlier NCCL calls
    itself, so once the order knows its stream's latest work is NCCL's (`nccl_on`), a
    repeat there marks nothing (StreamOrder.leave's `nccl`); what NCCL's order does not
    cover (Call.nccl_ordered, Call.nccl_launches: a call NCCL skips, the all-to-all's own
    copy before its launch) enters and leaves the order as a call of gc3's does."""
    keep = owner_ref(ptr)   # see StreamOrder.leave: weak, as the repeat cache holds this
    ordered = call is not None and call.nccl_ordered
    launches = call is not None and call.nccl_launches

    def issue() -> bool:
        if order.ready != ptr:
            order.enter(ptr, None, ordered)
        if go(ptr) is False:
            return False
        if order.held != ptr and not (launches and order.nccl_on == ptr):
            order.leave(ptr, None, keep() if keep is not None else None, launches)
        tally[0] += 1
        return True
    return issue
