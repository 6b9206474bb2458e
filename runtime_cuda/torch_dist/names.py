"""The torch-free decisions of the torch.distributed backend: what the
environment asks for, how a backend string is rewritten for GC3_TORCH=1, and
whether NCCL can stand behind gc3.  Kept apart from torch so the startup hook
and the CPU tests use them without importing torch."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple

from gc3 import settings

NAME = "gc3"


def enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """GC3_TORCH=1: backend="nccl" means gc3 (the startup hook patches init_process_group)."""
    return settings.get("GC3_TORCH", env)


def fallback_disabled(env: Optional[Mapping[str, str]] = None) -> bool:
    """GC3_TORCH_FALLBACK=0: calls gc3 cannot serve raise instead of going to NCCL."""
    return not settings.get("GC3_TORCH_FALLBACK", env)


def parse(backend: Optional[str]) -> Optional[dict]:
    """torch's backend string as {device: backend}; None for a single backend name
    ("nccl", "gloo") or none at all.  Raises ValueError naming the bad entry."""
    if backend is None or (":" not in str(backend) and "," not in str(backend)):
        return None
    pairs = {}
    for entry in str(backend).split(","):
        device, sep, name = entry.strip().partition(":")
        if not sep or not device.strip() or not name.strip():
            raise ValueError(f"backend string {backend!r}: entry {entry!r} is not DEVICE:BACKEND")
        device = device.strip().lower()
        if device in pairs:
            raise ValueError(f"backend string {backend!r}: device {device!r} is given twice")
        pairs[device] = name.strip().lower()
    return pairs


def swap_nccl(backend: Optional[str]) -> Optional[str]:
    """The backend string GC3_TORCH=1 turns `backend` into: NCCL's place goes to gc3,
    CPU tensors stay on gloo.  `None` (torch's default, which picks NCCL for CUDA)
    and "nccl" become "cpu:gloo,cuda:gc3"; in a DEVICE:BACKEND list every nccl
    becomes gc3; anything without NCCL is returned unchanged."""
    if backend is None or str(backend).strip().lower() in ("nccl", "undefined"):
        return f"cpu:gloo,cuda:{NAME}"
    pairs = parse(backend)
    if pairs is None or "nccl" not in pairs.values():
        return backend
    return ",".join(f"{device}:{NAME if name == 'nccl' else name}" for device, name in pairs.items())


def no_nccl_reason(places: Sequence[Tuple[str, str]], env: Optional[Mapping[str, str]] = None) -> str:
    """Why no NCCL communicator can stand behind gc3 ('' when one can).

    `places`: each rank's (host name, GPU PCI bus id), index = rank."""
    if fallback_disabled(env):
        return "GC3_TORCH_FALLBACK=0 switches the NCCL fallback off"
    first = {}
    for rank, place in enumerate(places):
        place = tuple(place)
        if place in first:
            return (f"ranks {first[place]} and {rank} share GPU {place[1]} on {place[0]}, "
                    "and NCCL refuses two ranks on one device")
        first[place] = rank
    return ""
