"""GEMV + AllReduce and embedding-bag + AllToAll on CuPy arrays, fused or sequential.

*Fused*: each is one kernel on every SM.  GEMV + AllReduce (runtime_cuda.fused.gemv_kernel,
kernels/gemv_allreduce.cu) reduces every rank's partial in rank order, the same bits on every
rank; embedding-bag + AllToAll (runtime_cuda.fused.ebag_kernel, kernels/ebag_alltoall.cu)
pools each destination's rows straight into that rank's staging over NVLink.  *Sequential*:
cuBLAS / CuPy computes the whole result, then the communicator's collective moves it.  Both
give the same values up to rounding (fp32 accumulation either way).  The same operators as gc3
programs, whose compute steps the interpreter runs, are in runtime_cuda.fused.programs.

Ranks.  `comm` is a communicator of the drop-in
(`runtime_cuda.nccl.NcclCommunicator`, one rank per process: the fused kernels are set up
over the communicator's own rendezvous, so every rank must make the same calls in the same
order), or `VirtualComm(n)`: n ranks in this process on this GPU, each array argument then a
list of n arrays, rank r's at index r.

Types: bfloat16, float16, float32 values (indices and offsets int32).  CuPy
has no bfloat16, so a uint16 array is read as bfloat16.

Path.  `path=` or GC3_FUSED: "fused" or "sequential" forces one (a fused call
that cannot be served then raises); "auto" (the default) takes the fused path
unless the call is one it cannot serve; each fall-back is logged with its reason at
INFO (GC3_DEBUG=INFO).  (The torch functions, runtime_cuda.torch_dist.ops, decide from
the machine's measured table instead.)

The kernels' groups are cached per communicator.
"""
from __future__ import annotations

import functools
import os
import weakref
from typing import Dict, List, Optional, Tuple

from gc3.errors import GC3Error

from ..core import streams
from ..nccl.log import get_logger
from ..core.tables import COMPUTE_DTYPES

PATHS = ("auto", "fused", "sequential")


class VirtualComm:
    """n ranks in this process on the current GPU: every array argument is a list of n arrays."""

    def __init__(self, nranks: int):
        if int(nranks) < 1:
            raise ValueError(f"VirtualComm needs at least one rank, got {nranks}")
        self.nranks = int(nranks)
        self.groups: Dict[tuple, object] = {}

    def size(self) -> int:
        return self.nranks


# Launch groups of the communicators of the drop-in, per program key (not kept alive by us).
_comm_groups: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_failed: Dict[tuple, str] = {}


# --- arrays -----------------------------------------------------------------------------------
def value_dtype(a, what: str) -> str:
    """The value type of a CuPy array (uint16 is bfloat16); ValueError for any other."""
    name = a.dtype.name
    name = "bfloat16" if name in ("uint16", "bfloat16") else name
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"{what}: dtype {a.dtype.name}; expected one of {', '.join(COMPUTE_DTYPES)} "
                         f"(uint16 arrays are bfloat16)")
    return name


def storage(dtype: str):
    """The CuPy dtype that holds values of `dtype`."""
    import cupy

    return cupy.dtype(cupy.uint16 if dtype == "bfloat16" else dtype)


def to_f32(a, dtype: str):
    """fp32 copy of an array of `dtype` values."""
    import cupy

    if dtype == "bfloat16":
        return (a.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)
    return a.astype(cupy.float32)


@functools.lru_cache(maxsize=1)
def _bf16_round():
    import cupy

    # Round to nearest even, quiet NaN: what the kernel's from_acc does.
    return cupy.ElementwiseKernel(
        "float32 f", "uint16 h",
        "unsigned int u = __float_as_uint(f);"
        "h = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40)"
        " : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
        "gc3_f32_to_bf16")


