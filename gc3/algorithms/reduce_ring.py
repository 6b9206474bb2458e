"""Pipelined ring Reduce to a root, out of place or in place.

Parameters: ranks N (argv[1], default 4), chunks C (argv[2], default 4),
root (argv[3], default 0), inplace (argv[4], 1 = in place, default 0).
Each of the C chunks starts on rank root+1 and travels root+1, root+2, ...,
root, each rank adding its own chunk in scratch (so no user buffer but the
root's output is written), and the root adding its own into its output.
Intended sizes: large messages (>= 1 MiB); more chunks fill the pipeline
sooner but add a per-message latency each.
Cost: N-1+C-1 chunk steps; each ring link carries the whole buffer once.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import Reduce
from gc3.errors import TraceError
from gc3.topology import fully_connected


def reduce_ring(num_ranks: int, chunks: int = 4, root: int = 0, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunks
    if n < 2:
        raise TraceError(f"reduce_ring needs at least 2 ranks, got {n}")
    with GC3Program("reduce_ring", Reduce(num_ranks=n, chunk_factor=c, inplace=inplace, root=root),
                    topology=fully_connected(n)) as prog:
        for j in range(c):
            partial = chunk((root + 1) % n, "in", j)
            for step in range(2, n):
                r = (root + step) % n
                partial = chunk(r, "in", j).copy(r, "scratch", j).reduce(partial)
            chunk(root, "in", j).copy(root, "out", j).reduce(partial)   # the copy is a no-op in place
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunks, root, inplace = int_args(argv, ranks=4, chunks=4, root=0, inplace=0)
    return reduce_ring(ranks, chunks, root, bool(inplace))


if __name__ == "__main__":
    main()
