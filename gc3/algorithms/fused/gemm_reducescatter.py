"""Fused GEMM + ReduceScatter (row-parallel linear with sequence parallelism, FLUX's GEMM+RS).

Parameters (positional ints, defaults in brackets): ranks N [4], m [64] (rows M
of the product), k_shard [32] (K/N, each rank's slice of the inner dimension),
n [32] (columns), chunks C [2] (row blocks per rank slice; M must divide by
N*C), fp32 [1] (1: the cross-rank sum is carried in fp32 and rounded once; 0:
partials rounded to bf16 at every hop).  bf16 inputs, fp32 accumulation.

Rank r holds a_r [M, K/N] and b_r [K/N, N]; rank p ends with rows
p*M/N .. (p+1)*M/N of sum_r a_r @ b_r (gc3.collectives.GemmReduceScatter).

Schedule (rank-swizzled, as FLUX): rank r computes the row blocks of rank
r+1's slice first, then r+2's, ..., its own last; each block leaves for its
owner's scratch as soon as it is computed, while the next one is computed, so
the first send waits for the first GEMM chunk only.  The owner adds the N-1
arrived blocks to its own.

Compile and run on the CPU:
    gc3 compile gc3/algorithms/fused/gemm_reducescatter.py -o gemm_rs.xml && gc3 simulate gemm_rs.xml
The interpreter has no gemm opcode (the GPU side drives cuBLAS per chunk): `gc3 run` refuses the IR.
"""
from gc3 import Check, GC3Program, chunk, gemm, int_args
from gc3.ir.collectives import GemmReduceScatter
from gc3.topology import fully_connected


def gemm_reducescatter(num_ranks: int = 4, m: int = 64, k_shard: int = 32, n: int = 32, chunks: int = 2,
                       fp32: int = 1) -> GC3Program:
    N, c = num_ranks, chunks
    coll = GemmReduceScatter(N, c, m=m, k_shard=k_shard, n=n, dtype="bfloat16", accum="float32" if fp32 else "")

    def arrival(src, dst, i):       # where dst keeps src's block i: after its N-1 own send slots
        return (N - 1) * c + ((src - dst) % N - 1) * c + i

    with GC3Program("gemm_reducescatter", coll, topology=fully_connected(N)) as prog:
        for s in range(1, N + 1):               # peer r+s's slice at step s; s = N: the rank's own
            for i in range(c):
                for r in range(N):
                    p = (r + s) % N
                    if p == r:
                        gemm(r, "out", i, rows=r * c + i)
                    else:
                        gemm(r, "scratch", (s - 1) * c + i, rows=p * c + i).copy(p, "scratch", arrival(r, p, i))
        for r in range(N):
            for i in range(c):
                mine = chunk(r, "out", i)
                for q in range(N):
                    if q != r:
                        mine = mine.reduce(chunk(r, "scratch", arrival(q, r, i)))
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return gemm_reducescatter(*int_args(argv, ranks=4, m=64, k_shard=32, n=32, chunks=2, fp32=1))


if __name__ == "__main__":
    main()
