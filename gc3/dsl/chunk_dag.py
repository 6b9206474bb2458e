"""The Chunk DAG: what lowering compiles.

A `ChunkDAG` is a program's operations (its op nodes, in an order that
respects every dependency: the order they were added), the chunks that hold
input data when the collective starts (its source nodes), and the facts
lowering needs besides: the collective, the buffers the ops name, and the
program's settings.  Tracing builds one (`GC3Program.chunk_dag`), but so can
anyone with `ChunkDAG.add`, without the DSL: that is where producers other
than tracing attach, and lowering (`gc3.compiler.pipeline.lower`) reads
nothing else.

The dependency edges follow from the ops in order, per chunk, so they are not
stored but derived: `ChunkDAG.graph` gives them as a networkx DiGraph, built
only when asked (drawing, depth, tests), because networkx and the graph
together would cost lowering a quarter of its time and lowering needs them per
rank, which the edges do not say (see `gc3/compiler/instruction_dag.py`).

Graph nodes: every `Op.id` (attr `op`, kind="op") and one source node
("init", rank, buffer, index) per input chunk (kind="source").  Edges carry
`kind`:

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

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from ..errors import GC3Error, LoweringError
from ..ir.opcodes import COMPUTE, OPCODES
from ..ir.collectives import Collective
from .ops import Op, Slot

__all__ = ["ChunkDAG", "build_chunk_dag", "op_nodes", "depth", "draw"]

Node = Union[int, Tuple[str, int, str, int]]
_STRENGTH = {"true": 3, "war": 2, "waw": 1}


Key = Tuple[int, str, int]       # (rank, canonical buffer, index) of one chunk


@dataclass
class ChunkDAG:
    """A program as lowering reads it; build it with `add` (slots in canonical
    buffers, see `gc3/dsl/ops.py`)."""

    name: str
    collective: Collective
    instances: int = 1
    protocol: str = "Simple"
    instr_fusion: bool = True
    ops: List[Op] = field(default_factory=list)
    # Chunks holding input data at the start; None: every input chunk the
    # collective's precondition names, at its (in-place aliased) position.
    sources: Optional[List[Key]] = None
    # rank -> scratch buffer -> chunks, in the order the ops first wrote them
    scratch_sizes: Dict[int, Dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        coll = self.collective
        if self.sources is None:
            self.sources = [key for _, key in input_slots(coll)]
        for r in range(coll.num_ranks):
            self.scratch_sizes.setdefault(r, {})
        self._graph = None
        self._graph_ops = -1
        ops, self.ops = self.ops, []
        for op in ops:
            self.append(op)

    def add(self, kind: str, src: Slot, dst: Slot, **fields) -> Op:
        """A new op node after every other (so depending on any of them): dst <- src (copy) or
        dst <- dst (op) src (reduce); `fields` are `Op`'s optional ones (ch, sendtb, recvtb, parallel, ...)."""
        return self.append(Op(id=len(self.ops), kind=kind, src=src, dst=dst, **fields))

    def append(self, op: Op) -> Op:
        if op.id != len(self.ops):
            raise LoweringError(f"{self.name}: op {op.id} added as node {len(self.ops)}; "
                                f"an op's id is its position in the DAG's order")
        if op.dst.buffer not in ("i", "o"):
            sizes = self.scratch_sizes[op.dst.rank]
            sizes[op.dst.buffer] = max(sizes.get(op.dst.buffer, 0), op.dst.index + op.dst.count)
        self.ops.append(op)
        return op

    @property
    def graph(self):
        """The DAG with its dependency edges, as a networkx DiGraph (rebuilt after more ops)."""
        if self._graph_ops != len(self.ops):
            self._graph = build_chunk_dag(self.ops, self.sources)
            self._graph_ops = len(self.ops)
        return self._graph


def input_slots(coll: Collective):
    """(input index j, where input chunk j lies) for every chunk the collective's precondition fills."""
    for r in range(coll.num_ranks):
        for j in range(coll.input_size(r)):
            if coll.precondition(r, j):
                yield j, (r, *coll.alias(r, "i", j))


def _keys(slot: Slot) -> List[Key]:
    return [(slot.rank, slot.buffer, i) for i in slot.indices()]


def build_chunk_dag(ops: Sequence[Op], sources: Iterable[Key]):
    """The dependency graph of `ops` in order, given the chunks that hold input
    data (`sources`); a ChunkDAG's is `ChunkDAG.graph`."""
    import networkx as nx

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
        # A compute producer reads its operator's inputs (x, w; tables, ...), which no op writes: no chunk.
        reads = [] if op.kind in COMPUTE and not OPCODES[op.kind].local_in else \
            list(_keys(op.src)) + (list(_keys(op.dst)) if op.kind == "reduce" else [])
        for key in reads:
            if key in last_writer:     # else: a read of no data, which verification reports
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


def _nx(dag):
    return dag.graph if isinstance(dag, ChunkDAG) else dag


def op_nodes(dag) -> List[int]:
    dag = _nx(dag)
    return [n for n, k in dag.nodes(data="kind") if k == "op"]


def depth(dag) -> int:
    """Ops on the longest dependency chain (source nodes not counted)."""
    import networkx as nx

    dag = _nx(dag)
    longest: Dict[Node, int] = {}
    for n in nx.topological_sort(dag):
        here = 1 if dag.nodes[n].get("kind") == "op" else 0
        longest[n] = here + max((longest[p] for p in dag.predecessors(n)), default=0)
    return max(longest.values(), default=0)


MAX_DRAWN_NODES = 300
DRAWN_ROW_MIN, DRAWN_ROW_MAX = 16, 24    # nodes in one drawn row


def draw(dag, path) -> None:
    """Draw the DAG to an image file (format from the suffix), one row per dependency level."""
    import networkx as nx

    dag = _nx(dag)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if dag.number_of_nodes() > MAX_DRAWN_NODES:
        raise GC3Error(f"the chunk DAG has {dag.number_of_nodes()} nodes; drawing is limited to "
                       f"{MAX_DRAWN_NODES} (trace a smaller instance of the program)")
    levels = list(nx.topological_generations(dag))
    # A level wider than the operations' widest (the input chunks: ranks x chunks) is wrapped
    # into rows of that width, so the image keeps a readable aspect instead of one long row.
    ops_widest = max((sum(dag.nodes[n]["kind"] != "source" for n in nodes) for nodes in levels), default=1)
    per_row = min(max(ops_widest, DRAWN_ROW_MIN), DRAWN_ROW_MAX)
    rows = [nodes[k:k + per_row] for nodes in levels for k in range(0, len(nodes), per_row)]
    pos = {n: (i - (len(nodes) - 1) / 2, -row) for row, nodes in enumerate(rows) for i, n in enumerate(nodes)}
    labels = {}
    for n, data in dag.nodes(data=True):
        if data["kind"] == "source":
            labels[n] = f"in r{n[1]}\n{n[2]}{n[3]}"
        else:
            op = data["op"]
            labels[n] = f"{op.id} {dict(copy='cp', reduce='rd').get(op.kind, op.kind)}\n{op.src.rank}->{op.dst.rank}"
    widest = max((len(nodes) for nodes in rows), default=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * widest), min(max(4.0, 0.9 * len(rows)), 60.0)))
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
