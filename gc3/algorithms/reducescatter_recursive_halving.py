"""Recursive halving ReduceScatter, out of place or in place; N a power of two.

Parameters: ranks N (argv[1], default 8; a power of two), chunk factor C
(argv[2], default 1), inplace (argv[3], 1 = in place, default 0).
In round k rank r pairs with r XOR N/2^(k+1), keeps the half of its current
range of blocks that holds block r, and sends the other half for its partner
to add to its own.  After log2 N rounds rank r holds the sum of block r.
Out of place the kept half is first copied into scratch, so the user's input
buffer is left as it was.
Intended sizes: small to medium messages (<= 4 MiB) where a ring's N-1
latencies dominate.
Cost: log2 N steps; each rank sends and receives (N-1)/N of the input, half
of it in the first round, a quarter in the second, ...
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import ReduceScatter
from gc3.errors import TraceError
from gc3.topology import fully_connected


def reducescatter_recursive_halving(num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunk_factor
    if n < 2 or n & (n - 1):
        raise TraceError(f"reducescatter_recursive_halving needs a power-of-two rank count >= 2, got {n}; "
                         f"use reducescatter_ring.py or reducescatter_direct.py for other counts")
    # (rank, first block of a range) -> (buffer, chunk index) of that rank's partial sum of the range
    where = {(r, b): ("in", b * c) for r in range(n) for b in range(n)}

    def partial(r, first, blocks):
        buf, index = where[(r, first)]
        return chunk(r, buf, index, blocks * c)

    def accumulator(r, first, blocks):
        """Rank r's partial sum of blocks [first, first+blocks), ready to be added to."""
        if blocks == 1:                                    # rank r's own block: sum into the output
            return partial(r, first, 1).copy(r, "out", 0)
        if inplace or where[(r, first)][0] != "in":
            return partial(r, first, blocks)
        for b in range(first, first + blocks):            # out of place: move to scratch first
            where[(r, b)] = ("scratch", (b - first) * c)
        return chunk(r, "in", first * c, blocks * c).copy(r, "scratch", 0)

    with GC3Program("reducescatter_recursive_halving",
                    ReduceScatter(num_ranks=n, chunk_factor=c, inplace=inplace),
                    topology=fully_connected(n)) as prog:
        lo, blocks = [0] * n, n
        mask = n // 2
        while mask:
            blocks //= 2
            keep = [lo[r] + (blocks if r & mask else 0) for r in range(n)]
            sent = [partial(r, keep[r ^ mask], blocks) for r in range(n)]   # r's other half
            for r in range(n):
                accumulator(r ^ mask, keep[r ^ mask], blocks).reduce(sent[r])
            lo, mask = keep, mask // 2
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunk_factor, inplace = int_args(argv, ranks=8, chunk_factor=1, inplace=0)
    return reducescatter_recursive_halving(ranks, chunk_factor, bool(inplace))


if __name__ == "__main__":
    main()
