"""Fused embedding-bag + AllToAll (DLRM table-wise sharding, TorchRec's PooledEmbeddingsAllToAll).

Parameters (positional ints, defaults in brackets): ranks N [4], tables T [2]
(per rank), rows [64] (per table), dim [16], batch b [4] (samples per rank; the
global batch is B = N*b), pooling [4] (indices per bag on average; bags vary,
some are empty), chunks C [2] (sample blocks per rank slice; b must divide by
C), bf16 [0] (1: bf16 tables and output; 0: fp32), compute TBs S [0] (0: each
block is computed by the TB that sends it; S > 0: block k by a compute TB of its
own, k mod S, so that S thread blocks per rank pool at once); keyword dtype [None]
names the type instead (e.g. "float16").  fp32 accumulation; sum pooling.  Small defaults keep CI fast.

Rank r holds T tables [rows, dim] and, for all B samples, indices [T, B*pooling]
and offsets [T, B+1] (int32).  It pools its tables for the whole global batch
and sends rank p the rows of p's samples.  Rank p's output buffer is
[N, b, T*dim]: for each rank r in order, p's b samples, each with r's T pooled
vectors in table order (gc3.collectives.EmbeddingBagAllToAll);
TorchRec's [b, N*T*dim] is out.reshape(N, b, T*dim).transpose(1, 0, 2).

Schedule: block by block (sample block i of every rank's slice), each rank
computes the block of each peer p into scratch and sends it at once, so the
first send waits for its own block only; the rank's own block is computed
straight into its output (no copy).

Compile and run on the CPU:
    gc3 compile gc3/algorithms/fused/embedding_bag_alltoall.py -o ebag_a2a.xml && gc3 simulate ebag_a2a.xml
On a GPU, runtime_cuda.fused.embedding_bag_alltoall runs it with the caller's tables, indices and offsets.
"""
from gc3 import Check, GC3Program, embedding_bag, int_args
from gc3.ir.collectives import EmbeddingBagAllToAll
from gc3.topology import fully_connected


def embedding_bag_alltoall(num_ranks: int = 4, tables: int = 2, rows: int = 64, dim: int = 16, batch: int = 4,
                           pooling: int = 4, chunks: int = 2, bf16: int = 0, compute_tbs: int = 0,
                           dtype: str = None) -> GC3Program:
    n, c = num_ranks, chunks
    coll = EmbeddingBagAllToAll(n, c, tables=tables, rows=rows, dim=dim, batch=batch, pooling=pooling,
                                dtype=dtype or ("bfloat16" if bf16 else "float32"))
    with GC3Program("embedding_bag_alltoall", coll, topology=fully_connected(n)) as prog:
        for i in range(c):
            for r in range(n):
                for p in range(n):
                    k = p * c + i               # rank r's block of p's samples: p's output chunk r*c + i
                    tb = k % compute_tbs if compute_tbs else None
                    if p == r:
                        embedding_bag(r, "out", r * c + i, rows=k, sendtb=tb)
                    else:
                        embedding_bag(r, "scratch", k, rows=k, sendtb=tb).copy(p, "out", r * c + i)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return embedding_bag_alltoall(*int_args(argv, ranks=4, tables=2, rows=64, dim=16, batch=4, pooling=4, chunks=2,
                                            bf16=0, compute_tbs=0))


if __name__ == "__main__":
    main()
