"""Fused GEMM + AllReduce (row-parallel linear without sequence parallelism, CoCoNet's MatMul+AllReduce).

Parameters (positional ints, defaults in brackets): ranks N [4], m [64] (rows M
of the product), k_shard [32] (K/N, each rank's slice of the inner dimension),
n [32] (columns), chunks C [2] (row blocks per rank slice; M must divide by
N*C), fp32 [1] (1: the cross-rank sum is carried in fp32 and rounded once; 0:
partials rounded to bf16 at every hop).  bf16 inputs, fp32 accumulation.

Rank r holds a_r [M, K/N] and b_r [K/N, N]; every rank ends with
sum_r a_r @ b_r [M, N] (gc3.collectives.GemmAllReduce), in place.

Schedule: row slice p (C blocks) is owned by rank p.  Rank r computes the
blocks of rank r+1's slice first, then r+2's, ..., its own last (FLUX's rank
swizzle), each sent to its owner's scratch as soon as it is computed; the
owner adds the N-1 arrivals to its own block and sends the sum to everyone
(a reduce-scatter then an all-gather, the first overlapped with the GEMM).

Compile and run on the CPU:
    gc3 compile gc3/algorithms/fused/gemm_allreduce.py -o gemm_ar.xml && gc3 simulate gemm_ar.xml
The interpreter has no gemm opcode (the GPU side drives cuBLAS per chunk): `gc3 run` refuses the IR.
"""
from gc3 import Check, GC3Program, chunk, gemm, int_args
from gc3.ir.collectives import GemmAllReduce
from gc3.topology import fully_connected


def gemm_allreduce(num_ranks: int = 4, m: int = 64, k_shard: int = 32, n: int = 32, chunks: int = 2,
                   fp32: int = 1) -> GC3Program:
    N, c = num_ranks, chunks
    coll = GemmAllReduce(N, N * c, m=m, k_shard=k_shard, n=n, dtype="bfloat16", accum="float32" if fp32 else "")

    def arrival(src, dst, i):       # where the owner dst keeps src's partial of its block i
        return ((src - dst) % N - 1) * c + i

    with GC3Program("gemm_allreduce", coll, topology=fully_connected(N)) as prog:
        for s in range(1, N + 1):               # peer r+s's slice at step s; s = N: the rank's own
            for i in range(c):
                for r in range(N):
                    p = (r + s) % N
                    part = gemm(r, "out", p * c + i)
                    if p != r:
                        part.copy(p, "scratch", arrival(r, p, i))
        for p in range(N):
            for i in range(c):
                total = chunk(p, "out", p * c + i)
                for q in range(N):
                    if q != p:
                        total = total.reduce(chunk(p, "scratch", arrival(q, p, i)))
                for q in range(N):
                    if q != p:
                        total.copy(q, "out", p * c + i)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return gemm_allreduce(*int_args(argv, ranks=4, m=64, k_shard=32, n=32, chunks=2, fp32=1))


if __name__ == "__main__":
    main()
