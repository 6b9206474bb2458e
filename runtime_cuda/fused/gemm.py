"""GEMMs fused with a collective, on CuPy arrays.

    gemm_reduce_scatter(a, b, comm)    rank r: A_r [M, K_r], B_r [K_r, N] -> rows r of sum_s A_s B_s  [M/n, N]
    all_gather_gemm(a, b, comm)        rank r: A_r [m, K], B_r [K, N_r]  -> concat_s(A_s) @ B_r      [n*m, N_r]
    gemm_all_reduce(a, b, comm)        as gemm_reduce_scatter, every rank gets the whole sum           [M, N]
    gemm_all_to_all(a, b, splits, comm) rank r: C_r = A_r B_r [M, N]; rows [off_d, off_d + splits_r[d])
                                       go to rank d, which gets concat over sources s of their blocks

`comm` is a groups.VirtualGemmGroup (a, b, out and streams are lists with one
entry per rank; the result is a list) or a groups.IpcGemmGroup (this
process's arrays; the result is an array).  Matrices are 2-D C-contiguous
CuPy arrays of float32, float16 or bfloat16; CuPy has no bfloat16, so uint16
arrays are read as bfloat16 bits (the layout torch and ml_dtypes use), and
results have the inputs' dtype.  The GEMM accumulates in fp32 (cuBLAS,
tensor cores); for the sums (reduce-scatter, all-reduce) each rank's partial
product stays fp32 (or, with GC3_FUSED_PARTIALS=input, is rounded once to the
input's 16-bit type, halving the bytes that cross the links), the partials are
added in fp32 in rank order and the sum is rounded once to the output dtype.

How it overlaps: each rank's GEMM runs as one cuBLAS call per destination
chunk on its compute stream, peers' chunks first in rank-swizzled order
(rank r starts with the chunk of rank r+1, so no destination is everyone's
first), and each finished chunk goes at once to its destination by the copy
engine (cudaMemcpyAsync into the peer's buffer) on the transfer stream of
that destination (one per peer, so that the copies to different peers run at
once, each on its own copy engine), then the destination's arrival flag is
released (gemm_signal).  For AG+GEMM the
pushes of A_r come first and the GEMM of chunk s waits for chunk s's arrival
flag.  Buffers come in two copies used by alternate calls; before writing
into a peer's copy a rank waits for that peer's "consumed" flag of the call
two back, so back-to-back calls never overwrite data still being read.

Below GC3_FUSED_MIN_ROWS rows per chunk the chunked GEMM costs more than the
overlap can save: one cuBLAS call then the same transfers run instead
(GC3_DEBUG=INFO logs the choice; GC3_FUSED=0/1 or fused= forces it).
"""
from __future__ import annotations

import operator
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from gc3.errors import GC3Error, InputError
from gc3 import settings

from runtime_cuda.core import streams
from runtime_cuda.nccl.log import get_logger

from .groups import ARRIVE, DONE, ShapeState, VirtualGemmGroup, _Group, _LocalRank
from . import gemm_signal, schedule
from .schedule import arrival_order, chunk_schedule, peers_first

# storage dtype -> (dtype name, cudaDataType, output kind of gc3_sum_round)
TYPES = {"uint16": ("bfloat16", 14, 1), "float16": ("float16", 2, 2), "float32": ("float32", 0, 0)}
_R_32F = 0
_COMPUTE_32F = 68      # CUBLAS_COMPUTE_32F: fp32 accumulation on tensor cores
_GEMM_DEFAULT = -1     # CUBLAS_GEMM_DEFAULT
_MEMCPY_DEFAULT = 4    # cudaMemcpyDefault: the pointers say where (peer memory mapped by IPC included)
DEFAULT_MIN_ROWS = settings.default("GC3_FUSED_MIN_ROWS")



