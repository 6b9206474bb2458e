"""Fused AllGather + GEMM (column-parallel linear with a sequence-parallel input, FLUX's AG+GEMM).

Parameters (positional ints, defaults in brackets): ranks N [4], m [64] (rows M
of the gathered A), k [32], n [32] (each rank's columns, N/ranks of the layer),
chunks C [2] (row blocks per rank's A; M must divide by N*C), return_a [0]
(1: the output also returns the gathered A, as runtime_cuda.fused.all_gather_gemm
with return_a=True).  bf16 inputs and output, fp32 accumulation, each value
rounded once.

Rank r holds A_r [M/N, K] (its input buffer) and b_r [K, n]; it ends with
concat_p(A_p) @ b_r [M, n] (gc3.collectives.AllGatherGemm; A and C row blocks
share one chunk grid of R*max(K, n) lanes, see gc3.ir.ComputeSpec agemm).

Schedule (rank-swizzled): at step s rank r multiplies the blocks of rank r+s,
its own first (they need no transfer); rank p sends its blocks to rank p-s at
step s, straight into scratch, and the GEMM of each block waits for that
block's arrival only, so the transfers of step s+1 run under the GEMMs of step s.
With return_a the blocks arrive straight into their place in the gathered A
(output chunks N*C.., after C's), which the GEMM then reads, so returning A
costs one local copy of the rank's own blocks and no scratch.

Compile and run on the CPU:
    gc3 compile gc3/algorithms/fused/allgather_gemm.py -o ag_gemm.xml && gc3 simulate ag_gemm.xml
The interpreter has no agemm opcode (the GPU side drives cuBLAS per chunk): `gc3 run` refuses the IR.
"""
from gc3 import Check, GC3Program, chunk, gemm, int_args
from gc3.ir.collectives import AllGatherGemm
from gc3.topology import fully_connected


def allgather_gemm(num_ranks: int = 4, m: int = 64, k: int = 32, n: int = 32, chunks: int = 2,
                   return_a: int = 0) -> GC3Program:
    N, c = num_ranks, chunks
    coll = AllGatherGemm(N, c, m=m, k=k, n=n, dtype="bfloat16", return_a=bool(return_a))
    with GC3Program("allgather_gemm", coll, topology=fully_connected(N)) as prog:
        for s in range(N):                      # rank r+s's blocks at step s; s = 0: the rank's own
            for i in range(c):
                for r in range(N):
                    p = (r + s) % N
                    if s == 0:
                        a = chunk(r, "in", i)
                    elif return_a:
                        a = chunk(p, "in", i).copy(r, "out", coll.c_chunks + p * c + i)
                    else:
                        a = chunk(p, "in", i).copy(r, "scratch", (s - 1) * c + i)
                    gemm(r, "out", p * c + i, a=a)
                    if s == 0 and return_a:     # after its GEMM: both only read the input
                        a.copy(r, "out", coll.c_chunks + r * c + i)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allgather_gemm(*int_args(argv, ranks=4, m=64, k=32, n=32, chunks=2, return_a=0))


if __name__ == "__main__":
    main()
