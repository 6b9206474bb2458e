"""Ring AllReduce, in place or out of place.

Parameters: ranks N (argv[1], default 4), instances (argv[2], default 1),
channels (argv[3], default 1), inplace (argv[4], 1 = in place, default 1).
Each rank's buffer is cut into N chunks; chunk r is reduced around the ring
starting after rank r (reduce-scatter), then the finished chunk is passed
around the ring again (all-gather).  With `channels` > 1 the buffer is cut
into N*channels chunks and each logical ring runs on its own channel.
Out of place, a rank adds its own input chunk into its output (one local
copy of 1/N of the buffer, which runs beside the ring's transfers) instead of
copying the whole input to the output first; the input is only read.
Intended sizes: medium to large messages (>= 1 MiB) on a single node.
Cost: 2(N-1) steps; each ring link carries 2(N-1)/N of the buffer.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllReduce
from gc3.topology import fully_connected


def allreduce_ring(num_ranks: int, instances: int = 1, channels: int = 1, inplace: bool = True) -> GC3Program:
    n = num_ranks
    def accumulator(q, i):
        """Where rank q adds its chunk i: its input in place; else its output, which the
        all-gather overwrites with the finished chunk anyway."""
        mine = chunk(q, "in", i)
        return mine if inplace else mine.copy(q, "out", i)

    last = "in" if inplace else "out"
    with GC3Program("allreduce_ring", AllReduce(num_ranks=n, chunk_factor=n * channels, inplace=inplace),
                    topology=fully_connected(n), instances=instances, protocol="Simple") as prog:
        for ch in range(channels):
            for r in range(n):
                i = ch * n + r
                c = chunk((r + 1) % n, "in", i)
                for step in range(1, n):
                    c = accumulator((r + 1 + step) % n, i).reduce(c, ch=ch)
                for step in range(n - 1):
                    c = c.copy((r + 1 + step) % n, last, i, ch=ch)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, instances, channels, inplace = int_args(argv, ranks=4, instances=1, channels=1, inplace=1)
    return allreduce_ring(ranks, instances, channels, bool(inplace))


if __name__ == "__main__":
    main()
