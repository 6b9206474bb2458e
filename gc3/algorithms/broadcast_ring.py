"""Pipelined ring Broadcast, out of place or in place.

Parameters: ranks N (argv[1], default 4), chunks C (argv[2], default 4),
root (argv[3], default 0), inplace (argv[4], 1 = in place, default 0).
The root's buffer is cut into C chunks; each chunk travels the ring root,
root+1, ..., root-1, each rank forwarding it from its output as soon as it
arrives, so C chunks are in flight on N-1 links at once.
Intended sizes: large messages (>= 1 MiB); more chunks fill the pipeline
sooner but add a per-message latency each.
Cost: N-1+C-1 chunk steps; each ring link carries the whole buffer once.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import Broadcast
from gc3.topology import fully_connected


def broadcast_ring(num_ranks: int, chunks: int = 4, root: int = 0, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunks
    with GC3Program("broadcast_ring", Broadcast(num_ranks=n, chunk_factor=c, inplace=inplace, root=root),
                    topology=fully_connected(n)) as prog:
        for j in range(c):
            piece = chunk(root, "in", j)
            piece.copy(root, "out", j)            # nothing to do in place
            for step in range(1, n):
                piece = piece.copy((root + step) % n, "out", j)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunks, root, inplace = int_args(argv, ranks=4, chunks=4, root=0, inplace=0)
    return broadcast_ring(ranks, chunks, root, bool(inplace))


if __name__ == "__main__":
    main()