def from_f32(f, dtype: str, out=None):
    """`f` (fp32) rounded to `dtype`, into `out` when given."""
    if dtype == "bfloat16":
        return _bf16_round()(f, out) if out is not None else _bf16_round()(f)
    if out is None:
        return f.astype(dtype)
    out[...] = f
    return out


def matmul(x, w, dtype: str):
    """x @ w with fp32 accumulation, in `dtype`: cuBLAS through CuPy; bfloat16 (which CuPy lacks)
    through torch's cuBLAS on the current CuPy stream where torch is present, else widened to fp32."""
    import cupy

    if dtype != "bfloat16":
        return cupy.matmul(x, w)
    try:
        import torch

        device = torch.device("cuda", x.device.id)    # CuPy's device for x, which torch's current one may not be
        before = torch.cuda.current_stream(device)
        torch.cuda.set_stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr, device=device))
        try:
            y = torch.matmul(_torch_bf16(torch, x), _torch_bf16(torch, w))
        finally:
            torch.cuda.set_stream(before)
        return cupy.from_dlpack(y.view(torch.int16)).view(cupy.uint16)
    except ImportError:
        return from_f32(cupy.matmul(to_f32(x, dtype), to_f32(w, dtype)), dtype)


def _torch_bf16(torch, a):
    return torch.from_dlpack(a.view("int16")).view(torch.bfloat16)


def pool(tables, indices, offsets, dtype: str, mode: str = "sum"):
    """CuPy gather + sum (or mean): pooled [B, T*dim] in `dtype` of one rank's tables."""
    import cupy
    import cupyx

    t_count, _, dim = tables.shape
    batch = offsets.shape[1] - 1
    acc = cupy.zeros((t_count, batch, dim), cupy.float32)
    pos = cupy.arange(indices.shape[1], dtype=cupy.int32)
    for t in range(t_count):
        bag = cupy.searchsorted(offsets[t, 1:], pos, side="right")   # the bag of each index position
        used = (pos >= offsets[t, 0]) & (pos < offsets[t, -1])
        rows = to_f32(tables[t].take(indices[t][used], axis=0), dtype)
        cupyx.scatter_add(acc[t], bag[used], rows)
    if mode == "mean":
        counts = cupy.diff(offsets, axis=1).astype(cupy.float32)
        acc /= cupy.maximum(counts, 1)[:, :, None]
    return from_f32(acc.transpose(1, 0, 2).reshape(batch, t_count * dim), dtype)


# --- the call's ranks -------------------------------------------------------------------------
def _ranks(comm, arrays: Dict[str, object]) -> Tuple[int, Dict[str, list], Optional[int]]:
    """(number of ranks, per argument the list of arrays this process holds, this process's rank or
    None for virtual ranks)."""
    if isinstance(comm, VirtualComm):
        out = {}
        for name, a in arrays.items():
            if a is None:
                out[name] = [None] * comm.nranks
                continue
            if not isinstance(a, (list, tuple)) or len(a) != comm.nranks:
                raise ValueError(f"{name}: with VirtualComm({comm.nranks}) give a list of {comm.nranks} arrays, "
                                 f"one per rank")
            out[name] = list(a)
        return comm.nranks, out, None
    if not hasattr(comm, "rank_id"):
        raise TypeError(f"comm must be a runtime_cuda.nccl communicator or a VirtualComm, not {type(comm).__name__}")
    return comm.size(), {name: [a] for name, a in arrays.items()}, comm.rank_id()


def _where(rank: Optional[int], k: int) -> str:
    return f"rank {k if rank is None else rank}"


def _check_array(a, what: str, ndim: int, dtype=None) -> None:
    if not hasattr(a, "__cuda_array_interface__") or a.ndim != ndim or not a.flags.c_contiguous:
        raise ValueError(f"{what}: expected a C-contiguous {ndim}-D CuPy array, got "
                         f"{type(a).__name__} {getattr(a, 'shape', '')}")
    if dtype is not None and a.dtype.name != dtype:
        raise ValueError(f"{what}: dtype {a.dtype.name}, expected {dtype}")


