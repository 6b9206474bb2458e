"""Torch functions with the call shapes of PyTorch's fused operators
(torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter), plus
GEMM + all_reduce, GEMM + all_to_all, GEMV + all_reduce, embedding-bag +
all_to_all and all_reduce + epilogue (scale, bias, residual, cast), taking a
process group or its name:

    fused_all_gather_matmul, fused_matmul_reduce_scatter, fused_matmul_all_reduce,
    fused_matmul_all_to_all, fused_gemv_all_reduce, fused_embedding_bag_all_to_all,
    fused_all_reduce_epilogue

On a gc3 group (Gc3ProcessGroup: backend "gc3", or "nccl" under GC3_TORCH=1)
every operator takes the path measured faster on this machine for the shape
(runtime_cuda.fused.choice: `gc3 tune --fused` writes the table into the
machine's catalog).  Fused, GEMM + reduce_scatter, + all_reduce, + all_to_all and
all-gather + GEMM run tile_store.py's Triton GEMM, which stores each output tile
into the rank that needs it, or pushes A's rows into the ranks that multiply
them (capturable in a CUDA graph), where it serves the call; the calls it
refuses run overlap.py's stream pipeline (GEMM chunks on
torch's current stream, each chunk's collective on a high-priority side stream,
capturable), also under GC3_FUSED_EXCHANGE=collective, or under
GC3_FUSED_EXCHANGE=copy-engine copy_engine.py's (copy-engine copies into
the peers' buffers, no SM taken from the GEMM; eager calls); GEMV + all_reduce,
embedding-bag + all_to_all run runtime_cuda.fused's gc3 programs on DLPack views
(not capturable); the epilogue runs the small allreduce kernels' epilogue build on the
tensors' addresses (capturable up to gc3.limits.SMALL_ALLREDUCE_MAX_BYTES).  Sequential is the torch ops (matmul,
one embedding_bag over the tables viewed as one, elementwise ops) then the
group's collective on the current stream.  Where nothing was measured the call
is sequential, which is what the user would have run.  `path=` ("fused",
"sequential", "auto") or GC3_FUSED=0/1 forces one; `chunks=` sets the GEMM
operators' chunk count.  Another backend, a single rank, or a dtype or layout
the fused path refuses runs the sequential path, which is also the reference a
fused call must equal; GC3_DEBUG=INFO names the path and why.  Every rank of a
correct program passes the same shapes and dtypes, so every rank takes the same
path.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from gc3 import settings
from runtime_cuda.fused import choice

from . import overlap

Group = Union[dist.ProcessGroup, str, None]

_REDUCE = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
# What the fused kernels compute in (runtime_cuda/fused: gemm.TYPES, tables.COMPUTE_DTYPES).
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _group(group: Group) -> dist.ProcessGroup:
    if group is None:
        return dist.group.WORLD
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group
        return _resolve_process_group(group)
    return group


def _dim(t: torch.Tensor, dim: int, what: str) -> int:
    return _dim_of(t.dim(), dim, what)


def _dim_of(ndim: int, dim: int, what: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}: dim {dim} is out of range for a {ndim}-d tensor")
    return dim % ndim


def _reduce_op(reduce_op: str, what: str):
    if reduce_op not in _REDUCE:
        raise ValueError(f"{what}: reduce_op {reduce_op!r} is not one of {sorted(_REDUCE)}")
    return _REDUCE[reduce_op]


_logger = None


def _log():
    global _logger
    if _logger is None:
        from runtime_cuda.nccl.log import get_logger
        _logger = get_logger()
    return _logger


# --- the fused path's gate and glue ----------------------------------------------
def _refusal(pg, tensors: Sequence[torch.Tensor], dtypes=_FUSED_DTYPES, capturable: bool = False) -> str:
    """Why the fused kernels cannot serve this call on `pg` ('' when they can).
    `capturable`: the fused path is a stream pipeline a CUDA graph can hold."""
    from .process_group import Gc3ProcessGroup

    if not isinstance(pg, Gc3ProcessGroup):
        name = pg.name() if hasattr(pg, "name") else type(pg).__name__
        return f"the group's backend is {name}, not gc3"
    if pg.size() < 2:
        return "a single rank"
    if not all(t.is_cuda for t in tensors):
        return "CPU tensors"
    if len({t.dtype for t in tensors}) != 1 or tensors[0].dtype not in dtypes:
        return f"dtypes {sorted({str(t.dtype) for t in tensors})}; the fused kernels take one of " \
               f"{[str(d) for d in dtypes]}"
    if not capturable and _capturing():
        return "CUDA graph capture (the fused kernels set up buffers on the host)"
    return ""




def _mkn(A: torch.Tensor, B: torch.Tensor) -> dict:
    return {"M": A.shape[0], "K": A.shape[1], "N": B.shape[1]}


# Choices a group keeps (cleared when full): the hot path of a repeated shape is one dictionary hit.
_CHOICES_KEPT = 4096


def _capturing() -> bool:
    """Whether torch's current stream is capturing a CUDA graph: never before torch has set up
    CUDA in this process (nor where it has no CUDA), which costs a repeat no device query."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _decision_context() -> Tuple:
    """What changes a kept decision besides the call itself: the two variables choice.choose
    reads, the one that picks the fused pipeline (_pipeline), choice.generation
    (choice.forget()), and whether the call is being captured into a
    CUDA graph (a measured table may answer a captured call otherwise: choice.decided).  The
    last field is that flag."""
    env = os.environ
    return env.get("GC3_FUSED"), env.get("GC3_CONFIG"), env.get("GC3_FUSED_EXCHANGE"), choice.generation, _capturing()


