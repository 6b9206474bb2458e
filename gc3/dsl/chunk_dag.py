"""The Chunk DAG: traced operations linked by the dependencies between them.

Nodes: every `Op.id` (attr `op`, kind="op") and one source node
("init", rank, buffer, index) per chunk that holds input data when the
collective starts (kind="source").  Edges carry `kind`:

* "true":  the op reads a chunk the other node wrote (a reduce reads its
  destination too);
* "war":   the op overwrites a chunk an earlier op read (write after read);
* "waw":   the op overwrites a chunk an earlier op wrote that no op read in
  between (write after write).

Dependencies are tracked per chunk, so an op moving `count` chunks may depend
on several nodes.  When two nodes are linked for several reasons, the edge
keeps the strongest: true over war over waw.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence, Set, Tuple, Union

import networkx as nx

from ..errors import GC3Error
from .ops import Op, Slot

Node = Union[int, Tuple[str, int, str, int]]
_STRENGTH = {"true": 3, "war": 2, "waw": 1}


Key = Tuple[int, str, int]       # (rank, canonical buffer, index) of one chunk


def _keys(slot: Slot) -> List[Key]:
    return [(slot.rank, slot.buffer, i) for i in slot.indices()]


def build_chunk_dag(ops: Sequence[Op], sources: Iterable[Key]) -> nx.DiGraph:
    """The Chunk DAG of traced `ops`, given the chunks that hold input data
    (`sources`); a traced program's is `GC3Program.chunk_dag`."""
    dag = nx.DiGraph()
    last_writer: Dict[Tuple[int, str, int], Node] = {}
    readers: Dict[Tuple[int, str, int], Set[int]] = {}
    for rank, buf, idx in sources:
        node = ("init", rank, buf, idx)
        dag.add_node(node, kind="source")
        last_writer[(rank, buf, idx)] = node

    def link(a: Node, b: int, kind: str) -> None:
        if a == b:
            return
        old = dag.edges[a, b]["kind"] if dag.has_edge(a, b) else None
        if old is None or _STRENGTH[kind] > _STRENGTH[old]:
            dag.add_edge(a, b, kind=kind)

    for op in ops:
        dag.add_node(op.id, kind="op", op=op)
        reads = list(_keys(op.src)) + (list(_keys(op.dst)) if op.kind == "reduce" else [])
        for key in reads:
            link(last_writer[key], op.id, "true")
        for key in _keys(op.dst):
            for reader in readers.get(key, ()):
                link(reader, op.id, "war")
            prev = last_writer.get(key)
            if isinstance(prev, int) and not readers.get(key):
                link(prev, op.id, "waw")
        for key in reads:
            readers.setdefault(key, set()).add(op.id)
        for key in _keys(op.dst):
            last_writer[key] = op.id
            # The write itself is this op's read of dst (reduce) or none (copy).
            readers[key] = set()
    return dag


def op_nodes(dag: nx.DiGraph) -> List[int]:
    return [n for n, k in dag.nodes(data="kind") if k == "op"]


def depth(dag: nx.DiGraph) -> int:
    """Ops on the longest dependency chain (source nodes not counted)."""
    longest: Dict[Node, int] = {}
    for n in nx.topological_sort(dag):
        here = 1 if dag.nodes[n].get("kind") == "op" else 0
        longest[n] = here + max((longest[p] for p in dag.predecessors(n)), default=0)
    return max(longest.values(), default=0)


MAX_DRAWN_NODES = 300


def draw(dag: nx.DiGraph, path) -> None:
    """Draw the DAG to an image file (format from the suffix), one row per dependency level."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if dag.number_of_nodes() > MAX_DRAWN_NODES:
        raise GC3Error(f"the chunk DAG has {dag.number_of_nodes()} nodes; drawing is limited to "
                       f"{MAX_DRAWN_NODES} (trace a smaller instance of the program)")
    levels = list(nx.topological_generations(dag))
    pos = {n: (i - (len(nodes) - 1) / 2, -row) for row, nodes in enumerate(levels) for i, n in enumerate(nodes)}
    labels = {}
    for n, data in dag.nodes(data=True):
        if data["kind"] == "source":
            labels[n] = f"in r{n[1]}\n{n[2]}{n[3]}"
        else:
            op = data["op"]
            labels[n] = f"{op.id} {'cp' if op.kind == 'copy' else 'rd'}\n{op.src.rank}->{op.dst.rank}"
    widest = max((len(nodes) for nodes in levels), default=1)
    fig, ax = plt.subplots(figsize=(min(max(6.0, 0.9 * widest), 60.0), min(max(4.0, 0.9 * len(levels)), 60.0)))
    styles = {"true": ("black", "solid"), "war": ("tab:red", "dashed"), "waw": ("tab:orange", "dotted")}
    for kind, (color, style) in styles.items():
        edges = [(a, b) for a, b, k in dag.edges(data="kind") if k == kind]
        # False dependencies curve so they stay visible beside a true edge through the same column.
        nx.draw_networkx_edges(dag, pos, edgelist=edges, edge_color=color, style=style, ax=ax, arrows=True,
                               connectionstyle="arc3" if kind == "true" else "arc3,rad=0.3")
    node_colors = ["lightgray" if dag.nodes[n]["kind"] == "source" else
                   ("tab:blue" if dag.nodes[n]["op"].remote else "tab:green") for n in dag.nodes]
    nx.draw_networkx_nodes(dag, pos, node_color=node_colors, node_size=700, ax=ax, alpha=0.6)
    nx.draw_networkx_labels(dag, pos, labels, font_size=6, ax=ax)
    handles = [Line2D([], [], color=c, linestyle=s, label=k) for k, (c, s) in styles.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=7)
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