def _path(path: Optional[str]) -> str:
    path = path or os.environ.get("GC3_FUSED", "auto") or "auto"
    if path not in PATHS:
        raise ValueError(f"path (or GC3_FUSED) must be one of {', '.join(PATHS)}, got {path!r}")
    return path


def exchange_of(comm):
    """The rendezvous a drop-in communicator's gc3 runtime sets launch groups up over, or raise."""
    exchange = getattr(getattr(comm, "_backend", None), "exchange", None)
    if exchange is None:
        raise GC3Error("the communicator has no gc3 runtime behind it (NCCL only)")
    return exchange


def settle(path: str, why: str, what: str) -> None:
    """A fused path that cannot serve a call (`why`): raise where the caller forced it, else
    log the sequential path taken instead."""
    if why and path == "fused":
        raise GC3Error(f"{what}: the fused path cannot serve this call: {why}")
    if why:
        get_logger().info("%s: sequential path: %s", what, why)


def check(comm) -> None:
    """Synchronize and raise gc3.errors.RuntimeTimeoutError if a fused kernel of `comm` gave up
    waiting (the communicator's own check_async_error covers its collectives, not these)."""
    groups = comm.groups if isinstance(comm, VirtualComm) else _comm_groups.get(comm, {})
    for group in groups.values():
        group.check()


# --- GEMV + AllReduce -------------------------------------------------------------------------
def gemv_allreduce(x, w, comm, out=None, stream=None, *, path: Optional[str] = None):
    """y = sum over ranks of x_r @ w_r on every rank (a row-parallel linear layer at decode).

    x [batch, K_shard] and w [K_shard, N] (this rank's shard), both of one value type; returns
    out [batch, N] of that type.  With a VirtualComm, x, w (and out) are lists, one per rank, and
    so is the result."""
    import cupy

    n, a, rank = _ranks(comm, {"x": x, "w": w, "out": out})
    path = _path(path)
    first = None
    for k in range(len(a["x"])):
        at = _where(rank, k)
        _check_array(a["x"][k], f"gemv_allreduce: {at}: x", 2)
        _check_array(a["w"][k], f"gemv_allreduce: {at}: w", 2)
        shape = (a["x"][k].shape, a["w"][k].shape, a["x"][k].dtype.name, a["w"][k].dtype.name)
        if shape[0][1] != shape[1][0] or shape[2] != shape[3]:
            raise ValueError(f"gemv_allreduce: {at}: x {shape[0]} {shape[2]} and w {shape[1]} {shape[3]} do not "
                             f"multiply (x [batch, K], w [K, N], one dtype)")
        if first is not None and shape != first:
            raise ValueError(f"gemv_allreduce: {at}: shapes {shape} differ from rank 0's {first}")
        first = shape
    dtype = value_dtype(a["x"][0], "gemv_allreduce: x")
    (batch, k_shard), (_, n_out) = first[0], first[1]
    with streams.current(streams.wrap(streams.handle(stream))):
        for k in range(len(a["out"])):
            if a["out"][k] is None:
                a["out"][k] = cupy.empty((batch, n_out), dtype=storage(dtype))
            _check_array(a["out"][k], f"gemv_allreduce: {_where(rank, k)}: out", 2, storage(dtype).name)
            if a["out"][k].shape != (batch, n_out):
                raise ValueError(f"gemv_allreduce: {_where(rank, k)}: out is {a['out'][k].shape}, "
                                 f"expected {(batch, n_out)}")
        group = _kernel_group(path, f"gemv_allreduce {batch}x{k_shard}x{n_out} {dtype} on {n} ranks",
                              lambda: gemv_kernel(comm, n, batch, k_shard, n_out, dtype, len(a["x"]),
                                                  lambda: streams.is_capturing(streams.handle(stream))))
        if group is None:
            _gemv_sequential(comm, a, dtype, stream)
        else:
            group.run_ptrs([v.data.ptr for v in a["x"]], [v.data.ptr for v in a["w"]],
                           [v.data.ptr for v in a["out"]], batch, k_shard, n_out, dtype, streams.handle(stream))
    return a["out"] if isinstance(comm, VirtualComm) else a["out"][0]


