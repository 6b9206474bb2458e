"""One-shot AllReduce, in place: every rank gathers every other rank's whole
buffer into scratch and reduces locally.

Parameters: ranks N (argv[1], default 4), chunks C (argv[2], default 1).
Each rank sends its C-chunk buffer to every peer's scratch (in C messages,
so that a later chunk's transfer overlaps an earlier chunk's reduction),
then reduces the N-1 received copies into its own buffer.
Intended sizes: tiny messages (<= 32 KiB) where one step of latency is all
that matters; traffic grows as N times the buffer.
Cost: 1 step; each directed link carries the whole buffer (every rank sends
and receives N-1 buffers).
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllReduce
from gc3.topology import fully_connected


def allreduce_oneshot(num_ranks: int, chunks: int = 1) -> GC3Program:
    n, c = num_ranks, chunks
    with GC3Program("allreduce_oneshot", AllReduce(num_ranks=n, chunk_factor=c, inplace=True),
                    topology=fully_connected(n)) as prog:
        for r in range(n):
            for k, peer in enumerate(p for p in range(n) if p != r):
                for j in range(c):
                    chunk(peer, "in", j).copy(r, "scratch", k * c + j)
        for r in range(n):
            for j in range(c):
                mine = chunk(r, "in", j)
                for k in range(n - 1):
                    mine = mine.reduce(chunk(r, "scratch", k * c + j))
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allreduce_oneshot(*int_args(argv, ranks=4, chunks=1))


if __name__ == "__main__":
    main()
