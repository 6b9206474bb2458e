"""Direct (all-pairs) AllGather, out of place or in place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1),
inplace (argv[3], 1 = in place, default 0).
Every rank sends its C-chunk input straight into block r of every other
rank's output, and copies it into its own block (nothing to do in place).
Intended sizes: small to medium messages (<= 1 MiB) on a fully connected node.
Cost: 1 step; each directed link carries 1/N of the output buffer (every
rank sends and receives (N-1)/N of it).
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllGather
from gc3.topology import fully_connected


def allgather_direct(num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunk_factor
    with GC3Program("allgather_direct", AllGather(num_ranks=n, chunk_factor=c, inplace=inplace),
                    topology=fully_connected(n)) as prog:
        for r in range(n):
            mine = chunk(r, "in", 0, c)
            for step in range(n):             # own block first, then peers r+1, r+2, ...
                mine.copy((r + step) % n, "out", r * c)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunk_factor, inplace = int_args(argv, ranks=4, chunk_factor=1, inplace=0)
    return allgather_direct(ranks, chunk_factor, bool(inplace))


if __name__ == "__main__":
    main()