# Why a call being captured into a CUDA graph does not build a kernel's group: the set-up
# allocates, maps peers and synchronizes, which no capture may hold.
IN_CAPTURE = "a first call inside CUDA graph capture (the kernel's buffers are set up by a call outside capture)"


def not_capturing() -> bool:
    return False


def group_of(comm, key, make, capturing=not_capturing):
    """(the group `comm` keeps under `key`, '') or (None, why there is none).  Built by make() on
    first use, collectively: every rank makes the same call, so a failure, which every rank
    learns of, is kept and given again; not built where capturing() says the call is being
    captured (IN_CAPTURE), a question asked only where there is no group yet."""
    fail = (key, id(comm))
    if fail in _failed:
        return None, _failed[fail]
    groups = comm.groups if isinstance(comm, VirtualComm) else _comm_groups.setdefault(comm, {})
    group = groups.get(key)
    if group is None:
        if capturing():
            return None, IN_CAPTURE
        try:
            group = groups[key] = make()
        except GC3Error as exc:   # set-up agrees across ranks: every rank gets here together
            return None, _failed.setdefault(fail, f"kernel set-up failed: {exc}")
    return group, ""


def gemv_kernel(comm, n: int, batch: int, k: int, n_out: int, dtype: str, ranks_here: int = 1,
                capturing=not_capturing):
    """(the GEMV + AllReduce kernel's group of `comm`, '') or (None, why it cannot serve the
    shape).  One group per communicator (runtime_cuda.fused.gemv_kernel), for the CuPy API and
    the torch function alike (group_of)."""
    from .gemv_kernel import GemvAllreduce, refusal

    why = refusal(dtype, batch, k, n_out, n, ranks_here)
    if why:
        return None, why
    return group_of(comm, "gemv_kernel", lambda: GemvAllreduce.virtual(n) if isinstance(comm, VirtualComm) else
                    GemvAllreduce.ipc(exchange_of(comm), device=comm.device_id()), capturing)


def _kernel_group(path: str, what: str, find):
    """The fused kernel's group that find() gives as (group, '') or (None, why not), or None for
    the sequential path (raised where `path` forced the fused one)."""
    if path == "sequential":
        get_logger().info("%s: sequential path: path=sequential", what)
        return None
    group, why = find()
    settle(path, why, what)
    return group


def _gemv_sequential(comm, a, dtype: str, stream) -> None:
    partial = [matmul(x, w, dtype) for x, w in zip(a["x"], a["w"])]
    _allreduce(comm, partial, a["out"], dtype, stream)


def _allreduce(comm, parts: List, outs: List, dtype: str, stream) -> None:
    """The communicator's AllReduce (sum) of parts into outs; virtual ranks: one fp32 sum on this GPU."""
    if isinstance(comm, VirtualComm):
        total = functools.reduce(lambda s, p: s + to_f32(p, dtype), parts[1:], to_f32(parts[0], dtype))
        for o in outs:
            from_f32(total, dtype, o)
        return
    from ..nccl.constants import DTYPE_CODES, NCCL_SUM

    comm.allReduce(parts[0].data.ptr, outs[0].data.ptr, parts[0].size, DTYPE_CODES[dtype], NCCL_SUM,
                   streams.handle(stream))