def _choose(op: str, pg, dtype: torch.dtype, shape: dict, path: Optional[str], chunks: Optional[int],
            like: torch.Tensor):
    """The measured choice for this shape, in the catalog the group's communicator serves.
    Kept on the group per call signature, the two variables that change the answer and
    choice.generation (choice.forget())."""
    context = _decision_context()
    key = (op, dtype, tuple(shape.items()), path, chunks) + context
    kept = pg.__dict__.get("_gc3_choices")
    if kept is None:
        kept = pg.__dict__["_gc3_choices"] = {}
    got = kept.get(key)
    if got is not None:
        return got
    from .process_group import _DTYPES
    # Built here on a group's first CUDA call, from a contiguous stand-in: the operands may be
    # strided (B = W.t()), which the sequential path takes as they are.
    comm = pg._comm if pg._comm is not None else pg._cuda([like.new_empty(1)], op)
    machine = getattr(comm, "machine", None)
    got = choice.choose(op, pg.size(), _DTYPES[dtype], shape, path=path, chunks=chunks,
                        catalog=getattr(machine, "path", None), captured=context[-1])
    # A path's set-up (the collective's plan, the tile-store's mapped buffers) cannot run inside
    # a capture: a captured call takes the table's graph path only where an eager call of the
    # shape has set it up, else the path its eager calls took.
    warmed = pg.__dict__.setdefault("_gc3_eager_paths", {})
    shape_key = (op, dtype, tuple(shape.items()))
    if not context[-1]:
        if len(warmed) >= _CHOICES_KEPT:
            warmed.clear()
        warmed[shape_key + (got.fused,)] = got
    elif shape_key + (got.fused,) not in warmed and shape_key + (not got.fused,) in warmed:
        other = warmed[shape_key + (not got.fused,)]
        got = dataclasses.replace(other, why=f"{other.why} (captured: the table's graph path "
                                             f"{'fused' if got.fused else 'sequential'} never ran eagerly here)")
    if len(kept) >= _CHOICES_KEPT:
        kept.clear()
    kept[key] = got
    return got


def _pipeline(run: str, peer_tiles: str = "store"):
    """The function `run` of the fused path's pipeline: tile_store.py's (the GEMM stores its
    tiles into the peers) by default where it has one, overlap.py's (the group's collectives
    beside the GEMM) under GC3_FUSED_EXCHANGE=collective, or copy_engine.py's under
    GC3_FUSED_EXCHANGE=copy-engine where it has one and no CUDA graph is being captured.
    `peer_tiles`: how the tile-store GEMM sends the peers' tiles of an eager call where
    GC3_FUSED_PEER_TILES does not say (the measured choice's)."""
    exchange = settings.get("GC3_FUSED_EXCHANGE")
    if exchange == "copy-engine" and not _capturing():
        from . import copy_engine
        if hasattr(copy_engine, run):
            return getattr(copy_engine, run)
    if exchange == "tile-store":
        from . import tile_store
        if run in tile_store.RUNS:
            return functools.partial(_tile_store, run, peer_tiles)
    return getattr(overlap, run)


def tile_store_refusal(pg, op: str, A: torch.Tensor, B: torch.Tensor) -> str:
    """Why the fused path of `op` on these operands is not the tile-store GEMM ('' where it is):
    another GC3_FUSED_EXCHANGE, an operator it has not, or tile_store.refusal's answer, kept on
    the group per shapes, strides, dtypes and alignments."""
    from . import tile_store
    exchange = settings.get("GC3_FUSED_EXCHANGE")
    if exchange != "tile-store":
        return f"GC3_FUSED_EXCHANGE={exchange}"
    if op not in tile_store.OPS:
        return f"{op} (the tile-store GEMM serves {', '.join(tile_store.OPS)})"
    return _operand_refusal(pg, op, A, B)


def _operand_refusal(pg, op: str, A: torch.Tensor, B: torch.Tensor) -> str:
    """tile_store.refusal's answer for these operands, kept on the group per shapes, strides,
    dtypes and alignments."""
    from . import tile_store
    kept = pg.__dict__.setdefault("_gc3_tile_store_refusals", {})
    key = (op, A.shape, A.stride(), B.shape, B.stride(), A.dtype, B.dtype, A.device,
           A.data_ptr() % 16, B.data_ptr() % 16)
    why = kept.get(key)
    if why is None:
        why = kept[key] = tile_store.refusal(pg, op, A, B)
    return why


def _tile_store(run: str, peer_tiles: str, pg, A: torch.Tensor, B, *rest):
    """tile_store.py's `run` where it serves the call, else overlap.py's (logged).  The
    arguments are overlap.py's: B is one matrix, or for all_gather_matmul the list of them."""
    from . import tile_store
    op = tile_store.RUNS[run]
    what = rest[-1]
    Bs = B if isinstance(B, (list, tuple)) else [B]
    why = "" if len(Bs) == 1 else f"{len(Bs)} matrices B (the tile-store GEMM multiplies by one)"
    # _pipeline hands a call here only under GC3_FUSED_EXCHANGE=tile-store, for its operators.
    why = why or _operand_refusal(pg, op, A, Bs[0])
    if not why and _capturing() and not tile_store.ready(pg, op, A, Bs[0]):
        why = "a CUDA graph capture of a shape whose buffers are not mapped yet (call it once eagerly first)"
    if why:
        _log().info("gc3 torch %s: the tile-store GEMM cannot serve this call (%s); the collectives beside "
                    "cuBLAS run instead", what, why)
        return getattr(overlap, run)(pg, A, B, *rest)
    if op in choice.PEER_TILE_OPS:
        return getattr(tile_store, run)(pg, A, B, *rest, peer_tiles=peer_tiles)
    return getattr(tile_store, run)(pg, A, B, *rest)


# --- the GEMM operators' repeat path --------------------------------------------------
# A call whose operands agree with an earlier call's in everything the gate and the choice
# read (shapes, strides, dtypes, device, the options, the decision context) takes the path
# that call took with no checks: one dictionary hit, then the path itself.  The table lives
# on the group, so it is dropped with it.
_GEMM_REPEATS = "_gc3_gemm_repeats"


def _gemm_key(what: str, tensors: Sequence[torch.Tensor], options: Tuple) -> Tuple:
    return (what, options) + tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors) + _decision_context()


