"""Binary-tree Broadcast, pipelined, out of place or in place.

Parameters: ranks N (argv[1], default 8), chunks C (argv[2], default 2),
root (argv[3], default 0), inplace (argv[4], 1 = in place, default 0).
Ranks are numbered v = (rank - root) mod N; rank v forwards each chunk to
v' = 2v+1 and 2v+2 as soon as it has it.
Intended sizes: small to medium messages on many ranks (depth log2 N
instead of the ring's N-1).
Cost: floor(log2 N) + C-1 chunk steps; each inner rank sends the buffer
twice (the root's two links carry it once each).
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import Broadcast
from gc3.topology import fully_connected


def broadcast_tree(num_ranks: int, chunks: int = 2, root: int = 0, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunks

    def rank(v):
        return (v + root) % n

    with GC3Program("broadcast_tree", Broadcast(num_ranks=n, chunk_factor=c, inplace=inplace, root=root),
                    topology=fully_connected(n)) as prog:
        for j in range(c):
            chunk(root, "in", j).copy(root, "out", j)       # nothing to do in place
            for v in range(n):                              # parents come before their children
                piece = chunk(rank(v), "in" if v == 0 else "out", j)
                for child in (2 * v + 1, 2 * v + 2):
                    if child < n:
                        piece.copy(rank(child), "out", j)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunks, root, inplace = int_args(argv, ranks=8, chunks=2, root=0, inplace=0)
    return broadcast_tree(ranks, chunks, root, bool(inplace))


if __name__ == "__main__":
    main()
