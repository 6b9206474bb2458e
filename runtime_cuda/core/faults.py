"""Known bugs, put back on purpose: `GC3_FAULT=name[,name...]` re-enables the
root causes of the drop-in's wrong results under stream reuse so that one can show the
differential fuzz (`gc3 fuzz`, runtime_cuda/commands/fuzz.py) catches each of them.  Never set
in production; an unknown name is an error, not a silent no-op."""
from __future__ import annotations

from typing import FrozenSet

from gc3 import settings

FAULTS = {
    "stream-reset": "set-up work (rendezvous, table uploads) enters its private stream with `with stream:`, "
                    "which on exit resets the caller's s.use() selection to the legacy default stream",
    "stream-order": "calls of one communicator on different streams are not ordered after each other",
    "nccl-bridge": "a gc3 call after a call routed to NCCL on another stream does not wait for it "
                   "(StreamOrder.bridge does nothing; the NCCL call marks no event either)",
    "pool-stream": "scratch and buffer tables are allocated under CuPy's current stream rather than the "
                   "call's, and replaced ones are freed at once while launches may still use them",
}


def _parse(value: str) -> FrozenSet[str]:
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = sorted(names - set(FAULTS))
    if unknown:
        raise ValueError(f"GC3_FAULT: unknown fault(s) {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    return names


_active: FrozenSet[str] = _parse(settings.get("GC3_FAULT"))


def active(name: str) -> bool:
    if name not in FAULTS:
        raise KeyError(name)
    return name in _active


def set_active(value: str) -> None:
    """For tests: replace the set of active faults (same syntax as GC3_FAULT)."""
    global _active
    _active = _parse(value)