def _gemm_repeat(pg, what: str, tensors: Sequence[torch.Tensor], options: Tuple):
    """(the kept path of this call or None, the call's key)."""
    key = _gemm_key(what, tensors, options)
    repeats = getattr(pg, _GEMM_REPEATS, None)
    return (None if repeats is None else repeats.get(key)), key


def _keep_path(pg, key: Tuple, run):
    """Keep `run` (the path a first call took, a function of the call's tensors) for its repeats;
    returns `run`."""
    _keep_repeat(pg, _GEMM_REPEATS, key, run)
    return run


def _collective(pg, coll: str, send: torch.Tensor, recv: torch.Tensor, count: int, op: Optional[str],
                through_dist) -> None:
    """A sequential path's collective on the current stream: straight into the group's gc3
    communicator where it serves these contiguous CUDA tensors' GPU (what the group's dist
    method does once its checks pass; torch.distributed's dispatch to a Python group costs
    more host time than the rest of a small call), else through_dist()."""
    comm = getattr(pg, "_comm", None)
    if comm is not None and send.is_cuda and send.device == pg._device == recv.device and \
            send.is_contiguous() and recv.is_contiguous():
        pg._submit(comm, coll, send, recv, count, op)
    else:
        through_dist()


def _gemm_fused(op: str, what: str, pg, A, B, path, chunks, run: str, reduce_op: str = "sum"):
    """(the fused pipeline as a function of (A, B), '') where the measured choice or the caller
    takes it, else (None, why the sequential path runs).  `run`: the pipeline's function
    (_pipeline)."""
    pick = _choose(op, pg, A.dtype, _mkn(A, B), path, chunks, A)
    if not pick.fused:
        return None, pick.why
    why = _unmeasured(pg, op, A, [B], path)
    if why:
        return None, why
    _decided(what, pick)
    n, size, pipeline = pick.chunks, pg.size(), _pipeline(run, pick.peer_tiles)

    def fused(A, B):
        out = pipeline(pg, A.contiguous(), B.contiguous(), n, what)
        return out.div_(size) if reduce_op == "avg" else out
    return fused, ""


def _unmeasured(pg, op: str, A: torch.Tensor, Bs: Sequence[torch.Tensor], path: Optional[str]) -> str:
    """Why a measured choice of the fused path does not hold for this call ('' where it does).
    The table's fused times are the tile-store GEMM's: where it cannot serve, the collectives'
    pipeline would run instead, which those times do not describe."""
    if path == "fused" or settings.get("GC3_FUSED_EXCHANGE") != "tile-store":
        return ""
    why = f"{len(Bs)} matrices B" if len(Bs) != 1 else tile_store_refusal(pg, op, A, Bs[0])
    return f"the measured fused path is the tile-store GEMM, which cannot serve this call: {why}" if why else ""


def _decided(what: str, pick) -> None:
    _log().info("gc3 torch %s: fused, %d chunks, peers' tiles: %s (where GC3_FUSED_PEER_TILES is unset): %s", what,
                pick.chunks, pick.peer_tiles, pick.why)


def _sequential(what: str, why: str) -> None:
    _log().info("gc3 torch %s: sequential (torch ops, then the collective): %s", what, why)


# --- the operators -----------------------------------------------------------------
def fused_all_gather_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int, group_name: Group,
                            *, return_A: bool = True, path: Optional[str] = None,
                            chunks: Optional[int] = None) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """A = all_gather(A_shard) along gather_dim, then [A @ B for B in Bs]."""
    what = "fused_all_gather_matmul"
    pg = _group(group_name)
    Bs = list(Bs)
    if all(isinstance(B, torch.Tensor) for B in Bs) and isinstance(A_shard, torch.Tensor):
        run, key = _gemm_repeat(pg, what, [A_shard] + Bs, (gather_dim, return_A, path, chunks))
        if run is not None:
            return run(A_shard, Bs)
    else:
        key = None
    d = _dim(A_shard, gather_dim, what)
    if not Bs:
        raise ValueError(f"{what}: Bs is empty")
    why = _refusal(pg, [A_shard] + Bs, capturable=True)
    if not why and d != 0:
        why = f"gather_dim {gather_dim} (the fused kernel gathers along dim 0)"
    if not why and (A_shard.dim() < 2 or any(B.dim() != 2 or B.shape[0] != A_shard.shape[-1] for B in Bs)):
        why = f"A_shard {tuple(A_shard.shape)} with Bs {[tuple(B.shape) for B in Bs]} (fused: A [.., K], B [K, N])"
    if not why and A_shard.numel() == 0:
        why = "an empty A_shard"
    n = pg.size()
    if not why:
        K = A_shard.shape[-1]
        a = A_shard.reshape(-1, K)
        pick = _choose("ag_gemm", pg, a.dtype, {"M": n * a.shape[0], "K": K, "N": sum(B.shape[1] for B in Bs)},
                       path, chunks, a)
        unmeasured = _unmeasured(pg, "ag_gemm", a, Bs, path) if pick.fused else ""
        if pick.fused and not unmeasured:
            _decided(what, pick)
            pieces, pipeline = pick.chunks, _pipeline("all_gather_matmul")

            def fused(A_shard, Bs):
                a = A_shard.reshape(-1, K)
                A, outs = pipeline(pg, a.contiguous(), [B.contiguous() for B in Bs], pieces, return_A, what)
                lead = (n * A_shard.shape[0],) + tuple(A_shard.shape[1:-1])
                return (None if A is None else A.reshape(lead + (K,))), [o.reshape(lead + (o.shape[1],)) for o in outs]
            return (fused if key is None else _keep_path(pg, key, fused))(A_shard, Bs)
        why = unmeasured or pick.why
    _sequential(what, why)

    def sequential(A_shard, Bs):
        shard = A_shard.movedim(d, 0).contiguous()
        gathered = shard.new_empty((shard.shape[0] * n,) + tuple(shard.shape[1:]))
        _collective(pg, "allgather", shard, gathered, shard.numel(), None,
                    lambda: dist.all_gather_into_tensor(gathered, shard, group=pg))
        A = gathered.movedim(0, d)
        return (A if return_A else None), [A @ B for B in Bs]
    return (sequential if key is None else _keep_path(pg, key, sequential))(A_shard, Bs)


