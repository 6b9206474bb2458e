"""Direct (all-pairs) AllToAll, out of place or in place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1),
inplace (argv[3], 1 = in place, default 0).
Out of place, rank r sends block j of its input straight to block r of rank
j's output (its own block by a local copy).  In place, block r of rank j is
both what j still has to send to r and where r's block lands, so the blocks
arrive in rank j's scratch and are copied into place once everything has
arrived (the own block stays where it is).
Intended sizes: any; best on a fully connected fabric (NVSwitch).
Cost: 1 step; each directed link carries 1/N of the input buffer; in place,
one local copy of (N-1)/N of the buffer more.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllToAll
from gc3.topology import fully_connected


def alltoall_direct(num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> GC3Program:
    n, cf = num_ranks, chunk_factor
    with GC3Program("alltoall_direct", AllToAll(num_ranks=n, chunk_factor=cf, inplace=inplace),
                    topology=fully_connected(n)) as prog:
        landing = "scratch" if inplace else "out"
        for r in range(n):
            for j in range(n):
                if not (inplace and j == r):
                    chunk(r, "in", j * cf, count=cf).copy(j, landing, r * cf)
        if inplace:
            for j in range(n):
                for r in range(n):
                    if r != j:
                        chunk(j, "scratch", r * cf, count=cf).copy(j, "out", r * cf)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunk_factor, inplace = int_args(argv, ranks=4, chunk_factor=1, inplace=0)
    return alltoall_direct(ranks, chunk_factor, bool(inplace))


if __name__ == "__main__":
    main()
