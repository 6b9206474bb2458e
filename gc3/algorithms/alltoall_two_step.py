"""Two-step AllToAll for N nodes x G GPUs (GC3 paper, Figure 8), out of place.

Parameters: nodes N (argv[1], default 2), GPUs per node G (argv[2], default 4),
chunk factor C (argv[3], default 1).
Blocks for GPUs of the same node go straight to them over NVLink.  A block
for GPU (n2, g2) on another node first goes to the local GPU (n1, g2), which
gathers, per remote node, the G blocks of its node's GPUs contiguously in
scratch; then one coalesced send per (node pair, local index) crosses the
network to (n2, g2), landing contiguously in its output.
Intended sizes: small to medium messages on several nodes, where the N*G*(N-1)*G
small network messages of a direct AllToAll are latency-bound.
Cost: 2 steps; each GPU's network link carries (N-1)/N of the buffer in N-1
messages (instead of (N-1)*G); NVLink carries (G-1)/G of the remote part
plus the local part.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllToAll
from gc3.topology import hierarchical


def alltoall_two_step(nodes: int, gpus: int, chunk_factor: int = 1) -> GC3Program:
    N, G, c = nodes, gpus, chunk_factor

    def block(node, local):
        return (node * G + local) * c

    def staged(n1, n2, g1):
        """Scratch index on (n1, g2) of the block GPU (n1, g1) sends to node n2 (blocks grouped by n2)."""
        return (((n2 - n1 - 1) % N) * G + g1) * c

    with GC3Program("alltoall_two_step", AllToAll(num_ranks=N * G, chunk_factor=c, inplace=False),
                    topology=hierarchical(N, G)) as prog:
        for n1 in range(N):
            for g1 in range(G):
                for n2 in range(N):
                    for g2 in range(G):
                        src = chunk((n1, g1), "in", block(n2, g2), c)
                        if n1 == n2:
                            src.copy((n2, g2), "out", block(n1, g1))
                        else:
                            src.copy((n1, g2), "scratch", staged(n1, n2, g1))
        for n1 in range(N):                      # one coalesced network send per node pair and GPU
            for g2 in range(G):
                for n2 in range(N):
                    if n2 != n1:
                        chunk((n1, g2), "scratch", staged(n1, n2, 0), G * c).copy((n2, g2), "out", block(n1, 0))
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return alltoall_two_step(*int_args(argv, nodes=2, gpus=4, chunk_factor=1))


if __name__ == "__main__":
    main()
