"""The GEMM operators' fused path with a copy-engine exchange (GC3_FUSED_EXCHANGE=copy-engine):
torch tensors handed to runtime_cuda.fused.gemm's pipeline, which computes each destination's
chunk with cuBLAS and copies it straight into the peer's buffer by the copy engine, one transfer
stream per peer, with arrival flags between them.  The exchange then takes no SM from the GEMM,
where the default (overlap.py) runs the group's collectives beside it.

The same functions as overlap.py, with its signatures, so ops.py picks either by the setting.
Each group builds one runtime_cuda.fused.IpcGemmGroup over its communicator's rendezvous on its
first call (every rank makes the same calls), and each shape registers its buffers on its first
call.  Outputs come from torch's caching allocator; the inputs and outputs reach the pipeline as
zero-copy CuPy views, on torch's current stream.  `chunks` is the pipeline's own: one chunk per
destination rank.  A CUDA-graph capture takes overlap.py's path: the pipeline registers buffers
on the host at a shape's first call and waits on flags it releases itself."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .handover import cupy_view, fused_call, ipc_group


def _views(tensors: Sequence[torch.Tensor]) -> list:
    return [cupy_view(t) for t in tensors]


def _product(pg, A: torch.Tensor, B: torch.Tensor, rows: int, what: str, run, **kw) -> torch.Tensor:
    """`run` (a runtime_cuda.fused.gemm operator taking a, b, group) on A @ B into a new [rows, N]
    output, with `kw` passed on."""
    out = A.new_empty((rows, B.shape[1]))
    with fused_call(pg, [A, B, out], what) as queue:
        a, b, o = _views([A, B, out])
        run(a, b, ipc_group(pg), out=o, stream=queue, fused=True, **kw)
    return out


def matmul_reduce_scatter(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """rows r of sum_s A_s @ B_s (sum over ranks), [M/G, N]; A [M, K_r], B [K_r, N] contiguous."""
    from runtime_cuda.fused import gemm_reduce_scatter
    return _product(pg, A, B, A.shape[0] // pg.size(), what, gemm_reduce_scatter)


def matmul_all_reduce(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """sum_s A_s @ B_s on every rank, [M, N]."""
    from runtime_cuda.fused import gemm_all_reduce
    return _product(pg, A, B, A.shape[0], what, gemm_all_reduce)


def matmul_all_to_all(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """all_to_all_single(A @ B): row block q of the result came from rank q (equal blocks)."""
    from runtime_cuda.fused import gemm_all_to_all
    splits = [A.shape[0] // pg.size()] * pg.size()
    return _product(pg, A, B, A.shape[0], what,
                    lambda a, b, group, **kw: gemm_all_to_all(a, b, splits, group, **kw), same_splits=True)


def all_gather_matmul(pg, A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], chunks: int, return_A: bool,
                      what: str) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """A = all_gather(A_shard) (rank-major rows), [A @ B for B in Bs]; A_shard [m, K]."""
    from runtime_cuda.fused import all_gather_gemm

    G = pg.size()
    m, K = A_shard.shape
    outs = [A_shard.new_empty((G * m, B.shape[1])) for B in Bs]
    A = A_shard.new_empty((G * m, K)) if return_A else None
    with fused_call(pg, [A_shard] + list(Bs) + outs, what) as queue:
        a, = _views([A_shard])
        all_gather_gemm(a, _views(Bs), ipc_group(pg), return_a=return_A, out=_views(outs), stream=queue, fused=True,
                        out_a=None if A is None else _views([A])[0])
    return A, outs
