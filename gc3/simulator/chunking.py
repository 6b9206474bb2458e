"""The chunk count of a fused GEMM program, chosen with the cost model.

More chunks start the communication earlier (the first send waits for one
chunk's GEMM) but cost GEMM time: each chunk pays a launch and its last wave
runs partly empty (`cost_model.compute_seconds`); the GEMM rate and the
per-chunk cost are fitted to the chunked-GEMM measurement (gemm_measured.py).  `choose_gemm_chunks`
predicts the whole fused program at each candidate count and takes the
fastest.  The schedule (which steps, in which order, on which threadblocks)
does not depend on the matrix sizes, only on ranks and chunks, so each
candidate is traced at a tiny shape and its steps priced at the real one.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Sequence, Tuple, Union

from ..dtypes import dtype_info
from ..errors import SimulationError
from .cost_config import DEFAULT as DEFAULT_COST, CostConfig, preset
from .cost_model import predict
from .gemm_measured import measured

CANDIDATES = (1, 2, 4, 8, 16)


def gemm_cost(cost: Union[str, CostConfig] = DEFAULT_COST) -> CostConfig:
    """A preset by name gets its GEMM rate and per-chunk cost from the chunked-GEMM measurement
    (gemm_measured.py); a CostConfig given as such is used as it is."""
    return measured(preset(cost)) if isinstance(cost, str) else cost


def predict_gemm_program(build: Callable, num_ranks: int, m: int, k: int, n: int, chunks: int,
                         cost: Union[str, CostConfig] = DEFAULT_COST) -> float:
    """Predicted seconds of `build(num_ranks, m, k, n, chunks)` (a gc3/algorithms/fused GEMM program
    whose C is cut into num_ranks * chunks row blocks) at the shape m, k, n."""
    from .driver import simulate

    if m % (num_ranks * chunks):
        raise SimulationError(f"m={m} rows do not split into {num_ranks}*{chunks} row blocks")
    small = simulate(build(num_ranks, num_ranks * chunks, 1, 1, chunks))
    if not small.ok:
        raise SimulationError(f"the {chunks}-chunk program is wrong at a tiny shape: {small.errors[:1]}")
    spec = small.program.compute
    real = replace(spec, inputs=(("a", (m, k)), ("b", (k, n))))
    cfg = gemm_cost(cost)
    itemsize = dtype_info(spec.buffer_dtype).np.itemsize
    scale = real.out_elems // spec.out_elems             # elements of the real chunk per tiny one
    L = small.layout
    return predict(small.records, proto=small.program.proto, coll=small.program.coll, nranks=num_ranks,
                   chunk_bytes=L.cs * scale * itemsize,
                   size_bytes=max(L.in_elems, L.out_elems) * scale * itemsize, config=cfg, itemsize=itemsize,
                   compute=real).total_s


def choose_gemm_chunks(build: Callable, num_ranks: int, m: int, k: int, n: int,
                       candidates: Sequence[int] = CANDIDATES,
                       cost: Union[str, CostConfig] = DEFAULT_COST) -> Tuple[int, Dict[int, float]]:
    """(the fastest chunk count, {count: predicted seconds}) over the `candidates` that split m
    into num_ranks * count whole row blocks; ties go to fewer chunks."""
    times = {c: predict_gemm_program(build, num_ranks, m, k, n, c, cost)
             for c in candidates if c >= 1 and m % (num_ranks * c) == 0}
    if not times:
        raise SimulationError(f"none of the chunk counts {list(candidates)} splits m={m} into "
                              f"{num_ranks}*count row blocks")
    return min(times, key=lambda c: (times[c], c)), times
