"""Ring AllGather, out of place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1).
Each rank copies its input into its own output block, then every block
travels N-1 hops around the ring, each rank forwarding what it just got.
Intended sizes: medium to large messages on a single node.
Cost: N-1 steps; each ring link carries (N-1)/N of the output buffer.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllGather
from gc3.topology import fully_connected


def allgather_ring(num_ranks: int, chunk_factor: int = 1) -> GC3Program:
    n, cf = num_ranks, chunk_factor
    with GC3Program("allgather_ring", AllGather(num_ranks=n, chunk_factor=cf, inplace=False),
                    topology=fully_connected(n)) as prog:
        for r in range(n):
            c = chunk(r, "in", 0, count=cf).copy(r, "out", r * cf)
            for step in range(1, n):
                c = c.copy((r + step) % n, "out", r * cf)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allgather_ring(*int_args(argv, ranks=4, chunk_factor=1))


if __name__ == "__main__":
    main()
