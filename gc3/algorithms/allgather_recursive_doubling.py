"""Recursive doubling AllGather, out of place or in place; N a power of two.

Parameters: ranks N (argv[1], default 8; a power of two), chunk factor C
(argv[2], default 1), inplace (argv[3], 1 = in place, default 0).
Rank r starts with block r of the output.  In round k it exchanges all the
blocks it holds (2^k of them, contiguous) with rank r XOR 2^k, doubling
what it holds.
Intended sizes: small to medium messages (<= 1 MiB) where a ring's N-1
latencies dominate.
Cost: log2 N steps; each rank sends and receives (N-1)/N of the output,
1/N of it in the first round, 2/N in the second, ..., half in the last.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllGather
from gc3.errors import TraceError
from gc3.topology import fully_connected


def allgather_recursive_doubling(num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> GC3Program:
    n, c = num_ranks, chunk_factor
    if n < 2 or n & (n - 1):
        raise TraceError(f"allgather_recursive_doubling needs a power-of-two rank count >= 2, got {n}; "
                         f"use allgather_ring.py or allgather_direct.py for other counts")
    with GC3Program("allgather_recursive_doubling", AllGather(num_ranks=n, chunk_factor=c, inplace=inplace),
                    topology=fully_connected(n)) as prog:
        for r in range(n):
            chunk(r, "in", 0, c).copy(r, "out", r * c)
        held = 1                                 # blocks each rank holds, aligned to a multiple of `held`
        while held < n:
            for r in range(n):
                first = (r // held) * held
                # the first round sends from the input, so it need not wait for the local copy
                held_ref = chunk(r, "in", 0, c) if held == 1 else chunk(r, "out", first * c, held * c)
                held_ref.copy(r ^ held, "out", first * c)
            held *= 2
        Check()
    return prog


def main(argv=None) -> GC3Program:
    ranks, chunk_factor, inplace = int_args(argv, ranks=8, chunk_factor=1, inplace=0)
    return allgather_recursive_doubling(ranks, chunk_factor, bool(inplace))


if __name__ == "__main__":
    main()