# --- embedding-bag + AllToAll -----------------------------------------------------------------
def embedding_bag_alltoall(tables, indices, offsets, comm, mode: str = "sum", out=None, stream=None, *,
                           path: Optional[str] = None, check_inputs: bool = True, pooling: Optional[int] = None):
    """Pooled embedding bags of this rank's tables for the global batch, each rank receiving its
    samples' rows from every rank (DLRM table-wise sharding, TorchRec's PooledEmbeddingsAllToAll).

    tables [T, rows, dim] (values), indices [T, nnz] and offsets [T, B+1] (int32, CSR bags: bag s
    of table t is indices[t, offsets[t, s]:offsets[t, s+1]]), B = ranks * b.  Returns out
    [ranks, b, T*dim]: out[r] holds rank r's pooled vectors of this rank's b samples; TorchRec's
    [b, ranks*T*dim] is
    out.transpose(1, 0, 2).reshape(b, -1).  mode "sum" or "mean" (mean: sequential path).
    check_inputs: verify indices and offsets first and raise ValueError naming the first bad one
    (synchronizes the stream).  Unchecked, the fused kernel checks them as it pools: a bad one
    pools as nothing and the group's next call (or `check`) raises it.
    Ranks may hold different numbers of indices (nnz).  `pooling`, where given, is checked as a
    bound of nnz / B.
    """
    import cupy

    if mode not in ("sum", "mean"):
        raise ValueError(f"embedding_bag_alltoall: mode must be 'sum' or 'mean', got {mode!r}")
    n, a, rank = _ranks(comm, {"tables": tables, "indices": indices, "offsets": offsets, "out": out})
    path = _path(path)
    first = None
    for k in range(len(a["tables"])):
        at = f"embedding_bag_alltoall: {_where(rank, k)}"
        _check_array(a["tables"][k], f"{at}: tables", 3)
        _check_array(a["indices"][k], f"{at}: indices", 2, "int32")
        _check_array(a["offsets"][k], f"{at}: offsets", 2, "int32")
        t_count, rows, dim = a["tables"][k].shape
        shape = (a["tables"][k].shape, a["indices"][k].shape, a["offsets"][k].shape, a["tables"][k].dtype.name)
        if a["indices"][k].shape[0] != t_count or a["offsets"][k].shape[0] != t_count:
            raise ValueError(f"{at}: tables {shape[0]}, indices {shape[1]} and offsets {shape[2]} must have T rows")
        if (a["offsets"][k].shape[1] - 1) % n or a["offsets"][k].shape[1] < 2:
            raise ValueError(f"{at}: offsets {shape[2]} hold B+1 bag bounds per table; B must be a positive "
                             f"multiple of the {n} ranks")
        same = (shape[0], shape[2], shape[3])    # nnz (indices' width) may differ between ranks
        if first is not None and same != (first[0], first[2], first[3]):
            raise ValueError(f"{at}: shapes {shape} differ from rank 0's {first}")
        first = shape
    dtype = value_dtype(a["tables"][0], "embedding_bag_alltoall: tables")
    (t_count, rows, dim), (_, bounds) = first[0], first[2]
    batch = bounds - 1
    nnz = max(i.shape[1] for i in a["indices"])
    if pooling is not None and (pooling < 1 or nnz > batch * pooling):
        raise ValueError(f"embedding_bag_alltoall: pooling={pooling} bounds nnz by {batch * pooling} but a rank "
                         f"here has {nnz} indices per table")
    b = batch // n
    with streams.current(streams.wrap(streams.handle(stream))):
        if check_inputs:    # on the call's stream: the caller may still be writing them there
            for k in range(len(a["indices"])):
                _check_bags(a["indices"][k], a["offsets"][k], rows, f"embedding_bag_alltoall: {_where(rank, k)}")
        for k in range(len(a["out"])):
            if a["out"][k] is None:
                a["out"][k] = cupy.empty((n, b, t_count * dim), dtype=storage(dtype))
            _check_array(a["out"][k], f"embedding_bag_alltoall: {_where(rank, k)}: out", 3, storage(dtype).name)
            if a["out"][k].shape != (n, b, t_count * dim):
                raise ValueError(f"embedding_bag_alltoall: {_where(rank, k)}: out is {a['out'][k].shape}, "
                                 f"expected {(n, b, t_count * dim)}")
        what = (f"embedding_bag_alltoall T={t_count} rows={rows} dim={dim} B={batch} nnz={nnz} {dtype} "
                f"on {n} ranks")
        group = _kernel_group(path, what, lambda: (None, "mode 'mean' (the kernel pools by sum)") if mode != "sum"
                              else ebag_kernel(comm, n, t_count, rows, dim, b, nnz, dtype, len(a["tables"]),
                                               lambda: streams.is_capturing(streams.handle(stream))))
        if group is None:
            _ebag_sequential(comm, a, dtype, mode, n, b, stream)
        else:
            group.run_ptrs([v.data.ptr for v in a["tables"]], [v.data.ptr for v in a["indices"]],
                           [v.data.ptr for v in a["offsets"]], [v.data.ptr for v in a["out"]],
                           [v.shape[1] for v in a["indices"]], t_count, rows, dim, b, dtype, streams.handle(stream))
    return a["out"] if isinstance(comm, VirtualComm) else a["out"][0]


