"""Fused GEMV + AllReduce: y = sum_r x_r @ w_r (a row-parallel linear layer at decode).

Parameters (positional ints, defaults in brackets): ranks N [4], batch [1],
K_shard [512] (rows of each rank's weight shard), N_out [2048] (columns of y),
chunks C [8] (column blocks of y; N_out must divide by C), variant [2]
(1: one-shot, 2: two-shot), compute TBs S [0] (0: each block is computed by the
TB that sends it; S > 0: block j by a compute TB of its own, j mod S, so that S
thread blocks per rank compute at once -- the interpreter computes a step with
one block, and a GEMV needs many to use the GPU's memory bandwidth); keyword
dtype ["bfloat16"] (float16 and float32 too): the inputs' and output's type,
with fp32 accumulation.

Rank r holds x_r [batch, K_shard] and w_r [K_shard, N_out].  Chunk j of the
(in-place) buffer is column block j of y, y[:, j*N_out/C:(j+1)*N_out/C]
row-major (gc3.ir.ComputeSpec), and is produced by a `gemv` step on each rank,
then reduced across ranks like any AllReduce chunk: each block leaves as soon as
it is computed, while the rank computes the next ones.

* one-shot (1): every rank sends each block to every other rank's scratch and
  reduces the N-1 copies it receives into its own: 1 step, (N-1)x the data
  per rank; for the smallest outputs.
* two-shot (2): block j is owned by rank j mod N; the others reduce their
  partial block into the owner's (a direct reduce-scatter), which then sends
  the sum to everyone (all-gather): 2 steps, 2(N-1)/N of the data per rank.

Compile and run on the CPU:
    gc3 compile gc3/algorithms/fused/gemv_allreduce.py -o gemv_ar.xml && gc3 simulate gemv_ar.xml
On a GPU, runtime_cuda.fused.gemv_allreduce runs it with the caller's x and w.
"""
from gc3 import Check, GC3Program, chunk, gemv, int_args
from gc3.ir.collectives import GemvAllReduce
from gc3.topology import fully_connected


def gemv_allreduce(num_ranks: int = 4, batch: int = 1, k_shard: int = 512, n_out: int = 2048, chunks: int = 8,
                   variant: int = 2, compute_tbs: int = 0, dtype: str = "bfloat16") -> GC3Program:
    n, c = num_ranks, chunks
    if variant not in (1, 2):
        raise ValueError(f"variant must be 1 (one-shot) or 2 (two-shot), got {variant}")
    coll = GemvAllReduce(num_ranks=n, chunk_factor=c, batch=batch, k_shard=k_shard, n_out=n_out, dtype=dtype)
    name = "gemv_allreduce_" + ("oneshot" if variant == 1 else "twoshot")
    with GC3Program(name, coll, topology=fully_connected(n)) as prog:
        for j in range(c):                 # block by block, so block j's traffic waits on block j only
            for r in range(n):
                gemv(r, "out", j, sendtb=j % compute_tbs if compute_tbs else None)
            if variant == 1:
                for r in range(n):         # every partial block to every other rank's scratch ...
                    for k, p in enumerate(q for q in range(n) if q != r):
                        chunk(p, "out", j).copy(r, "scratch", j * (n - 1) + k)
                for r in range(n):         # ... where it is added to the rank's own
                    mine = chunk(r, "out", j)
                    for k in range(n - 1):
                        mine = mine.reduce(chunk(r, "scratch", j * (n - 1) + k))
            else:
                owner = j % n
                total = chunk(owner, "out", j)
                for p in range(n):         # reduce-scatter into the block's owner ...
                    if p != owner:
                        total = total.reduce(chunk(p, "out", j))
                for p in range(n):         # ... which sends the sum to everyone
                    if p != owner:
                        total.copy(p, "out", j)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return gemv_allreduce(*int_args(argv, ranks=4, batch=1, k_shard=512, n_out=2048, chunks=8, variant=2,
                                    compute_tbs=0))


if __name__ == "__main__":
    main()
