"""Which ranks may send to which: the links a traced program is allowed to use.

A `Topology` knows its rank count and answers `link(src, dst)`.  Links are
directed.  `links=None` means every ordered pair of distinct ranks is linked;
a rank is always "linked" to itself (a local copy or reduce needs no link).

`hierarchical(num_nodes, gpus_per_node)` links every pair of GPUs: the GPUs of
one node all-to-all (NVLink/NVSwitch) and any two GPUs of different nodes (the
network, which on the machines GC3 targets lets every GPU reach every remote
GPU through its own NIC).  What it adds over `fully_connected` is the node
structure: ranks and indices may be written `(node, local)`.

For a program that must respect a sparser fabric, build `ring(n)` or
`Topology(num_ranks, links=[(src, dst), ...])`; using a pair not listed raises
`TopologyError` at the offending `copy`/`reduce`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import FrozenSet, Iterable, Optional, Tuple

from ..errors import IndexOutOfRangeError, TopologyError, TraceError
from ..units import as_int, user_location

Link = Tuple[int, int]


@dataclass(frozen=True, init=False)
class Topology:
    name: str
    num_ranks: int
    links: Optional[FrozenSet[Link]]       # None: all pairs
    gpus_per_node: Optional[int]

    def __init__(self, num_ranks: int, links: Optional[Iterable[Link]] = None, *,
                 name: str = "custom", gpus_per_node: Optional[int] = None):
        num_ranks = as_int(num_ranks, "num_ranks", 1, error=TopologyError)
        if gpus_per_node is not None:
            gpus_per_node = as_int(gpus_per_node, "gpus_per_node", 1, error=TopologyError)
            if num_ranks % gpus_per_node:
                raise TopologyError(f"{user_location()}: topology {name!r}: {num_ranks} ranks do not split "
                                    f"into nodes of {gpus_per_node} GPUs")
        frozen = None
        if links is not None:
            frozen = frozenset((as_int(a, "link source", 0, error=TopologyError),
                                as_int(b, "link destination", 0, error=TopologyError)) for a, b in links)
            for a, b in frozen:
                if a >= num_ranks or b >= num_ranks:
                    raise TopologyError(f"{user_location()}: topology {name!r}: link ({a}, {b}) names a rank "
                                        f"outside [0, {num_ranks})")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "num_ranks", num_ranks)
        object.__setattr__(self, "links", frozen)
        object.__setattr__(self, "gpus_per_node", gpus_per_node)

    # msccl-tools spells this num_nodes(); programs ported from it call it.
    def num_nodes(self) -> int:
        return self.num_ranks

    @property
    def nodes(self) -> int:
        """Machines (nodes) in a hierarchical topology, 1 otherwise."""
        return self.num_ranks // self.gpus_per_node if self.gpus_per_node else 1

    def link(self, src: int, dst: int) -> bool:
        if src == dst:
            return True
        if self.links is None:
            return True
        return (src, dst) in self.links

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node if self.gpus_per_node else 0

    def flatten(self, value, what: str, where: str) -> int:
        """A rank or index written as int or as (node, local) -> int."""
        if not isinstance(value, tuple):
            number = _integer(value)
            if number is None:
                raise TraceError(f"{where}: {what} {value!r} must be an int or a (node, local) pair")
            return number
        if self.gpus_per_node is None:
            raise TraceError(f"{where}: {what} {value!r} is a (node, local) tuple but topology {self.name!r} "
                             f"is not hierarchical")
        parts = [_integer(v) for v in value]
        if len(parts) != 2 or None in parts:
            raise TraceError(f"{where}: {what} {value!r} must be a (node, local) pair of ints")
        node, local = parts
        if not 0 <= local < self.gpus_per_node:
            raise IndexOutOfRangeError(
                f"{where}: {what} {value!r}: local GPU {local} is outside [0, {self.gpus_per_node})")
        if node < 0 or (what == "rank" and node >= self.nodes):
            raise IndexOutOfRangeError(f"{where}: {what} {value!r}: node {node} is outside [0, {self.nodes})")
        return node * self.gpus_per_node + local


def _integer(value) -> Optional[int]:
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def fully_connected(num_ranks: int) -> Topology:
    return Topology(num_ranks, None, name=f"fully_connected({num_ranks})")


def hierarchical(num_nodes: int, gpus_per_node: int) -> Topology:
    num_nodes = as_int(num_nodes, "num_nodes", 1, error=TopologyError)
    gpus_per_node = as_int(gpus_per_node, "gpus_per_node", 1, error=TopologyError)
    return Topology(num_nodes * gpus_per_node, None, name=f"hierarchical({num_nodes}, {gpus_per_node})",
                    gpus_per_node=gpus_per_node)


def ring(num_ranks: int, bidirectional: bool = True) -> Topology:
    """Each rank linked to its successor (and predecessor when bidirectional)."""
    num_ranks = as_int(num_ranks, "num_ranks", 1, error=TopologyError)
    links = {(r, (r + 1) % num_ranks) for r in range(num_ranks)}
    if bidirectional:
        links |= {(b, a) for a, b in links}
    links = {(a, b) for a, b in links if a != b}
    return Topology(num_ranks, links, name=f"ring({num_ranks})")
