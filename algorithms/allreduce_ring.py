"""Ring AllReduce, in place.

Parameters: ranks N (argv[1], default 4), instances (argv[2], default 1),
channels (argv[3], default 1).
Each rank's buffer is cut into N chunks; chunk r is reduced around the ring
starting after rank r (reduce-scatter), then the finished chunk is passed
around the ring again (all-gather).  With `channels` > 1 the buffer is cut
into N*channels chunks and each logical ring runs on its own channel.
Intended sizes: medium to large messages (>= 1 MiB) on a single node.
Cost: 2(N-1) steps; each ring link carries 2(N-1)/N of the buffer.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.collectives import AllReduce
from gc3.topology import fully_connected


def allreduce_ring(num_ranks: int, instances: int = 1, channels: int = 1) -> GC3Program:
    n = num_ranks
    with GC3Program("allreduce_ring", AllReduce(num_ranks=n, chunk_factor=n * channels, inplace=True),
                    topology=fully_connected(n), instances=instances, protocol="Simple") as prog:
        for ch in range(channels):
            for r in range(n):
                i = ch * n + r
                c = chunk((r + 1) % n, "in", i)
                for step in range(1, n):
                    c = chunk((r + 1 + step) % n, "in", i).reduce(c, ch=ch)
                for step in range(n - 1):
                    c = c.copy((r + 1 + step) % n, "in", i, ch=ch)
        Check()
    return prog


if __name__ == "__main__":
    allreduce_ring(*int_args(ranks=4, instances=1, channels=1))
