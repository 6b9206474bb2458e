"""Direct (all-pairs) AllToAll, out of place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1).
Rank r sends block j of its input straight to block r of rank j's output
(its own block by a local copy).
Intended sizes: any; best on a fully connected fabric (NVSwitch).
Cost: 1 step; each directed link carries 1/N of the input buffer.
"""
import sys

from gc3 import Check, GC3Program, chunk
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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if len(argv) > 0 else 4
    cf = int(argv[1]) if len(argv) > 1 else 1
    return alltoall_direct(n, cf)


if __name__ == "__main__":
    main()
