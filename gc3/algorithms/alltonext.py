"""AllToNext for N nodes x G GPUs (GC3 paper, section 7.4), out of place.

Parameters: nodes N (argv[1], default 2), GPUs per node G (argv[2], default 4),
chunks per GPU C (argv[3], default 1).
Rank i sends its buffer to rank i+1.  Inside a node that is one NVLink copy.
Across nodes a single GPU pair would leave the other G-1 NICs idle, so the
last GPU of node n splits its buffer into G parts: part g goes over NVLink
to GPU (n, g), over that GPU's own network link to (n+1, g), and over
NVLink to (n+1, 0).
Intended sizes: large messages (>= 1 MiB) in pipelines across nodes, where
the network hop dominates.
Cost: intra-node 1 step; cross-node 3 steps in which each of the G network
links carries 1/G of the buffer.
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllToNext
from gc3.errors import TraceError
from gc3.topology import hierarchical


def alltonext(nodes: int, gpus: int, chunks: int = 1) -> GC3Program:
    N, G, c = nodes, gpus, chunks
    if N * G < 2:
        raise TraceError(f"alltonext needs at least 2 ranks, got {N} node(s) x {G} GPU(s)")
    with GC3Program("alltonext", AllToNext(num_ranks=N * G, chunk_factor=G * c, inplace=False),
                    topology=hierarchical(N, G)) as prog:
        for n in range(N):
            for g in range(G - 1):                # inside the node: one direct copy
                chunk((n, g), "in", 0, G * c).copy((n, g + 1), "out", 0)
            if n == N - 1:
                continue
            for g in range(G):                    # across nodes: part g crosses on GPU g's link
                part = chunk((n, G - 1), "in", g * c, c)
                if g != G - 1:
                    part = part.copy((n, g), "relay_out", 0)
                if g != 0:
                    part = part.copy((n + 1, g), "relay_in", 0)
                part.copy((n + 1, 0), "out", g * c)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return alltonext(*int_args(argv, nodes=2, gpus=4, chunks=1))


if __name__ == "__main__":
    main()
