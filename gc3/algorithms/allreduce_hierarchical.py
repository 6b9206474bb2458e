"""Hierarchical AllReduce (GC3 paper, Figure 3), in place, with parallelize.

Parameters: nodes N (argv[1], default 2), GPUs per node G (argv[2], default 4).
Buffers hold N*G chunks; GPU g of every node owns chunks [g*N, (g+1)*N).
1. a ring reduce-scatter inside each node leaves node-sums of block g on GPU g;
2. GPUs with the same local index run a ring AllReduce across nodes on their
   block, one chunk per node;
3. a ring all-gather inside each node spreads the blocks.
Phases 1 and 3 use only intra-node links and run under `parallelize(N)`.
Intended sizes: large messages on several nodes (>= 16 MiB).
Cost: 2(G-1) intra-node + 2(N-1) inter-node steps; each intra-node ring link
carries 2(G-1)/G of the buffer, each GPU's inter-node link 2(N-1)/(N*G).
"""
from gc3 import Check, GC3Program, chunk, int_args, parallelize
from gc3.ir.collectives import AllReduce
from gc3.topology import hierarchical


def allreduce_hierarchical(nodes: int, gpus: int, instances: int = 1) -> GC3Program:
    N, G = nodes, gpus
    with GC3Program("allreduce_hierarchical", AllReduce(num_ranks=N * G, chunk_factor=N * G, inplace=True),
                    topology=hierarchical(N, G), instances=instances) as prog:
        with parallelize(N):                       # 1. intra-node reduce-scatter
            for n in range(N):
                for g in range(G):
                    c = chunk((n, (g + 1) % G), "in", g * N, count=N)
                    for step in range(1, G):
                        c = chunk((n, (g + 1 + step) % G), "in", g * N, count=N).reduce(c)
        for g in range(G):                         # 2. inter-node allreduce of block g
            for m in range(N):
                c = chunk(((m + 1) % N, g), "in", g * N + m)
                for step in range(1, N):
                    c = chunk(((m + 1 + step) % N, g), "in", g * N + m).reduce(c)
                for step in range(N - 1):
                    c = c.copy(((m + 1 + step) % N, g), "in", g * N + m)
        with parallelize(N):                       # 3. intra-node all-gather
            for n in range(N):
                for g in range(G):
                    c = chunk((n, g), "in", g * N, count=N)
                    for step in range(G - 1):
                        c = c.copy((n, (g + 1 + step) % G), "in", g * N)
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allreduce_hierarchical(*int_args(argv, nodes=2, gpus=4, instances=1))


if __name__ == "__main__":
    main()