def ebag_kernel(comm, n: int, t_count: int, rows: int, dim: int, b: int, nnz: int, dtype: str, ranks_here: int = 1,
                capturing=not_capturing):
    """(the embedding-bag + AllToAll kernel's group of `comm` for this shape, '') or (None, why it
    cannot serve it).  Groups per communicator by slot size (runtime_cuda.fused.ebag_kernel), for
    the CuPy API and the torch function alike (group_of)."""
    from gc3.dtypes import dtype_info

    from .ebag_kernel import EbagAlltoall, group_slot, refusal, slot_bytes

    why = refusal(dtype, n, t_count, rows, dim, b, nnz, ranks_here)
    if why:
        return None, why
    slot = group_slot(slot_bytes(t_count, dim, b, dtype_info(dtype).np.itemsize))
    return group_of(comm, ("ebag_kernel", slot), lambda: EbagAlltoall.virtual(n, slot)
                    if isinstance(comm, VirtualComm) else EbagAlltoall.ipc(exchange_of(comm), slot,
                                                                           device=comm.device_id()), capturing)


def _check_bags(indices, offsets, rows: int, at: str) -> None:
    """ValueError naming the first bad index or bag bound (synchronizes with the device)."""
    bad = (indices < 0) | (indices >= rows)
    if bool(bad.any()):
        t, j = divmod(int(bad.argmax()), indices.shape[1])
        raise ValueError(f"{at}: indices[{t}, {j}] = {int(indices[t, j])} is outside the table's {rows} rows")
    bad = (offsets[:, 0] != 0) | (offsets[:, 1:] < offsets[:, :-1]).any(axis=1) | (offsets[:, -1] > indices.shape[1])
    if bool(bad.any()):
        raise ValueError(f"{at}: offsets[{int(bad.argmax())}] are not CSR bounds (start at 0, never decrease, end "
                         f"at most at nnz={indices.shape[1]})")


def _ebag_sequential(comm, a, dtype: str, mode: str, n: int, b: int, stream) -> None:
    pooled = [pool(t, i, o, dtype, mode) for t, i, o in zip(a["tables"], a["indices"], a["offsets"])]
    if isinstance(comm, VirtualComm):
        for p, out in enumerate(a["out"]):
            for r in range(n):
                out[r] = pooled[r][p * b:(p + 1) * b]
        return
    from ..nccl.constants import DTYPE_CODES

    comm.allToAll(pooled[0].data.ptr, a["out"][0].data.ptr, pooled[0].size // n, DTYPE_CODES[dtype],
                  streams.handle(stream))


__all__ = ["VirtualComm", "check", "gemv_allreduce", "embedding_bag_alltoall", "matmul", "pool", "to_f32", "from_f32",
           "value_dtype", "storage"]
