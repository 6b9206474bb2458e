"""Ring ReduceScatter, out of place or in place.

Parameters: ranks N (argv[1], default 4), chunk factor C (argv[2], default 1),
inplace (argv[3], 1 = in place, default 0).
Block b of the input starts on rank b+1 and travels the ring b+1, b+2, ...,
b, each rank adding its own block b, so the sum ends on rank b.  Out of
place, a rank first copies its block into scratch and accumulates there, so
the user's input buffer is left as it was.
Intended sizes: medium to large messages (>= 1 MiB) on a single node.
Cost: N-1 steps; each ring link carries (N-1)/N of the input buffer.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import ReduceScatter
from gc3.errors import TraceError
from gc3.topology import fully_connected


def reducescatter_ring(num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunk_factor
    if n < 2:
        raise TraceError(f"reducescatter_ring needs at least 2 ranks, got {n}")

    def accumulator(r, b):
        """Where rank r adds its block b to the partial sum it receives."""
        mine = chunk(r, "in", b * c, c)
        if r == b:
            return mine.copy(r, "out", 0)            # the last hop sums straight into the output
        if inplace:
            return mine
        return mine.copy(r, "scratch", ((b - r) % n - 1) * c)

    with GC3Program("reducescatter_ring", ReduceScatter(num_ranks=n, chunk_factor=c, inplace=inplace),
                    topology=fully_connected(n)) as prog:
        for b in range(n):
            partial = chunk((b + 1) % n, "in", b * c, c)
            for step in range(2, n + 1):
                partial = accumulator((b + step) % n, b).reduce(partial)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunk_factor, inplace = int_args(argv, ranks=4, chunk_factor=1, inplace=0)
    return reducescatter_ring(ranks, chunk_factor, bool(inplace))


if __name__ == "__main__":
    main()
