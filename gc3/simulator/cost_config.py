"""Alpha-beta parameters of the cost model, per machine preset.

UNCALIBRATED: these are rough figures from public specifications (NVLink 4
through NVSwitch: 450 GB/s per GPU and direction; HBM3 3.35 TB/s on H100,
HBM3e 4.8 TB/s on H200; NDR InfiniBand 400 Gb/s per GPU) and NCCL-like
per-hop latencies per protocol.  They have not been fitted to measurements
on the lent GPUs; every report prints "uncalibrated" while `calibrated` is
False.  To calibrate, time the runtime on a few sizes and replace the numbers
here (or pass a `CostConfig` to `simulate(cost=...)`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict

from ..errors import GC3Error

PROTOCOL_EFFICIENCY = {
    "Simple": 1.0,
    "LL128": 120 / 128,  # 8 flag bytes per 128-byte line
    "LL": 0.5,           # a 4-byte flag with every 4 data bytes
}


@dataclass(frozen=True)
class LinkParams:
    alpha_s: Dict[str, float]   # per-message latency by protocol, seconds
    port_Bps: float             # per-GPU, per-direction bandwidth of the link type
    tb_Bps: float               # what one threadblock can push over it


@dataclass(frozen=True)
class CostConfig:
    name: str
    links: Dict[str, LinkParams]
    gpus_per_node: int = 8
    intra_node: str = "nvlink"  # link type between GPUs of a node
    inter_node: str = "network"
    tb_mem_Bps: float = 200e9   # one threadblock's local copy/reduce rate
    step_overhead_s: float = 0.3e-6
    launch_s: float = 5e-6
    calibrated: bool = False
    extra: Dict[str, float] = field(default_factory=dict)

    def link_type(self, a: int, b: int) -> str:
        same = a // self.gpus_per_node == b // self.gpus_per_node
        return self.intra_node if same else self.inter_node


_NVLINK4 = LinkParams(alpha_s={"LL": 0.8e-6, "LL128": 1.5e-6, "Simple": 2.5e-6}, port_Bps=450e9, tb_Bps=25e9)
_PCIE5 = LinkParams(alpha_s={"LL": 1.5e-6, "LL128": 2.5e-6, "Simple": 4.0e-6}, port_Bps=50e9, tb_Bps=20e9)
_NDR_IB = LinkParams(alpha_s={"LL": 5.0e-6, "LL128": 6.0e-6, "Simple": 8.0e-6}, port_Bps=48e9, tb_Bps=20e9)

PRESETS: Dict[str, CostConfig] = {
    "h100": CostConfig(name="H100 SXM (NVLink4/NVSwitch, NDR IB)",
                       links={"nvlink": _NVLINK4, "pcie": _PCIE5, "network": _NDR_IB}, tb_mem_Bps=200e9),
    "h200": CostConfig(name="H200 SXM (NVLink4/NVSwitch, NDR IB)",
                       links={"nvlink": _NVLINK4, "pcie": _PCIE5, "network": _NDR_IB}, tb_mem_Bps=250e9),
}
DEFAULT = "h100"


def preset(name: str = DEFAULT, **overrides) -> CostConfig:
    if name not in PRESETS:
        raise GC3Error(f"unknown cost preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides) if overrides else PRESETS[name]
