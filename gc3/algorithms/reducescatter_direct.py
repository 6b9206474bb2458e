"""Direct (all-pairs) ReduceScatter, out of place or in place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1),
inplace (argv[3], 1 = in place, default 0).
Every rank sends block j of its input to rank j's scratch in one message;
rank j then reduces the N-1 received blocks and its own into its output.
Intended sizes: small to medium messages (<= 1 MiB) on a fully connected node.
Cost: 1 step; each directed link carries 1/N of the input buffer (every rank
sends and receives (N-1)/N of it).
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import ReduceScatter
from gc3.topology import fully_connected


def reducescatter_direct(num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunk_factor
    with GC3Program("reducescatter_direct", ReduceScatter(num_ranks=n, chunk_factor=c, inplace=inplace),
                    topology=fully_connected(n)) as prog:
        for owner in range(n):
            for k, r in enumerate(p for p in range(n) if p != owner):
                chunk(r, "in", owner * c, c).copy(owner, "scratch", k * c)
        for owner in range(n):
            total = chunk(owner, "in", owner * c, c).copy(owner, "out", 0)   # nothing to do in place
            for k in range(n - 1):
                total = total.reduce(chunk(owner, "scratch", k * c, c))
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunk_factor, inplace = int_args(argv, ranks=4, chunk_factor=1, inplace=0)
    return reducescatter_direct(ranks, chunk_factor, bool(inplace))


if __name__ == "__main__":
    main()
