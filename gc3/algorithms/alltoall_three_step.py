"""Three-step AllToAll for N nodes x G GPUs with one network message per node pair, out of place.

Parameters: nodes N (argv[1], default 2), GPUs per node G (argv[2], default 4),
chunk factor C (argv[3], default 1).
Blocks between GPUs of one node go straight over NVLink.  All G*G blocks
that node n1 sends to node n2 are (1) gathered over NVLink on one GPU of n1,
(2) sent in one message to one GPU of n2, and (3) scattered over NVLink to
their destinations.  The pair (n1 -> n2) is carried by GPU n2 mod G of n1
and GPU n1 mod G of n2, so different node pairs use different NICs.
Intended sizes: small messages on many nodes, where even the two-step's
G messages per node pair are latency-bound.
Cost: 3 steps; N*(N-1) network messages of G*G*C chunks (G*G blocks) in all;
NVLink carries each remote block twice.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllToAll
from gc3.topology import hierarchical


def alltoall_three_step(nodes: int, gpus: int, chunk_factor: int = 1) -> GC3Program:
    N, G, c = nodes, gpus, chunk_factor
    pair_chunks = G * G * c                       # everything node n1 sends node n2

    def block(node, local):
        return (node * G + local) * c

    # Each leader GPU packs the node pairs it carries one after another in its
    # "gather" (sending side) and "scatter" (receiving side) buffers.
    packed = {}

    def region(rank, buffer, pair):
        key = (rank, buffer)
        slots = packed.setdefault(key, [])
        if pair not in slots:
            slots.append(pair)
        return slots.index(pair) * pair_chunks

    with GC3Program("alltoall_three_step", AllToAll(num_ranks=N * G, chunk_factor=c, inplace=False),
                    topology=hierarchical(N, G)) as prog:
        for n1 in range(N):
            for g1 in range(G):
                for n2 in range(N):
                    sender = (n1, n2 % G)
                    for g2 in range(G):
                        src = chunk((n1, g1), "in", block(n2, g2), c)
                        if n1 == n2:
                            src.copy((n2, g2), "out", block(n1, g1))
                        else:                     # 1. gather, ordered by destination GPU then source GPU
                            at = region(sender, "gather", (n1, n2)) + (g2 * G + g1) * c
                            src.copy(sender, "gather", at)
        for n1 in range(N):
            for n2 in range(N):
                if n1 == n2:
                    continue
                sender, receiver = (n1, n2 % G), (n2, n1 % G)
                sent = chunk(sender, "gather", region(sender, "gather", (n1, n2)), pair_chunks)
                got = sent.copy(receiver, "scatter", region(receiver, "scatter", (n1, n2)))   # 2. one message
                for g2 in range(G):               # 3. scatter: G contiguous blocks per destination GPU
                    part = chunk(receiver, "scatter", got.index + g2 * G * c, G * c)
                    part.copy((n2, g2), "out", block(n1, 0))
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return alltoall_three_step(*int_args(argv, nodes=2, gpus=4, chunk_factor=1))


if __name__ == "__main__":
    main()