# --- choices ---------------------------------------------------------------
def fuse_decision(op: str, rows_per_chunk: int, fused: Optional[bool] = None, env=None) -> Tuple[bool, str]:
    """(run fused?, why)."""
    env = os.environ if env is None else env
    if fused is not None:
        return bool(fused), "fused=%s asked by the caller" % bool(fused)
    raw = env.get("GC3_FUSED", "").strip()
    if raw in ("0", "1"):
        return raw == "1", f"GC3_FUSED={raw}"
    if raw:
        raise InputError(f"environment variable GC3_FUSED={raw!r}: expected 0 (sequential) or 1 (fused)")
    min_rows = settings.get("GC3_FUSED_MIN_ROWS", env)
    if rows_per_chunk < min_rows:
        return False, (f"{rows_per_chunk} rows per chunk < GC3_FUSED_MIN_ROWS={min_rows}: chunked GEMMs would cost "
                       "more than the overlap saves")
    return True, f"{rows_per_chunk} rows per chunk >= GC3_FUSED_MIN_ROWS={min_rows}"


def row_bounds(m: int, n: int) -> List[int]:
    """Row blocks of the n ranks (the first ones one row shorter when n does not divide m)."""
    return [m * d // n for d in range(n + 1)]


def check_splits(splits: Sequence[int], n: int, rows: int, where: str) -> List[int]:
    if len(splits) != n:
        raise GC3Error(f"{where}: splits has {len(splits)} entries, expected one per rank ({n})")
    out = []
    for d, s in enumerate(splits):
        try:
            v = operator.index(s)   # ints and numpy integers; floats and strings refused
        except TypeError:
            v = -1
        if isinstance(s, bool) or v < 0:
            raise GC3Error(f"{where}: splits[{d}]={s!r} is not an int >= 0")
        out.append(v)
    if sum(out) != rows:
        raise GC3Error(f"{where}: splits {out} add up to {sum(out)} rows, but A has {rows}")
    return out


# --- arguments ---------------------------------------------------------------
def _per_rank(group: _Group, x, what: str, op: str) -> list:
    if isinstance(group, VirtualGemmGroup):
        if not isinstance(x, (list, tuple)) or len(x) != group.n:
            raise GC3Error(f"{op}: {what} must be a list of {group.n} entries, one per rank of the virtual group")
        return list(x)
    return [x]


def _matrix(x, what: str) -> Tuple[object, str]:
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise GC3Error(f"{what}: expected a CuPy array, got {type(x).__name__}")
    if x.ndim != 2 or not x.flags.c_contiguous:
        raise GC3Error(f"{what}: expected a 2-D C-contiguous matrix, got shape {x.shape} "
                       f"({'contiguous' if x.flags.c_contiguous else 'strided'})")
    if x.dtype.name not in TYPES:
        raise GC3Error(f"{what}: dtype {x.dtype.name} not supported (float32, float16, or uint16 holding bfloat16)")
    if x.device.id != cupy.cuda.runtime.getDevice():
        raise GC3Error(f"{what}: on device {x.device.id}, but the current device is {cupy.cuda.runtime.getDevice()}")
    return x, x.dtype.name


def _user_streams(group: _Group, stream, op: str) -> Dict[int, object]:
    if isinstance(stream, (list, tuple)):
        if len(stream) != len(group.local):
            raise GC3Error(f"{op}: {len(stream)} streams given for {len(group.local)} ranks")
        return {r: streams.wrap(streams.handle(s)) for r, s in zip(group.local, stream)}
    s = streams.wrap(streams.handle(stream))
    return {r: s for r in group.local}


def _output(out, shape, dtype: str, what: str, user):
    import cupy

    if out is None:
        with streams.current(user):
            return cupy.empty(shape, dtype=dtype)
    _matrix(out, what)
    if tuple(out.shape) != tuple(shape) or out.dtype.name != dtype:
        raise GC3Error(f"{what}: expected shape {tuple(shape)} {dtype}, got {tuple(out.shape)} {out.dtype.name}")
    return out


def _result(group: _Group, values: list):
    return values if isinstance(group, VirtualGemmGroup) else values[0]


# --- one rank's part of one call ---------------------------------------------
class _Rank:
    def __init__(self, op: str, group: _Group, st: ShapeState, r: int, user):
        self.op, self.g, self.st, self.r, self.user = op, group, st, r, user
        self.lr: _LocalRank = group.ranks[r]
        self.comp, self.xfers = self.lr.compute, self.lr.transfers(group.n)
        self.e, self.p = st.epoch, st.epoch & 1
        self.w = group.watchdog

    def xfer(self, d: int):
        """The transfer stream to rank d."""
        return self.xfers[d]

    def begin(self) -> None:
        # The compute stream also waits for the previous call's transfers,
        # which read this rank's send buffer the GEMMs are about to refill.
        for x in self.xfers:
            self.lr.order(x.ptr, self.comp.ptr, "previous transfers")
        ev = self.lr.event("inputs")
        rt = _rt()
        rt.eventRecord(ev, self.user.ptr)
        for s in [self.comp] + self.xfers:
            rt.streamWaitEvent(s.ptr, ev, 0)

    def end(self) -> None:
        self.lr.order(self.comp.ptr, self.user.ptr, "compute done")
        for x in self.xfers:
            self.lr.order(x.ptr, self.user.ptr, "transfers done")
        ev = self.lr.event("call done")
        _rt().eventRecord(ev, self.user.ptr)
        self.g.last_events.append(ev)

    def buf(self, name: str, rank: int) -> int:
        return self.st.buf(name, rank, self.p)

    def stamp(self, stream, what: str, chunk: str, peer: Optional[int] = None) -> None:
        if self.g.trace is not None:
            self.g.trace.stamp(stream.ptr, self.r, what, chunk, self.r if peer is None else peer)

    def gemm(self, stream, a: int, b: int, c: int, m: int, k: int, n: int, in_type: int, out_type: int,
             chunk: str) -> None:
        gemm_rows(self.lr.cublas, stream, a, b, c, m, k, n, in_type, out_type)
        self.stamp(stream, "gemm end", chunk)

    def hand_over(self, dests) -> None:
        """What the compute stream has queued so far comes before the next transfers to `dests`."""
        ev = self.lr.event("chunk")
        rt = _rt()
        rt.eventRecord(ev, self.comp.ptr)
        for d in dests:
            rt.streamWaitEvent(self.xfer(d).ptr, ev, 0)

    def push(self, stream, lane: int, d: int, src: int, dst: int, nbytes: int, chunk: str) -> None:
        """Copy `nbytes` into rank d's buffer once d has consumed what the same
        buffer copy held two calls ago, then raise d's arrival flag for us."""
        if self.e > 2:
            self.w.wait(stream.ptr, self.st.flag(self.r, lane, DONE, d), self.e - 2,
                        f"{self.op} call {self.e}: rank {self.r} waits for rank {d} to consume {chunk} of call "
                        f"{self.e - 2} (flag 'consumed', lane {lane})")
        self.stamp(stream, "transfer start", chunk, d)
        if nbytes:
            _rt().memcpyAsync(dst, src, nbytes, _MEMCPY_DEFAULT, stream.ptr)
        self.stamp(stream, "transfer end", chunk, d)
        self.w.release(stream.ptr, self.st.flag(d, lane, ARRIVE, self.r), self.e)

    def arrived_self(self, stream, lane: int) -> None:
        self.w.release(stream.ptr, self.st.flag(self.r, lane, ARRIVE, self.r), self.e)

    def wait_arrival(self, stream, lane: int, s: int, chunk: str) -> None:
        self.w.wait(stream.ptr, self.st.flag(self.r, lane, ARRIVE, s), self.e,
                    f"{self.op} call {self.e}: rank {self.r} waits for {chunk} from rank {s} (flag 'arrived', "
                    f"lane {lane})")

    def consumed(self, stream, lane: int, sources) -> None:
        for s in sources:
            self.w.release(stream.ptr, self.st.flag(s, lane, DONE, self.r), self.e)


def gemm_rows(handle: int, stream, a: int, b: int, c: int, m: int, k: int, n: int, in_type: int,
              out_type: int) -> None:
    """Queue on `stream`: row-major C[m, n] = A[m, k] @ B[k, n], all three
    contiguous (cuBLAS is column-major: it computes C^T = B^T A^T)."""
    if m == 0 or n == 0:
        return
    import cupy

    if k == 0:   # cuBLAS refuses a leading dimension of 0; the product is all zeros
        cupy.cuda.runtime.memsetAsync(c, 0, m * n * (4 if out_type == _R_32F else 2), stream.ptr)
        return
    if _ONE is None:
        _host_scalars()
    with streams.current(stream):   # gemmEx runs on CuPy's current stream
        cupy.cuda.cublas.gemmEx(handle, 0, 0, n, m, k, _ONE.ctypes.data, b, in_type, n, a, in_type, k,
                                _ZERO.ctypes.data, c, out_type, n, _COMPUTE_32F, _GEMM_DEFAULT)


def _rt():
    import cupy

    return cupy.cuda.runtime


def _sum_round(stream, parts: int, stride: int, nparts: int, count: int, out: int, kind: int,
               in_kind: int = 0) -> None:
    """out[i] = round(sum_p parts[p * stride + i]) in rank order, fp32 sum, one rounding; the
    parts are fp32 (in_kind 0) or of the output kind's 16-bit type (`stride` in elements)."""
    import numpy as np

    if count == 0:
        return
    fn = gemm_signal.kernel("gc3_sum_round")
    blocks = int(min((count + 255) // 256, 4096))
    fn((blocks,), (256,), (np.uint64(parts), np.uint64(stride), np.int32(nparts), np.uint64(count), np.uint64(out),
                           np.int32(kind), np.int32(in_kind)), stream=stream)


# alpha = 1, beta = 0 in host memory (cuBLAS's default pointer mode), kept for the process.
_ONE, _ZERO = None, None


def _host_scalars() -> None:
    global _ONE, _ZERO
    import numpy as np

    _ONE, _ZERO = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)


def _prepare(group: _Group, op: str):
    if not isinstance(group, _Group):
        raise GC3Error(f"{op}: comm must be a runtime_cuda.fused VirtualGemmGroup or IpcGemmGroup, "
                       f"got {type(group).__name__}")
    group.check()
    if group.trace is not None:
        # The previous call's stamps are all in by its end events; waiting for
        # those, not the whole device, leaves work the caller queued since
        # (a delay before this call, say) running.
        group.watchdog.synchronize(group.last_events)
        group.trace.clear()
    group.last_events = []


def _run(phases: Dict[int, List[Callable[[], None]]]) -> None:
    """Issue phase i of every local rank before phase i+1 of any: a wait is
    then always queued after the work that releases it, which is what keeps
    one process's ranks from deadlocking under CUDA_DEVICE_MAX_CONNECTIONS=1."""
    for i in range(max(len(p) for p in phases.values())):
        for steps in phases.values():
            if i < len(steps):
                steps[i]()


def _decided(op: str, n: int, shape: str, fused: bool, why: str, return_a: bool = False) -> None:
    """Log the choice; a fused run first checks its chunk schedule against the compiled program
    (all_gather_gemm with return_a: the variant whose IR returns the gathered A too)."""
    get_logger().info("%s %s: %s (%s)", op, shape, "fused" if fused else "sequential", why)
    if fused:
        schedule.require(op, n, return_a)


def _operands(op: str, a, b, comm: _Group, stream):
    """Each local rank's A and B (checked to multiply), the call's streams, and the (M, N, dtype)
    every rank must share."""
    _prepare(comm, op)
    A, B = _per_rank(comm, a, "a", op), _per_rank(comm, b, "b", op)
    users = _user_streams(comm, stream, op)
    dims = []
    for i, r in enumerate(comm.local):
        x, t = _matrix(A[i], f"{op}: rank {r}'s A")
        y, u = _matrix(B[i], f"{op}: rank {r}'s B")
        if t != u or x.shape[1] != y.shape[0]:
            raise GC3Error(f"{op}: rank {r}: A {x.shape} {t} @ B {y.shape} {u} do not match")
        dims.append((x.shape[0], y.shape[1], t))
    if len(set(dims)) != 1:
        raise GC3Error(f"{op}: the ranks' (M, N, dtype) differ: {dims}")
    return A, B, users, dims[0]


# --- GEMM + reduce-scatter / all-reduce ------------------------------------------
def _gemm_sum(op: str, a, b, comm: _Group, out, stream, fused, everyone: bool):
    A, B, users, (M, N, t) = _operands(op, a, b, comm, stream)
    n = comm.n
    if not everyone and M % n:
        raise GC3Error(f"{op}: M={M} rows cannot be scattered evenly over {n} ranks (M must be a multiple of n)")
    name, ctype, kind = TYPES[t]
    isz = 4 if t == "float32" else 2
    # The partial products cross the links in fp32, or in the input's type (half the bytes).
    in_kind = kind if settings.get("GC3_FUSED_PARTIALS") == "input" else 0
    ptype, psz = (ctype, isz) if in_kind else (_R_32F, 4)
    bounds = row_bounds(M, n)
    slot = max(bounds[d + 1] - bounds[d] for d in range(n)) * N * psz
    sizes = {"send": M * N * psz, "recv": n * slot}
    if everyone:
        sizes["gather"] = M * N * isz
    st = comm.shape((op, M, N, t, psz), sizes)
    st.epoch += 1
    fuse, why = fuse_decision(op, M // n, fused)
    _decided(op, n, f"M={M} N={N} {name} n={n}", fuse, why)
    outs = [_output(None if out is None else _per_rank(comm, out, "out", op)[i],
                    (M, N) if everyone else (bounds[r + 1] - bounds[r], N), t, f"{op}: rank {r}'s out", users[r])
            for i, r in enumerate(comm.local)]
    phases = {}
    for i, r in enumerate(comm.local):
        rk = _Rank(op, comm, st, r, users[r])
        a_ptr, b_ptr, K = A[i].data.ptr, B[i].data.ptr, A[i].shape[1]

        def recv_slot(d, rk=rk):   # where rank rk.r's partial for rank d lands
            return rk.buf("recv", d) + rk.r * slot

        def produce(rk=rk, a_ptr=a_ptr, b_ptr=b_ptr, K=K, recv_slot=recv_slot):
            rk.begin()
            r, send = rk.r, rk.buf("send", rk.r)
            if fuse:
                for d, to in chunk_schedule(op, r, n):
                    rows = bounds[d + 1] - bounds[d]
                    a_rows = a_ptr + bounds[d] * K * isz
                    if to is None:   # its own chunk: straight into its receive slot
                        rk.gemm(rk.comp, a_rows, b_ptr, recv_slot(r), rows, K, N, ctype, ptype, f"partial chunk {d}")
                        rk.arrived_self(rk.comp, 0)
                        continue
                    mine = send + bounds[d] * N * psz
                    rk.gemm(rk.comp, a_rows, b_ptr, mine, rows, K, N, ctype, ptype, f"partial chunk {d}")
                    rk.hand_over([to])
                    rk.push(rk.xfer(to), 0, to, mine, recv_slot(to), rows * N * psz, f"partial chunk {d}")
            else:
                rk.gemm(rk.comp, a_ptr, b_ptr, send, M, K, N, ctype, ptype, "all partial chunks")
                dests = peers_first(r, n)
                rk.hand_over(dests)
                for d in dests:
                    rk.push(rk.xfer(d), 0, d, send + bounds[d] * N * psz, recv_slot(d),
                            (bounds[d + 1] - bounds[d]) * N * psz, f"partial chunk {d}")

        def reduce(rk=rk, o=outs[i]):
            r = rk.r
            for s in range(n):
                rk.wait_arrival(rk.user, 0, s, f"partial chunk {r}")
            rows = bounds[r + 1] - bounds[r]
            dst = rk.buf("gather", r) + bounds[r] * N * isz if everyone else o.data.ptr
            _sum_round(rk.user, rk.buf("recv", r), slot // psz, n, rows * N, dst, kind, in_kind)
            rk.consumed(rk.user, 0, range(n))
            if not everyone:
                rk.end()
                return
            for d in peers_first(r, n)[:-1]:
                rk.push(rk.user, 1, d, dst, rk.buf("gather", d) + bounds[r] * N * isz, rows * N * isz,
                        f"reduced block {r}")

        def gather(rk=rk, o=outs[i]):
            r = rk.r
            peers = peers_first(r, n)[:-1]
            for s in peers:
                rk.wait_arrival(rk.user, 1, s, f"reduced block {s}")
            _rt().memcpyAsync(o.data.ptr, rk.buf("gather", r), M * N * isz, _MEMCPY_DEFAULT, rk.user.ptr)
            rk.consumed(rk.user, 1, peers)
            rk.end()

        phases[r] = [produce, reduce] + ([gather] if everyone else [])
    _run(phases)
    return _result(comm, outs)


def gemm_reduce_scatter(a, b, comm: _Group, *, out=None, stream=None, fused: Optional[bool] = None):
    """Rank r gets rows [r*M/n, (r+1)*M/n) of sum_s A_s @ B_s (fp32 sum, one rounding).
    M must be a multiple of n."""
    return _gemm_sum("gemm_reduce_scatter", a, b, comm, out, stream, fused, everyone=False)


def gemm_all_reduce(a, b, comm: _Group, *, out=None, stream=None, fused: Optional[bool] = None):
    """Every rank gets sum_s A_s @ B_s [M, N]: reduce-scattered by row blocks
    (fp32 sum, one rounding by the block's owner), then all-gathered.  Any M."""
    return _gemm_sum("gemm_all_reduce", a, b, comm, out, stream, fused, everyone=True)


# --- all-gather + GEMM ---------------------------------------------------------
def all_gather_gemm(a, b, comm: _Group, return_a: bool = False, *, out=None, stream=None,
                    fused: Optional[bool] = None, out_a=None):
    """concat_s(A_s) @ B_r on rank r (gather along dim 0).  `b` may be one
    matrix or a list of matrices sharing the gathered A (as torch's
    fused_all_gather_matmul); the result is then a list.  With return_a,
    (gathered A, result) is returned, the gathered A in `out_a` where given."""
    op = "all_gather_gemm"
    _prepare(comm, op)
    n = comm.n
    A, Bs = _per_rank(comm, a, "a", op), _per_rank(comm, b, "b", op)
    users = _user_streams(comm, stream, op)
    single = not isinstance(Bs[0], (list, tuple))
    Bs = [[x] if single else list(x) for x in Bs]
    dims = []
    for i, r in enumerate(comm.local):
        x, t = _matrix(A[i], f"{op}: rank {r}'s A")
        if not Bs[i]:
            raise GC3Error(f"{op}: rank {r}: the list of B matrices is empty")
        for j, y in enumerate(Bs[i]):
            _, u = _matrix(y, f"{op}: rank {r}'s B[{j}]")
            if u != t or y.shape[0] != x.shape[1]:
                raise GC3Error(f"{op}: rank {r}: A {x.shape} {t} @ B[{j}] {y.shape} {u} do not match")
        dims.append((x.shape, t, tuple(y.shape[1] for y in Bs[i])))
    if len({d[:2] for d in dims}) != 1 or len({len(d[2]) for d in dims}) != 1:
        raise GC3Error(f"{op}: every rank must hold an A of the same shape and dtype and as many B: {dims}")
    (m, K), t = dims[0][:2]
    name, ctype, _ = TYPES[t]
    isz = 4 if t == "float32" else 2
    st = comm.shape((op, m, K, t), {"gather": n * m * K * isz})
    st.epoch += 1
    fuse, why = fuse_decision(op, m, fused)
    _decided(op, n, f"m={m} K={K} {name} n={n}", fuse, why, bool(return_a))
    outs_given = None if out is None else _per_rank(comm, out, "out", op)
    outs, gathered = [], []
    for i, r in enumerate(comm.local):
        given = None if outs_given is None else ([outs_given[i]] if single else list(outs_given[i]))
        if given is not None and len(given) != len(Bs[i]):
            raise GC3Error(f"{op}: rank {r}: {len(given)} outputs for {len(Bs[i])} B matrices")
        outs.append([_output(None if given is None else given[j], (n * m, y.shape[1]), t,
                             f"{op}: rank {r}'s out[{j}]", users[r]) for j, y in enumerate(Bs[i])])
        given_a = None if out_a is None else _per_rank(comm, out_a, "out_a", op)[i]
        gathered.append(_output(given_a, (n * m, K), t, f"{op}: rank {r}'s out_a", users[r]) if return_a else None)
    phases = {}
    for i, r in enumerate(comm.local):
        rk = _Rank(op, comm, st, r, users[r])
        a_ptr = A[i].data.ptr
        block = m * K * isz

        def push(rk=rk, a_ptr=a_ptr):
            rk.begin()
            targets = peers_first(rk.r, n)
            for d in (targets if not fuse else targets[:-1]):
                rk.push(rk.xfer(d), 0, d, a_ptr, rk.buf("gather", d) + rk.r * block, block, f"A chunk {rk.r}")

        def compute(rk=rk, a_ptr=a_ptr, bs=Bs[i], os_=outs[i], ga=gathered[i]):
            r, g = rk.r, rk.buf("gather", rk.r)
            if fuse:
                for s, sender in chunk_schedule(op, r, n):
                    if sender is None:
                        src = a_ptr
                    else:
                        rk.wait_arrival(rk.comp, 0, sender, f"A chunk {s}")
                        src = g + s * block
                    for y, o in zip(bs, os_):
                        Nj = y.shape[1]
                        rk.gemm(rk.comp, src, y.data.ptr, o.data.ptr + s * m * Nj * isz, m, K, Nj, ctype, ctype,
                                f"A chunk {s}")
            else:
                for s in arrival_order(r, n):
                    rk.wait_arrival(rk.comp, 0, s, f"A chunk {s}")
                for y, o in zip(bs, os_):
                    rk.gemm(rk.comp, g, y.data.ptr, o.data.ptr, n * m, K, y.shape[1], ctype, ctype, "all A chunks")
            if ga is not None:
                rt = _rt()
                rt.memcpyAsync(ga.data.ptr, g, n * block, _MEMCPY_DEFAULT, rk.comp.ptr)
                if fuse:   # its own chunk never went through the gather buffer
                    rt.memcpyAsync(ga.data.ptr + r * block, a_ptr, block, _MEMCPY_DEFAULT, rk.comp.ptr)
            # Its own slot too, though the fused path leaves it unused: the
            # sequential path, on this shape two calls later, waits for it.
            rk.consumed(rk.comp, 0, range(n))
            rk.end()

        phases[r] = [push, compute]
    _run(phases)
    res = [o[0] if single else o for o in outs]
    if return_a:
        return _result(comm, gathered), _result(comm, res)
    return _result(comm, res)


# --- GEMM + all-to-all -----------------------------------------------------------
def gemm_all_to_all(a, b, splits, comm: _Group, *, out=None, stream=None, fused: Optional[bool] = None,
                    same_splits: bool = False):
    """C_r = A_r @ B_r; rows [off_d, off_d + splits_r[d]) of C_r go to rank d,
    which gets concat over sources s (in rank order) of the blocks s sent it.
    `splits`: this rank's split vector (n ints adding up to M); on a virtual
    group one vector for every rank or a list of n vectors.  An IpcGemmGroup
    learns the peers' vectors by one host allgather per call, unless the caller
    says every rank passes this same vector (`same_splits`)."""
    op = "gemm_all_to_all"
    A, B, users, (M, N, t) = _operands(op, a, b, comm, stream)
    n = comm.n
    if same_splits:
        S = [check_splits(splits, n, M, f"{op}: splits")] * n
    elif isinstance(comm, VirtualGemmGroup):
        nested = len(splits) == n and all(isinstance(s, (list, tuple)) for s in splits)
        S = [check_splits(splits[s] if nested else splits, n, M, f"{op}: rank {s}'s splits") for s in range(n)]
    else:
        S = [check_splits(s, n, M, f"{op}: rank {r}'s splits")
             for r, s in enumerate(comm.exchange(list(map(int, splits))))]
    name, ctype, _ = TYPES[t]
    isz = 4 if t == "float32" else 2
    row = N * isz
    st = comm.shape((op, M, N, t), {"send": M * row, "recv": n * M * row})
    st.epoch += 1
    fuse, why = fuse_decision(op, M // n, fused)
    _decided(op, n, f"M={M} N={N} {name} n={n}", fuse, why)

    def roff(s, d):   # row of rank d's output where source s's block starts
        return sum(S[q][d] for q in range(s))

    outs = [_output(None if out is None else _per_rank(comm, out, "out", op)[i], (roff(n, r), N), t,
                    f"{op}: rank {r}'s out", users[r]) for i, r in enumerate(comm.local)]
    phases = {}
    for i, r in enumerate(comm.local):
        rk = _Rank(op, comm, st, r, users[r])
        a_ptr, b_ptr, K = A[i].data.ptr, B[i].data.ptr, A[i].shape[1]
        soff = [sum(S[r][:d]) for d in range(n + 1)]

        def produce(rk=rk, a_ptr=a_ptr, b_ptr=b_ptr, K=K, soff=soff):
            rk.begin()
            r, send = rk.r, rk.buf("send", rk.r)
            if fuse:
                for d, to in chunk_schedule(op, r, n):
                    rows = S[r][d]
                    a_rows = a_ptr + soff[d] * K * isz
                    if to is None:
                        rk.gemm(rk.comp, a_rows, b_ptr, rk.buf("recv", r) + roff(r, r) * row, rows, K, N, ctype, ctype,
                                f"block {r}->{d}")
                        rk.arrived_self(rk.comp, 0)
                        continue
                    mine = send + soff[d] * row
                    rk.gemm(rk.comp, a_rows, b_ptr, mine, rows, K, N, ctype, ctype, f"block {r}->{d}")
                    rk.hand_over([to])
                    rk.push(rk.xfer(to), 0, to, mine, rk.buf("recv", to) + roff(r, to) * row, rows * row,
                            f"block {r}->{d}")
            else:
                rk.gemm(rk.comp, a_ptr, b_ptr, send, M, K, N, ctype, ctype, "all blocks")
                dests = peers_first(r, n)
                rk.hand_over(dests)
                for d in dests:
                    rk.push(rk.xfer(d), 0, d, send + soff[d] * row, rk.buf("recv", d) + roff(r, d) * row,
                            S[r][d] * row, f"block {r}->{d}")

        def consume(rk=rk, o=outs[i]):
            r = rk.r
            for s in range(n):
                rk.wait_arrival(rk.user, 0, s, f"block {s}->{r}")
            _rt().memcpyAsync(o.data.ptr, rk.buf("recv", r), roff(n, r) * row, _MEMCPY_DEFAULT, rk.user.ptr)
            rk.consumed(rk.user, 0, range(n))
            rk.end()

        phases[r] = [produce, consume]
    _run(phases)
    return _result(comm, outs)
