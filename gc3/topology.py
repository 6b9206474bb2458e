"""The topologies users import (`from gc3.topology import ring`); defined in gc3/dsl/topology.py."""
from .dsl.topology import Link, Topology, fully_connected, hierarchical, ring  # noqa: F401

__all__ = ["Link", "Topology", "fully_connected", "hierarchical", "ring"]
