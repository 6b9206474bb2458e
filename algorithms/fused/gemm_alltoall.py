"""Fused GEMM + AllToAll (expert-parallel combine, AMD's GEMM+A2A).

Parameters (positional ints, defaults in brackets): ranks N [4], m [64] (rows M
of each rank's product), k [32], n [32] (columns), chunks C [2] (row blocks per
destination slice; M must divide by N*C).  bf16 inputs and output, fp32
accumulation, each value rounded once (no reduction).

Rank r computes a_r @ b_r [M, N]; its row slice p (M/N rows) goes to rank p,
which ends with [N, M/N, N] rank-major (gc3.collectives.GemmAllToAll).

Schedule (rank-swizzled): rank r computes rank r+1's slice first, then
r+2's, ..., its own last, block by block into scratch, and sends each block
as soon as it is computed; its own slice is computed straight into its output.

Compile and run on the CPU:
    gc3 compile algorithms/fused/gemm_alltoall.py -o gemm_a2a.xml && gc3 simulate gemm_a2a.xml
The interpreter has no gemm opcode (the GPU side drives cuBLAS per chunk): `gc3 run` refuses the IR.
"""
from gc3 import Check, GC3Program, gemm, int_args
from gc3.collectives import GemmAllToAll
from gc3.topology import fully_connected


def gemm_alltoall(num_ranks: int = 4, m: int = 64, k: int = 32, n: int = 32, chunks: int = 2) -> GC3Program:
    N, c = num_ranks, chunks
    coll = GemmAllToAll(N, c, m=m, k=k, n=n, dtype="bfloat16")
    with GC3Program("gemm_alltoall", coll, topology=fully_connected(N)) as prog:
        for s in range(1, N + 1):               # peer r+s's slice at step s; s = N: the rank's own
            for i in range(c):
                for r in range(N):
                    p = (r + s) % N
                    if p == r:
                        gemm(r, "out", r * c + i, rows=r * c + i)
                    else:
                        gemm(r, "scratch", (s - 1) * c + i, rows=p * c + i).copy(p, "out", r * c + i)
        Check()
    return prog


if __name__ == "__main__":
    gemm_alltoall(*int_args(ranks=4, m=64, k=32, n=32, chunks=2))
