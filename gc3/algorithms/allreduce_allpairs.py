"""All-pairs AllReduce, in place: a direct reduce-scatter, then a direct all-gather.

Parameters: ranks N (argv[1], default 4), chunks per block C (argv[2], default 1).
The buffer is N blocks of C chunks; rank j owns block j.  Every rank sends
block j to rank j's scratch in one message, rank j reduces the N-1 copies
into its own, then sends the finished block to every other rank.
Intended sizes: small messages (<= 256 KiB) on a fully connected node, where
two steps beat the 2(N-1) of a ring.
Cost: 2 steps; each directed link carries 2/N of the buffer (every rank sends
and receives 2(N-1)/N of it).
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllReduce
from gc3.topology import fully_connected


def allreduce_allpairs(num_ranks: int, chunks: int = 1) -> GC3Program:
    n, c = num_ranks, chunks
    with GC3Program("allreduce_allpairs", AllReduce(num_ranks=n, chunk_factor=n * c, inplace=True),
                    topology=fully_connected(n)) as prog:
        for owner in range(n):                  # 1. block `owner` goes to its owner's scratch
            for k, r in enumerate(p for p in range(n) if p != owner):
                chunk(r, "in", owner * c, c).copy(owner, "scratch", k * c)
        for owner in range(n):                  #    where it is reduced locally
            mine = chunk(owner, "in", owner * c, c)
            for k in range(n - 1):
                mine = mine.reduce(chunk(owner, "scratch", k * c, c))
        for owner in range(n):                  # 2. the finished block goes to everyone
            done = chunk(owner, "in", owner * c, c)
            for r in range(n):
                if r != owner:
                    done.copy(r, "in", owner * c)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allreduce_allpairs(*int_args(argv, ranks=4, chunks=1))


if __name__ == "__main__":
    main()
