"""Recursive halving/doubling AllReduce (Rabenseifner), in place; N a power of two.

Parameters: ranks N (argv[1], default 8; a power of two).
The buffer is N chunks.  Reduce-scatter by recursive halving: in round k
rank r pairs with r XOR N/2^(k+1), keeps the half of its current range that
holds chunk r, and sends the other half for its partner to reduce.  After
log2 N rounds rank r holds the sum of chunk r; the all-gather retraces the
rounds in reverse, doubling the range each time.
Intended sizes: medium messages (64 KiB - 4 MiB) where a ring's 2(N-1)
latencies dominate but the buffer is too large to send whole.
Cost: 2 log2 N steps; each rank sends and receives 2(N-1)/N of the buffer,
half of it on the link of the first round, a quarter on the second, ...
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllReduce
from gc3.errors import TraceError
from gc3.topology import fully_connected


def allreduce_recursive_doubling(num_ranks: int) -> GC3Program:
    n = num_ranks
    if n < 2 or n & (n - 1):
        raise TraceError(f"allreduce_recursive_doubling needs a power-of-two rank count >= 2, got {n}; "
                         f"use allreduce_ring.py or allreduce_allpairs.py for other counts")
    rounds = n.bit_length() - 1
    lo, count = [0] * n, [n] * n          # the chunk range each rank is responsible for
    with GC3Program("allreduce_recursive_doubling", AllReduce(num_ranks=n, chunk_factor=n, inplace=True),
                    topology=fully_connected(n)) as prog:
        for k in range(rounds):           # reduce-scatter by recursive halving
            mask = n >> (k + 1)
            half = count[0] // 2
            keep = [lo[r] + (half if r & mask else 0) for r in range(n)]
            for r in range(n):
                p = r ^ mask
                # r's other half is exactly the half its partner keeps
                chunk(p, "in", keep[p], half).reduce(chunk(r, "in", keep[p], half))
            lo, count = keep, [half] * n
        for k in reversed(range(rounds)):  # all-gather by recursive doubling
            mask = n >> (k + 1)
            for r in range(n):
                chunk(r, "in", lo[r], count[r]).copy(r ^ mask, "in", lo[r])
            lo = [min(lo[r], lo[r ^ mask]) for r in range(n)]
            count = [2 * c for c in count]
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allreduce_recursive_doubling(*int_args(argv, ranks=8))


if __name__ == "__main__":
    main()
