"""Fused GEMM + AllToAll (expert-parallel combine, AMD's GEMM+A2A).

Parameters (positional ints, defaults in brackets): ranks N [4], m [64] (rows M
of each rank's product), k [32], n [32] (columns), chunks C [2] (row blocks per
destination slice; M must divide by N*C), skew [0] (1: a skewed split, a hot
rank 0: every other rank gets ceil(C/2) blocks of M/(N*C) rows and rank 0 the
rest; needs C >= 2).  bf16 inputs and output, fp32 accumulation, each value
rounded once (no reduction).

Rank r computes a_r @ b_r [M, N]; its row slice p (M/N rows) goes to rank p,
which ends with [N, M/N, N] rank-major (gc3.collectives.GemmAllToAll).  With
skew, rank p gets splits[p] rows of every rank's product, each rank's slice in
a grid padded to the largest slice.

Schedule (rank-swizzled): rank r computes rank r+1's slice first, then
r+2's, ..., its own last, block by block into scratch, and sends each block
as soon as it is computed; its own slice is computed straight into its output.

Compile and run on the CPU:
    gc3 compile gc3/algorithms/fused/gemm_alltoall.py -o gemm_a2a.xml && gc3 simulate gemm_a2a.xml
The interpreter has no gemm opcode (the GPU side drives cuBLAS per chunk): `gc3 run` refuses the IR.
"""
from gc3 import Check, GC3Program, gemm, int_args
from gc3.ir.collectives import GemmAllToAll
from gc3.topology import fully_connected


def gemm_alltoall(num_ranks: int = 4, m: int = 64, k: int = 32, n: int = 32, chunks: int = 2,
                  skew: int = 0) -> GC3Program:
    N, c = num_ranks, chunks
    if skew not in (0, 1) or (skew and c < 2):
        raise ValueError(f"skew must be 0 or 1, and a skewed split needs chunks >= 2; got skew={skew}, chunks={c}")
    blocks = [c] * N                            # row blocks of M/(N*c) rows for each destination
    if skew:
        blocks = [N * c - (N - 1) * -(-c // 2)] + [-(-c // 2)] * (N - 1)
    grid = max(blocks)                          # chunks per slice of the (padded) buffer
    first = [sum(blocks[:p]) for p in range(N)]
    rows = m // (N * c) if m % (N * c) == 0 else 0
    splits = [b * rows for b in blocks] if skew and rows else None
    coll = GemmAllToAll(N, grid, m=m, k=k, n=n, dtype="bfloat16", splits=splits)
    with GC3Program("gemm_alltoall" + ("_skewed" if skew else ""), coll, topology=fully_connected(N)) as prog:
        sent = [0] * N                          # scratch chunks each rank has used
        for s in range(1, N + 1):               # peer r+s's slice at step s; s = N: the rank's own
            for r in range(N):
                p = (r + s) % N
                for i in range(blocks[p]):
                    if p == r:
                        gemm(r, "out", r * grid + i, rows=first[p] + i)
                    else:
                        gemm(r, "scratch", sent[r], rows=first[p] + i).copy(p, "out", r * grid + i)
                        sent[r] += 1
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return gemm_alltoall(*int_args(argv, ranks=4, m=64, k=32, n=32, chunks=2, skew=0))


if __name__ == "__main__":
    main()
