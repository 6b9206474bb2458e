"""Torch functions with the call shapes of PyTorch's fused operators
(torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter), plus
GEMM + all_reduce and GEMM + all_to_all, taking a process group or its name.

Thin wrappers: today each is the matmul and the collective one after the other
(through whatever backend the group has, gc3's included), which is also the
reference a fused kernel must equal; gc3's fused kernels (runtime_cuda/fused)
can replace a body without changing a caller.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

Group = Union[dist.ProcessGroup, str, None]

_REDUCE = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}


def _group(group: Group) -> dist.ProcessGroup:
    if group is None:
        return dist.group.WORLD
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group
        return _resolve_process_group(group)
    return group


def _dim(t: torch.Tensor, dim: int, what: str) -> int:
    if not -t.dim() <= dim < t.dim():
        raise ValueError(f"{what}: dim {dim} is out of range for a {t.dim()}-d tensor")
    return dim % t.dim()


def _reduce_op(reduce_op: str, what: str):
    if reduce_op not in _REDUCE:
        raise ValueError(f"{what}: reduce_op {reduce_op!r} is not one of {sorted(_REDUCE)}")
    return _REDUCE[reduce_op]


def fused_all_gather_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int, group_name: Group,
                            *, return_A: bool = True) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """A = all_gather(A_shard) along gather_dim, then [A @ B for B in Bs]."""
    pg = _group(group_name)
    d = _dim(A_shard, gather_dim, "fused_all_gather_matmul")
    shard = A_shard.movedim(d, 0).contiguous()
    gathered = shard.new_empty((shard.shape[0] * pg.size(),) + tuple(shard.shape[1:]))
    dist.all_gather_into_tensor(gathered, shard, group=pg)
    A = gathered.movedim(0, d)
    return (A if return_A else None), [A @ B for B in Bs]


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_name: Group) -> torch.Tensor:
    """reduce_scatter(A @ B) along scatter_dim (reduce_op "sum" or "avg")."""
    pg = _group(group_name)
    op = _reduce_op(reduce_op, "fused_matmul_reduce_scatter")
    C = A @ B
    d = _dim(C, scatter_dim, "fused_matmul_reduce_scatter")
    if C.shape[d] % pg.size():
        raise ValueError(f"fused_matmul_reduce_scatter: dim {scatter_dim} of A @ B has {C.shape[d]} rows, "
                         f"not divisible by the group's {pg.size()} ranks")
    full = C.movedim(d, 0).contiguous()
    out = full.new_empty((full.shape[0] // pg.size(),) + tuple(full.shape[1:]))
    dist.reduce_scatter_tensor(out, full, op=op, group=pg)
    return out.movedim(0, d)


def fused_matmul_all_reduce(A: torch.Tensor, B: torch.Tensor, group_name: Group,
                            reduce_op: str = "sum") -> torch.Tensor:
    """all_reduce(A @ B): a row-parallel linear layer (GEMM + AR; B a vector: GEMV + AR)."""
    pg = _group(group_name)
    C = (A @ B).contiguous()
    dist.all_reduce(C, op=_reduce_op(reduce_op, "fused_matmul_all_reduce"), group=pg)
    return C


def fused_matmul_all_to_all(A: torch.Tensor, B: torch.Tensor, group_name: Group) -> torch.Tensor:
    """all_to_all_single(A @ B): row block p of the product goes to rank p, and
    the result's block q came from rank q (GEMM + A2A, an expert layer's exchange)."""
    pg = _group(group_name)
    C = (A @ B).contiguous()
    if C.shape[0] % pg.size():
        raise ValueError(f"fused_matmul_all_to_all: A @ B has {C.shape[0]} rows, not divisible by the group's "
                         f"{pg.size()} ranks")
    out = torch.empty_like(C)
    dist.all_to_all_single(out, C, group=pg)
    return out
