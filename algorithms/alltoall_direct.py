"""Direct (all-pairs) AllToAll, out of place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1).
Rank r sends block j of its input straight to block r of rank j's output
(its own block by a local copy).
Intended sizes: any; best on a fully connected fabric (NVSwitch).
Cost: 1 step; each directed link carries 1/N of the input buffer.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.collectives import AllToAll
from gc3.topology import fully_connected


def alltoall_direct(num_ranks: int, chunk_factor: int = 1) -> GC3Program:
    n, cf = num_ranks, chunk_factor
    with GC3Program("alltoall_direct", AllToAll(num_ranks=n, chunk_factor=cf, inplace=False),
                    topology=fully_connected(n)) as prog:
        for r in range(n):
            for j in range(n):
                chunk(r, "in", j * cf, count=cf).copy(j, "out", r * cf)
        Check()
    return prog


if __name__ == "__main__":
    alltoall_direct(*int_args(ranks=4, chunk_factor=1))