def _gemm_refusal(pg, A, B, rows_divide: bool) -> str:
    why = _refusal(pg, [A, B], capturable=True)
    if not why and (A.dim() != 2 or B.dim() != 2):
        why = f"A {tuple(A.shape)} @ B {tuple(B.shape)} (fused: two matrices)"
    if not why and A.numel() * B.numel() == 0:
        why = "an empty operand"
    if not why and rows_divide and A.shape[0] % pg.size():
        why = f"{A.shape[0]} rows do not split evenly over {pg.size()} ranks"
    return why


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_name: Group, *, path: Optional[str] = None,
                                chunks: Optional[int] = None) -> torch.Tensor:
    """reduce_scatter(A @ B) along scatter_dim (reduce_op "sum" or "avg")."""
    what = "fused_matmul_reduce_scatter"
    pg = _group(group_name)
    run, key = _gemm_repeat(pg, what, (A, B), (reduce_op, scatter_dim, path, chunks))
    if run is not None:
        return run(A, B)
    op = _reduce_op(reduce_op, what)
    why = _gemm_refusal(pg, A, B, rows_divide=True)
    if not why and _dim_of(2, scatter_dim, what) != 0:
        why = f"scatter_dim {scatter_dim} (the fused kernel scatters rows)"
    if not why:
        run, why = _gemm_fused("gemm_rs", what, pg, A, B, path, chunks, "matmul_reduce_scatter", reduce_op)
        if run is not None:
            return _keep_path(pg, key, run)(A, B)
    _sequential(what, why)
    size = pg.size()

    def sequential(A, B):
        C = A @ B
        d = _dim(C, scatter_dim, what)
        if C.shape[d] % size:
            raise ValueError(f"{what}: dim {scatter_dim} of A @ B has {C.shape[d]} rows, "
                             f"not divisible by the group's {size} ranks")
        full = C.movedim(d, 0).contiguous()
        out = full.new_empty((full.shape[0] // size,) + tuple(full.shape[1:]))
        _collective(pg, "reducescatter", full, out, out.numel(), reduce_op,
                    lambda: dist.reduce_scatter_tensor(out, full, op=op, group=pg))
        return out.movedim(0, d)
    return _keep_path(pg, key, sequential)(A, B)


def fused_matmul_all_reduce(A: torch.Tensor, B: torch.Tensor, group_name: Group,
                            reduce_op: str = "sum", *, path: Optional[str] = None,
                            chunks: Optional[int] = None) -> torch.Tensor:
    """all_reduce(A @ B): a row-parallel linear layer (GEMM + AR)."""
    what = "fused_matmul_all_reduce"
    pg = _group(group_name)
    run, key = _gemm_repeat(pg, what, (A, B), (reduce_op, path, chunks))
    if run is not None:
        return run(A, B)
    op = _reduce_op(reduce_op, what)
    why = _gemm_refusal(pg, A, B, rows_divide=False)
    if not why:
        run, why = _gemm_fused("gemm_ar", what, pg, A, B, path, chunks, "matmul_all_reduce", reduce_op)
        if run is not None:
            return _keep_path(pg, key, run)(A, B)
    _sequential(what, why)

    def sequential(A, B):
        C = (A @ B).contiguous()
        _collective(pg, "allreduce", C, C, C.numel(), reduce_op, lambda: dist.all_reduce(C, op=op, group=pg))
        return C
    return _keep_path(pg, key, sequential)(A, B)


def fused_matmul_all_to_all(A: torch.Tensor, B: torch.Tensor, group_name: Group, *, path: Optional[str] = None,
                            chunks: Optional[int] = None) -> torch.Tensor:
    """all_to_all_single(A @ B): row block p of the product goes to rank p, and
    the result's block q came from rank q (GEMM + A2A, an expert layer's exchange)."""
    what = "fused_matmul_all_to_all"
    pg = _group(group_name)
    run, key = _gemm_repeat(pg, what, (A, B), (path, chunks))
    if run is not None:
        return run(A, B)
    why = _gemm_refusal(pg, A, B, rows_divide=True)
    if not why:
        run, why = _gemm_fused("gemm_a2a", what, pg, A, B, path, chunks, "matmul_all_to_all")
        if run is not None:
            return _keep_path(pg, key, run)(A, B)
    _sequential(what, why)
    size = pg.size()

    def sequential(A, B):
        C = (A @ B).contiguous()
        if C.shape[0] % size:
            raise ValueError(f"{what}: A @ B has {C.shape[0]} rows, not divisible by the group's "
                             f"{size} ranks")
        out = torch.empty_like(C)
        _collective(pg, "alltoall", C, out, C.numel() // size, None,
                    lambda: dist.all_to_all_single(out, C, group=pg))
        return out
    return _keep_path(pg, key, sequential)(A, B)


# --- the memory-bound operators ------------------------------------------------------
# Their fused path is taken only where the measured table (or the caller) says so: for
# the GEMV and the embedding bags runtime_cuda.fused's gc3 program on CuPy views of the
# tensors, whose set-up runs on the host, so it is never captured in a CUDA graph; for the
# epilogue, epilogue_fused below.  Their sequential path is the torch
# ops a user writes, then the group's collective, with nothing in between: these
# operators are small enough that any glue there would be most of the call.
def _fused_picked(op: str, what: str, pg, t: torch.Tensor, shape: dict, path: Optional[str]) -> str:
    """'' where the fused path serves this call, else why not.  `t`: an operand, whose
    device names the communicator (and so the machine catalog) that decides."""
    pick = _choose(op, pg, t.dtype, shape, path, None, t)
    if pick.fused:
        _log().info("gc3 torch %s: fused (runtime_cuda.fused): %s", what, pick.why)
        return ""
    return pick.why


def gemv_sequential(x: torch.Tensor, w: torch.Tensor, pg) -> torch.Tensor:
    y = x @ w
    _collective(pg, "allreduce", y, y, y.numel(), "sum", lambda: dist.all_reduce(y, group=pg))
    return y


def _gemv_fused(pg, x: torch.Tensor, w: torch.Tensor, repeat: Optional[Tuple] = None
                ) -> Tuple[Optional[torch.Tensor], str]:
    """(x @ w summed over the ranks by the group's kernel, '') or (None, why it cannot run).
    `repeat`: the call's _repeat_key, under which the group keeps what was decided (the
    caller's x was contiguous: the repeat path does not copy)."""
    from runtime_cuda.fused.memory_bound import gemv_kernel

    from .process_group import _DTYPES
    comm = pg._cuda([x], "fused_gemv_all_reduce")
    dtype = _DTYPES[x.dtype]
    group, why = gemv_kernel(comm, pg.size(), x.shape[0], w.shape[0], w.shape[1], dtype, capturing=_capturing)
    if why:
        return None, why
    if repeat is not None:
        _keep_repeat(pg, "_gc3_gemv_repeats", repeat, (group, tuple(x.shape), dtype, pg._device.index))
    return _gemv_launch(group, x, w, dtype, pg._device.index), ""


# What a repeat table keeps for a call its first call sent down the sequential path.
_SEQUENTIAL = ("sequential",)


def _keep_sequential(pg, table: str, key: Tuple, why: str) -> None:
    """Keep a sequential decision for the repeats of `key` (whose decision context tells a
    captured call from an eager one: a capture may refuse what an eager call would fuse), but
    not one for want of a kernel's group, which a later eager call builds."""
    from runtime_cuda.fused.memory_bound import IN_CAPTURE

    if why != IN_CAPTURE:
        _keep_repeat(pg, table, key, _SEQUENTIAL)


def _keep_repeat(pg, table: str, key: Tuple, value) -> None:
    """Keep what a call decided (and built) under `key` in the gc3 group's `table`, for its
    repeats to take with no checks (cleared when full); another backend's group keeps nothing."""
    from .process_group import Gc3ProcessGroup

    if not isinstance(pg, Gc3ProcessGroup):
        return
    repeats = pg.__dict__.setdefault(table, {})
    if len(repeats) >= _CHOICES_KEPT:
        repeats.clear()
    repeats[key] = value


def _gemv_launch(group, x: torch.Tensor, w: torch.Tensor, dtype: str, index: int) -> torch.Tensor:
    out = x.new_empty((x.shape[0], w.shape[1]))
    group.run_ptrs((x.data_ptr(),), (w.data_ptr(),), (out.data_ptr(),), x.shape[0], w.shape[0], w.shape[1], dtype,
                   torch._C._cuda_getCurrentRawStream(index))
    return out


def _repeat_key(x: torch.Tensor, w: torch.Tensor, path: Optional[str]) -> Tuple:
    """What a fused call's decision depends on, besides contiguity (checked every call)."""
    return (x.shape, w.shape, x.dtype, w.dtype, x.device, w.device, path) + _decision_context()


def fused_gemv_all_reduce(x: torch.Tensor, w: torch.Tensor, group_name: Group, *,
                          path: Optional[str] = None) -> torch.Tensor:
    """all_reduce(x @ w), x [K] or [batch, K] (this rank's K shard), w [K, N]: a
    row-parallel linear layer at decode.  Fused, one kernel on every SM computes each
    rank's partial and reduces it over the ranks in rank order (every rank gets the
    same bits), on torch's current stream, capturable in a CUDA graph
    (runtime_cuda.fused.gemv_kernel).  The measured table's shape is {b: batch, K:
    this rank's K, N}."""
    what = "fused_gemv_all_reduce"
    pg = _group(group_name)
    # A shape this group has run fused before: no checks but contiguity, one launch.
    repeats = getattr(pg, "_gc3_gemv_repeats", None)
    key = _repeat_key(x, w, path)
    hit = None if repeats is None else repeats.get(key)
    if hit is not None and x.is_contiguous() and w.is_contiguous():
        if hit is _SEQUENTIAL:
            return gemv_sequential(x, w, pg)
        out = _gemv_launch(hit[0], x.view(hit[1]), w, hit[2], hit[3])
        return out.view(-1) if x.dim() == 1 else out
    if x.dim() not in (1, 2) or w.dim() != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"{what}: x {tuple(x.shape)} @ w {tuple(w.shape)}: expected x [K] or [batch, K] and "
                         f"w [K, N]")
    why = _refusal(pg, [x, w], capturable=True)
    if not why and x.numel() * w.numel() == 0:
        why = "an empty operand"
    if not why and not w.is_contiguous():
        why = "a strided w (the kernel reads w [K, N] row-major; a copy would cost more than the fusion saves)"
    xs = x.reshape(1, -1) if x.dim() == 1 else x
    batch, k, n_out = xs.shape[0], w.shape[0], w.shape[1]
    if not why:
        from runtime_cuda.fused.gemv_kernel import refusal

        from .process_group import _DTYPES
        why = refusal(_DTYPES[x.dtype], batch, k, n_out, pg.size()) or ""
    if not why:
        why = _fused_picked("gemv_ar", what, pg, x, {"b": batch, "K": k, "N": n_out}, path)
    if not why:
        out, why = _gemv_fused(pg, xs.contiguous(), w, key if x.is_contiguous() else None)
    if not why:
        return out.reshape(-1) if x.dim() == 1 else out
    _sequential(what, why)
    if x.is_contiguous() and w.is_contiguous():
        _keep_sequential(pg, "_gc3_gemv_repeats", key, why)
    return gemv_sequential(x, w, pg)


def flat_bags(indices: torch.Tensor, offsets: torch.Tensor, rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The CSR bags of T tables of `rows` rows as bags of one [T*rows, dim] table, built
    on the tensors' device with no host synchronisation: (flat indices [T*nnz], flat
    offsets [T*(B+1)]), both int64, for torch.nn.functional.embedding_bag.

    Bag t*(B+1) + s is bag s of table t; bag t*(B+1) + B is a filler that holds the
    positions after table t's last bag (up to the next table's first), whose pooled
    value the caller drops.  Those positions are no bag's, so they may hold anything:
    they are read as row 0 of their table, never as an index out of range."""
    T, nnz = indices.shape
    table = torch.arange(T, device=indices.device).unsqueeze(1)
    in_bags = torch.arange(nnz, device=indices.device) < offsets[:, -1:]
    flat = torch.add(torch.where(in_bags, indices, 0), table, alpha=rows)
    return flat.reshape(-1), torch.add(offsets, table, alpha=nnz).reshape(-1)


def embedding_bag_pool(tables: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                       mode: str = "sum") -> torch.Tensor:
    """Pooled bags [B, T*dim], sample-major, table by table: one embedding_bag over the
    tables viewed as one, then one copy into the sample-major layout the all-to-all sends."""
    T, rows, dim = tables.shape
    B = offsets.shape[1] - 1
    idx, off = flat_bags(indices.to(tables.device), offsets.to(tables.device), rows)
    bags = torch.nn.functional.embedding_bag(idx, tables.reshape(T * rows, dim), off, mode=mode)
    return bags.view(T, B + 1, dim)[:, :B].transpose(0, 1).reshape(B, T * dim)


def embedding_bag_sequential(tables: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, pg,
                             mode: str = "sum") -> torch.Tensor:
    pooled = embedding_bag_pool(tables, indices, offsets, mode)
    B, n = pooled.shape[0], pg.size()
    if B % n:
        raise ValueError(f"embedding_bag_sequential: {B} bags do not split evenly over the group's {n} ranks")
    out = pooled.new_empty((n, B // n, pooled.shape[1]))
    _collective(pg, "alltoall", pooled, out, pooled.numel() // n, None,
                lambda: dist.all_to_all_single(out.view(B, -1), pooled, group=pg))
    return out


def fused_embedding_bag_all_to_all(tables: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                                   group_name: Group, mode: str = "sum", *, path: Optional[str] = None,
                                   pooling: Optional[int] = None) -> torch.Tensor:
    """Pooled embedding bags of this rank's tables for the global batch, each rank
    receiving its samples' vectors from every rank (table-wise sharding;
    runtime_cuda.fused.embedding_bag_alltoall when fused).

    tables [T, rows, dim]; indices [T, nnz] and offsets [T, B+1] integer CSR bags
    (bag s of table t: indices[t, offsets[t, s]:offsets[t, s+1]], offsets[t, 0] = 0),
    B a multiple of the group's size n.  Returns [n, B/n, T*dim]: [q] holds rank q's
    pooled vectors (its tables, concatenated) of this rank's B/n samples.

    `pooling`: the bags' mean size as the measured table names shapes, {T, rows, dim,
    pooling, samples: B/n}; by default ceil(nnz / B).  Ranks may hold different nnz.

    Fused, indices and bag bounds are checked on the device with no host synchronisation: a
    bad one pools as nothing and the group's next fused embedding-bag call raises it
    (ValueError); that kernel then refuses to run, as after a device-side assert."""
    what = "fused_embedding_bag_all_to_all"
    pg = _group(group_name)
    if mode not in ("sum", "mean"):
        raise ValueError(f"{what}: mode must be 'sum' or 'mean', got {mode!r}")
    if tables.dim() != 3 or indices.dim() != 2 or offsets.dim() != 2 or \
            not indices.shape[0] == offsets.shape[0] == tables.shape[0]:
        raise ValueError(f"{what}: tables {tuple(tables.shape)}, indices {tuple(indices.shape)}, offsets "
                         f"{tuple(offsets.shape)}: expected [T, rows, dim], [T, nnz], [T, B+1]")
    if indices.dtype.is_floating_point or offsets.dtype.is_floating_point:
        raise ValueError(f"{what}: indices and offsets must be integers, got {indices.dtype}, {offsets.dtype}")
    n = pg.size()
    T, rows, dim = tables.shape
    B, nnz = offsets.shape[1] - 1, indices.shape[1]
    if B < 1 or B % n:
        raise ValueError(f"{what}: offsets hold B+1 = {B + 1} bounds per table; B must be a positive multiple "
                         f"of the group's {n} ranks")
    if pooling is not None and (isinstance(pooling, bool) or not isinstance(pooling, int) or pooling < 1
                                or nnz > B * pooling):
        raise ValueError(f"{what}: pooling={pooling!r} must be an integer >= 1 with nnz <= B * pooling "
                         f"(nnz {nnz}, B {B})")
    why = _refusal(pg, [tables], capturable=True)
    if not why and not indices.device == offsets.device == tables.device:
        why = f"indices on {indices.device} and offsets on {offsets.device}, tables on {tables.device}"
    if not why and mode != "sum":
        why = "mode 'mean' (the fused program pools by sum)"
    if not why and tables.numel() == 0:
        why = "empty tables"
    if not why:
        pooling = pooling or max(1, -(-nnz // B))
        why = _fused_picked("ebag_a2a", what, pg, tables,
                            {"T": T, "rows": rows, "dim": dim, "pooling": pooling, "samples": B // n}, path)
    if not why:
        out, why = _ebag_fused(pg, tables, indices, offsets, n)
    if not why:
        return out
    _sequential(what, why)
    return embedding_bag_sequential(tables, indices, offsets, pg, mode)


def _ebag_fused(pg, tables: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, n: int
                ) -> Tuple[Optional[torch.Tensor], str]:
    """(the pooled bags exchanged by the group's kernel, '') or (None, why it cannot run).
    Straight to the kernel on torch's current stream, so the temporaries freed here are
    reused only by work queued after it there."""
    from runtime_cuda.fused.memory_bound import ebag_kernel

    from .process_group import _DTYPES
    T, rows, dim = tables.shape
    b, nnz, dtype = (offsets.shape[1] - 1) // n, indices.shape[1], _DTYPES[tables.dtype]
    group, why = ebag_kernel(pg._cuda([tables], "fused_embedding_bag_all_to_all"), n, T, rows, dim, b, nnz, dtype,
                             capturing=_capturing)
    if why:
        return None, why
    tab = tables.contiguous()
    idx, off = indices.to(torch.int32).contiguous(), offsets.to(torch.int32).contiguous()
    out = tab.new_empty((n, b, T * dim))
    group.run_ptrs((tab.data_ptr(),), (idx.data_ptr(),), (off.data_ptr(),), (out.data_ptr(),), (nnz,), T, rows, dim,
                   b, dtype, torch._C._cuda_getCurrentRawStream(pg._device.index))
    return out, ""


def epilogue_apply(y: torch.Tensor, scale: Optional[float], bias: Optional[torch.Tensor],
                   residual: Optional[torch.Tensor], out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    """y * scale + bias + residual in out_dtype, where y (the reduced sum) may be
    overwritten.  Two elementwise passes at most, the bandwidth being the whole cost:
    the scale rides on the first addition (alpha=), the cast on the last pass's output."""
    dtype = out_dtype or y.dtype
    out = y if dtype == y.dtype else torch.empty_like(y, dtype=dtype)
    addends = [t for t in (bias, residual) if t is not None]
    if not addends:
        return torch.mul(y, scale, out=out) if scale is not None else out.copy_(y)
    first, rest = addends[0], addends[1:]
    mid = y if rest else out
    torch.add(first, y, alpha=1 if scale is None else scale, out=mid)
    for t in rest:
        torch.add(mid, t, out=out)
    return out


def epilogue_sequential(x: torch.Tensor, pg, scale: Optional[float] = None, bias: Optional[torch.Tensor] = None,
                        residual: Optional[torch.Tensor] = None,
                        out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    y = x.clone(memory_format=torch.contiguous_format)
    _collective(pg, "allreduce", y, y, y.numel(), "sum", lambda: dist.all_reduce(y, group=pg))
    return epilogue_apply(y, scale, bias, residual, out_dtype)


def _epilogue_arguments(what: str, x, scale, bias, residual, out_dtype) -> None:
    """ValueError naming the first argument that does not fit x."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise ValueError(f"{what}: x must be a floating-point tensor, got "
                         f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"{what}: scale must be a finite number, got {scale!r}")
    if out_dtype is not None and (not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point):
        raise ValueError(f"{what}: out_dtype must be a floating-point torch.dtype, got {out_dtype!r}")
    dtypes = {x.dtype, out_dtype or x.dtype}
    for name, t, want in (("bias", bias, tuple(x.shape[-1:])), ("residual", residual, tuple(x.shape))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what}: {name} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != want or (name == "bias" and x.dim() == 0):
            raise ValueError(f"{what}: {name} has shape {tuple(t.shape)}, expected {want} "
                             f"({'x.shape[-1] elements' if name == 'bias' else 'the shape'} of x {tuple(x.shape)})")
        if t.dtype not in dtypes:
            raise ValueError(f"{what}: {name} has dtype {t.dtype}, expected x's {x.dtype}"
                             + ("" if len(dtypes) == 1 else f" or out_dtype {out_dtype}"))
        if t.device != x.device:
            raise ValueError(f"{what}: {name} is on {t.device}, x on {x.device}")


def _epilogue_key(x: torch.Tensor, scale, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                  out_dtype: Optional[torch.dtype], path: Optional[str]) -> Tuple:
    """What a fused epilogue call's checks, decision and launch words depend on, besides x's
    address and contiguity (checked every call): the terms' addresses ride in the words."""
    terms = tuple(None if t is None else (t.data_ptr(), t.shape, t.dtype, t.device, t.is_contiguous())
                  for t in (bias, residual))
    return (x.shape, x.dtype, x.device, type(scale), scale, out_dtype, path) + terms + _decision_context()


# The kept launch of an epilogue above the small kernels' limit (its `group` is the communicator,
# its words the pass's packed launch): the group's allreduce into a buffer kept per stream, then
# one pass.
_ALLREDUCE_THEN_PASS = "allreduce+pass"


def _epilogue_launch(pg, hit: Tuple, x: torch.Tensor) -> torch.Tensor:
    """The kept launch on x into a new output.  (A captured call never finds the allreduce and
    pass: the key tells captured calls apart, and a capture refuses that path.)"""
    group, count, dtype, odt, out_dtype, kind, epw, index = hit
    stream = torch._C._cuda_getCurrentRawStream(index)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if kind == _ALLREDUCE_THEN_PASS:
        _allreduce_then_pass(pg, group, x, out, count, dtype, epw, stream)
    else:
        group.run_ptrs((x.data_ptr(),), (out.data_ptr(),), count, dtype, "sum", stream, kind=kind, epilogue=epw,
                       out_dtype=odt)
    return out


def _allreduce_then_pass(pg, comm, x: torch.Tensor, out: torch.Tensor, count: int, dtype: str, run_pass,
                         stream: int) -> None:
    """The group's allreduce of x into a buffer kept per (stream, shape, dtype), so that a repeated
    call hands the communicator the same addresses (its prepared-call path), then the epilogue pass
    (`run_pass`, runtime_cuda.fused.epilogue.pass_launch's) into out."""
    from runtime_cuda.nccl.constants import DTYPE_CODES, NCCL_SUM
    (y,) = overlap.scratch(pg, ("epilogue", stream, x.shape, x.dtype), lambda: (torch.empty_like(x),))
    comm.allReduce(x.data_ptr(), y.data_ptr(), count, DTYPE_CODES[dtype], NCCL_SUM, stream)
    run_pass(y.data_ptr(), out.data_ptr(), stream)


def epilogue_fused(x: torch.Tensor, pg, scale: Optional[float], bias: Optional[torch.Tensor],
                   residual: Optional[torch.Tensor], out_dtype: Optional[torch.dtype],
                   path: Optional[str] = None, repeat: Optional[Tuple] = None) -> Tuple[Optional[torch.Tensor], str]:
    """(the fused path's result, '') or (None, why it cannot serve the call: set-up failed).
    Up to the small kernels' limit one launch of their epilogue build; above it the group's
    allreduce, then one epilogue pass (runtime_cuda.fused.epilogue).  Addresses and torch's
    current stream go straight to the kernels: no DLPack views, no host synchronisation, and
    outputs from torch's caching allocator.  `repeat`: the call's _epilogue_key, under which the
    call keeps its launch for repeats (x and the terms were contiguous, so the words hold the
    caller's own addresses)."""
    import cupy

    from runtime_cuda.fused import epilogue as fe

    from .process_group import _DTYPES
    what = "fused_all_reduce_epilogue"
    xs = x.contiguous()
    b, r = (None if t is None else t.contiguous() for t in (bias, residual))
    comm = pg._cuda([xs] + [t for t in (b, r) if t is not None], what)
    dtype, odt = _DTYPES[x.dtype], _DTYPES[out_dtype or x.dtype]
    count = xs.numel()
    with cupy.cuda.Device(xs.device.index):
        why = fe.refusal(comm, path or "auto", count, dtype, pg.size(), f"{what} {tuple(x.shape)} {dtype}->{odt}",
                         _capturing)
        if why:
            return None, why
        stream = torch.cuda.current_stream(xs.device).cuda_stream
        items = [k for k, v in (("scale", scale), ("bias", b), ("residual", r)) if v is not None]
        epw = fe.words(items, None if scale is None else float(scale), xs.shape[-1], pg.size(),
                       [0 if b is None else b.data_ptr()], [0 if r is None else r.data_ptr()])
        out = torch.empty(xs.shape, dtype=out_dtype or x.dtype, device=xs.device)
        if fe.fits_kernel(count, dtype):
            kind = fe.kernel_kind(count * xs.element_size(), pg.size())
            if repeat is not None:
                _keep_repeat(pg, "_gc3_epilogue_repeats", repeat, (fe.small_group(comm), count, dtype, odt,
                                                                   out.dtype, kind, epw, xs.device.index))
            fe.run_kernel(comm, [xs.data_ptr()], [out.data_ptr()], count, dtype, odt, epw, stream, kind)
        else:
            run_pass = fe.pass_launch(count, dtype, odt, epw[0])
            if repeat is not None:
                _keep_repeat(pg, "_gc3_epilogue_repeats", repeat, (comm, count, dtype, odt, out.dtype,
                                                                   _ALLREDUCE_THEN_PASS, run_pass, xs.device.index))
            _allreduce_then_pass(pg, comm, xs, out, count, dtype, run_pass, stream)
    return out, ""


def fused_all_reduce_epilogue(x: torch.Tensor, group: Group, scale: Optional[float] = None,
                              bias: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                              out_dtype: Optional[torch.dtype] = None, *, path: Optional[str] = None) -> torch.Tensor:
    """all_reduce(x, SUM) * scale + bias + residual, cast to out_dtype, as a new tensor on
    every rank (x is not modified): the epilogue after a row-parallel layer.

    scale: a number (1 / group size gives the average); bias: x.shape[-1] elements,
    broadcast over the other dims; residual: x's shape.  bias and residual have x's
    dtype or out_dtype; every term is optional.  out_dtype (default x's) may differ
    from x's, as fp32 partial sums cast to bf16: the cast runs on the GPU.  Fused
    (epilogue_fused) the ranks' sum and the epilogue are computed in fp32 and rounded
    once to out_dtype, bit-identical on every rank, and need bias and residual in x's
    dtype; up to gc3.limits.SMALL_ALLREDUCE_MAX_BYTES of x it is one kernel, which a CUDA
    graph may capture.  The measured table's shape is {bytes: x's bytes}."""
    from gc3.limits import SMALL_ALLREDUCE_MAX_BYTES
    what = "fused_all_reduce_epilogue"
    pg = _group(group)
    # A call this group has decided before: no checks but x's contiguity, then the kept path.
    repeats = getattr(pg, "_gc3_epilogue_repeats", None)
    if repeats is not None and isinstance(x, torch.Tensor) and \
            all(isinstance(t, torch.Tensor) for t in (bias, residual) if t is not None):
        try:
            hit = repeats.get(_epilogue_key(x, scale, bias, residual, out_dtype, path))
        except TypeError:   # an unhashable scale: the checks below say what is wrong with it
            hit = None
        if hit is not None and x.is_contiguous():
            if hit is _SEQUENTIAL:
                return epilogue_sequential(x, pg, scale, bias, residual, out_dtype)
            return _epilogue_launch(pg, hit, x)
    _epilogue_arguments(what, x, scale, bias, residual, out_dtype)
    terms = [t for t in (bias, residual) if t is not None]
    # Checked by now (the scale is a number): the key under which the call keeps its path.
    key = _epilogue_key(x, scale, bias, residual, out_dtype, path) \
        if x.is_contiguous() and all(t.is_contiguous() for t in terms) else None
    nbytes = x.numel() * x.element_size()
    why = _refusal(pg, [x] + terms, capturable=nbytes <= SMALL_ALLREDUCE_MAX_BYTES)
    if not why and out_dtype is not None and out_dtype not in _FUSED_DTYPES:
        why = f"out_dtype {out_dtype}; the fused kernels store one of {[str(d) for d in _FUSED_DTYPES]}"
    if not why and scale is None and not terms:
        why = "no epilogue (a plain all_reduce)"
    if not why and x.dim() * x.numel() == 0:
        why = "an empty or 0-d x"
    if not why:
        why = _fused_picked("ar_epilogue", what, pg, x, {"bytes": nbytes}, path)
    if not why:
        out, why = epilogue_fused(x, pg, scale, bias, residual, out_dtype, path, key)
        if out is not None:
            return out
    _sequential(what, why)
    if key is not None:
        _keep_sequential(pg, "_gc3_epilogue_repeats", key, why)
    return epilogue_sequential(x, pg, scale, bias, residual, out_dtype)


__all__ = ["fused_all_gather_matmul", "fused_matmul_reduce_scatter", "fused_matmul_all_reduce",
           "fused_matmul_all_to_all", "fused_gemv_all_reduce", "fused_embedding_bag_all_to_all",
           "fused_all_reduce_epilogue"]
