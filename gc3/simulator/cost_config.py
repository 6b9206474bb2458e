"""Parameters of the cost model, per machine preset.

`h200`: the NVLink figures are fitted to the CUDA runtime measured on
nvidia-h200-x2 (2x H200, NV18) by `gc3 calibrate`, which
rewrites the block between the CALIBRATED markers below; the points it fits
are gc3/simulator/measured_h200x2.csv.  `h100`: the same fit with the local
memory rates scaled by HBM bandwidth (H100 3.35 TB/s, H200 4.8 TB/s) -- the
link is the same NVLink 4 and the SM count the same, but it was never
measured, so it stays uncalibrated.  PCIe and network links are spec figures
(PCIe 5 x16, NDR InfiniBand 400 Gb/s per GPU), uncalibrated in every preset;
a prediction is reported as calibrated only when every link it used is.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Tuple

from .. import limits
from ..errors import GC3Error

# Payload fraction of the bytes on the wire: an LL line carries a 4-byte flag
# with every 4 data bytes, LL128 8 flag bytes per 128-byte line.
PROTOCOL_EFFICIENCY = {"Simple": 1.0, "LL128": limits.LL128_LINE_DATA_BYTES / limits.LL128_LINE_BYTES, "LL": 0.5}

# Data bytes one FIFO slot holds (gc3.limits.SLOT_BYTES, as the runtime sizes
# them).  A chunk moves in tiles of at most this many bytes, and each (step,
# tile) is one unit of work: a threadblock walks, per tile, all of its steps.
SLOT_DATA_BYTES = {p: limits.slot_data_bytes(p, n) for p, n in limits.SLOT_BYTES.items()}


@dataclass(frozen=True)
class LinkParams:
    alpha_s: Dict[str, float]   # one hop: data stored by the sender -> seen by the receiver, by protocol
    tb_Bps: Dict[str, float]    # payload one threadblock moves over the link, by protocol
    port_Bps: float             # wire bytes per GPU and direction, shared by all its threadblocks
    calibrated: bool = False
    # Protocols whose figures were not measured on this link even though it is
    # calibrated, and where they come from (a prediction using one is not calibrated).
    derived: Dict[str, str] = field(default_factory=dict)


# LL128 relative to LL and Simple, from NCCL's own tuning tables (src/graph/tuning.cc,
# read for its facts): a ring hop over NVLink costs about 0.6 us with LL, 1.9 us with
# LL128 and 3.4 us with Simple, and LL128's bus bandwidth is modelled as Simple's times
# about 120/128, the data share of a 128-byte line.  So where only LL and Simple were
# measured, LL128's hop latency is Simple's scaled by NCCL's LL128/Simple ratio (never
# below LL's), and a threadblock moves Simple's bytes of which 120 in 128 are data.
NCCL_NVLINK_RING_HOP_US = {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}
LL128_FROM = ("LL128 derived from the measured LL and Simple (NCCL's hop-latency ratio "
              f"{NCCL_NVLINK_RING_HOP_US['LL128']}/{NCCL_NVLINK_RING_HOP_US['Simple']}, "
              f"{limits.LL128_LINE_DATA_BYTES}/{limits.LL128_LINE_BYTES} of Simple's rate); not measured")


def with_ll128(link: LinkParams) -> LinkParams:
    """`link` with its LL128 figures derived from its LL and Simple ones (see above),
    unless it has measured ones."""
    if "LL128" in link.alpha_s and "LL128" in link.tb_Bps:
        return link
    ratio = NCCL_NVLINK_RING_HOP_US["LL128"] / NCCL_NVLINK_RING_HOP_US["Simple"]
    alpha = max(link.alpha_s["Simple"] * ratio, link.alpha_s["LL"])
    rate = link.tb_Bps["Simple"] * PROTOCOL_EFFICIENCY["LL128"]
    return replace(link, alpha_s=dict(link.alpha_s, LL128=alpha), tb_Bps=dict(link.tb_Bps, LL128=rate),
                   derived=dict(link.derived, LL128=LL128_FROM))


@dataclass(frozen=True)
class CostConfig:
    name: str
    links: Dict[str, LinkParams]
    gpus_per_node: int = 8
    intra_node: str = "nvlink"      # link type between GPUs of a node
    inter_node: str = "network"
    launch_s: float = 5e-6          # per call: launch, prologue, teardown
    step_overhead_s: float = 0.3e-6  # per step and tile: barrier, flag polls
    dep_s: float = 0.5e-6           # a cross-threadblock dependency: flag store -> seen by the waiter
    tb_mem_Bps: float = 200e9       # one threadblock's local copy rate (r out of the FIFO, cpy)
    tb_reduce_Bps: float = 150e9    # one threadblock's reduction rate (rrc, re; added to rrs/rrcs)
    slot_data_bytes: Dict[str, int] = field(default_factory=lambda: dict(SLOT_DATA_BYTES))
    tile_split: Tuple[int, int] = (1, 0)  # (tiles, min bytes): runtime's GC3_TILE_SPLIT_<PROTO>
    calibrated: bool = False
    calibration: str = "spec figures"     # where the numbers come from, printed with each prediction
    measured_ranks: int = 0               # rank count of the calibration runs (0: none)
    # Compute steps of a fused IR (`compute_seconds` in cost_model.py).  The peak figures are
    # the vendor's (see _GPU_FACTS); the rest are assumptions until measured on the device.
    hbm_Bps: float = 4.8e12               # HBM bandwidth: gemv, ebag and local copies are bound by it
    copy_launch_s: float = 2e-6           # one device-to-device cudaMemcpyAsync before a launch (assumed)
    bf16_flops: float = 989e12            # dense bf16 tensor-core peak (no sparsity)
    sms: int = 132                        # SMs: one GEMM output tile each per wave
    gemm_efficiency: float = 0.7          # fraction of the peak a full cuBLAS wave reaches (assumed)
    # Output tiles (rows, cols, efficiency relative to the largest) a GEMM may be run with, one per
    # SM per wave: the large one of Hopper's cuBLAS/CUTLASS bf16 kernels, and smaller ones its
    # heuristics take when the large one would leave SMs idle (assumed figures).
    gemm_tiles: Tuple[Tuple[int, int, float], ...] = ((128, 256, 1.0), (128, 128, 0.9), (64, 128, 0.75))
    gemm_chunk_s: float = 4e-6            # per GEMM chunk: host-driven launch + flag release (assumed)

    def link_type(self, a: int, b: int) -> str:
        same = a // self.gpus_per_node == b // self.gpus_per_node
        return self.intra_node if same else self.inter_node


# Uncalibrated link types (public specifications, NCCL-like latencies).
_PCIE5 = LinkParams(alpha_s={"LL": 1.5e-6, "LL128": 2.5e-6, "Simple": 4.0e-6},
                    tb_Bps={"LL": 5e9, "LL128": 10e9, "Simple": 10e9}, port_Bps=50e9)
_NDR_IB = LinkParams(alpha_s={"LL": 5.0e-6, "LL128": 6.0e-6, "Simple": 8.0e-6},
                     tb_Bps={"LL": 5e9, "LL128": 10e9, "Simple": 10e9}, port_Bps=48e9)

# The GPUs' compute and memory figures, stated once (NVIDIA's H100 and H200 SXM
# datasheets): HBM3 3.35 TB/s (H100) and HBM3e 4.8 TB/s (H200); dense bf16
# tensor-core peak 989 TFLOPS on both (the datasheets' 1,979 is with 2:4
# sparsity); 132 SMs on both.
_GPU_FACTS = {"h100": dict(hbm_Bps=3.35e12, bf16_flops=989e12, sms=132),
              "h200": dict(hbm_Bps=4.8e12, bf16_flops=989e12, sms=132)}
# HBM bandwidth ratio H100 SXM / H200 SXM: scales the local copy and reduce rates.
H100_MEM_SCALE = _GPU_FACTS["h100"]["hbm_Bps"] / _GPU_FACTS["h200"]["hbm_Bps"]

# CALIBRATED h200 BEGIN (written by `gc3 calibrate`; do not edit by hand)
H200_CALIBRATION = "calibrated on nvidia-h200-x2, 2026-11-22 and 2026-11-23, 208 points, median error 3.5%"
# LL, LL128 and Simple measured.
H200_NVLINK = LinkParams(alpha_s={"LL": 1.309e-06, "LL128": 1.425e-06, "Simple": 4.6e-06},
                         tb_Bps={"LL": 4.383e+09, "LL128": 4.528e+09, "Simple": 1.453e+10},
                         port_Bps=3.359e+11, calibrated=True)
H200_CORE = dict(launch_s=4.011e-06, step_overhead_s=2.288e-06, dep_s=1.641e-07, tb_mem_Bps=4.994e+10,
                 tb_reduce_Bps=3.895e+10)
# CALIBRATED h200 END


def _h200() -> CostConfig:
    calibrated = H200_NVLINK.calibrated
    return CostConfig(name="H200 SXM (NVLink4, NDR IB)", links={"nvlink": with_ll128(H200_NVLINK), "pcie": _PCIE5,
                                                                    "network": _NDR_IB},
                      calibrated=calibrated, calibration=H200_CALIBRATION, measured_ranks=2, **H200_CORE,
                      **_GPU_FACTS["h200"])


def _h100() -> CostConfig:
    core = dict(H200_CORE, tb_mem_Bps=H200_CORE["tb_mem_Bps"] * H100_MEM_SCALE,
                tb_reduce_Bps=H200_CORE["tb_reduce_Bps"] * H100_MEM_SCALE)
    nvlink = replace(with_ll128(H200_NVLINK), calibrated=False)
    return CostConfig(name="H100 SXM (NVLink4, NDR IB)", links={"nvlink": nvlink, "pcie": _PCIE5, "network": _NDR_IB},
                      calibrated=False, calibration="the H200 fit with memory rates scaled by HBM bandwidth; "
                                                    "not measured on H100", **core, **_GPU_FACTS["h100"])


PRESETS: Dict[str, CostConfig] = {"h100": _h100(), "h200": _h200()}
DEFAULT = "h200"  # the preset fitted to measurements; h100 is only derived from it


def preset(name: str = DEFAULT, **overrides) -> CostConfig:
    if name not in PRESETS:
        raise GC3Error(f"unknown cost preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides) if overrides else PRESETS[name]
