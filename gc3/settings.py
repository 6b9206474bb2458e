"""Every GC3_* environment variable gc3 and its runtime read, declared once: its type,
default, allowed values and meaning, and `get`, the one reader that turns a value into
the declared type or an InputError naming the variable and the value.

It lives in gc3 (imported by runtime_cuda, never the reverse), so the compiler's
settings and the runtime's share one table and `gc3 env` can print them all without a
GPU.  Defaults that depend on the machine (the cache folder, the flag-release backend,
compute TBs) are declared as None and described; the reader that needs them computes them.

Not settings: the kernels' GC3_* macros (opcodes, table field counts, GC3_DTYPE and the
like, set with -D by runtime_cuda/core/module.py or defined in kernels/*.cuh).  Only the gemv
tunables (GC3_CMP_*) are both, since the environment overrides the macro's default."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import limits
from .errors import InputError
from .units import parse_size, strict_int

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str                       # what the README's table says the value is
    default: Any
    meaning: str
    parse: Callable[[str], Any]     # raw text -> value; ValueError saying what was expected
    allowed: str = ""               # range or choices, for the table
    group: str = "runtime"
    # Whether a value of blanks means unset.  False keeps readers that took "  " as a value
    # (an error, or a flag that is on) doing so.
    blank_is_unset: bool = True


def _int(low: int, high: int) -> Callable[[str], int]:
    return lambda raw: strict_int(raw.strip(), low, high)


def _float(low: float, high: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if not low <= value <= high:   # also refuses nan
            raise ValueError(f"out of range: expected {low} <= value <= {high}")
        return value
    return parse


def _words(true: Tuple[str, ...]) -> Callable[[str], bool]:
    return lambda raw: raw.strip().lower() in true


def _not_words(false: Tuple[str, ...]) -> Callable[[str], bool]:
    return lambda raw: raw.strip().lower() not in false


def _choice(table: Mapping[str, Any], expected: str, fold: bool = False) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        key = raw.strip().lower() if fold else raw.strip()
        if key not in table:
            raise ValueError(f"expected {expected}")
        return table[key]
    return parse


def _one_of_ints(allowed: Tuple[int, ...]) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not raw.strip().isdigit() or int(raw) not in allowed:
            raise ValueError(f"expected one of {allowed}")
        return int(raw)
    return parse


def _tile_split(raw: str) -> Tuple[int, int]:
    try:
        tiles, min_bytes = (strict_int(x, 0, limits.INT32_MAX) for x in raw.split(":"))
    except ValueError:
        raise ValueError("expected TILES:MIN_BYTES, e.g. 4:65536") from None
    if tiles < 1 or min_bytes < 0:
        raise ValueError("TILES must be >= 1 and MIN_BYTES >= 0")
    return tiles, min_bytes


def _fused_tile(raw: str) -> Tuple[int, int]:
    bm, _, bn = raw.strip().lower().partition("x")
    if bm not in ("64", "128") or bn not in ("128", "256"):
        raise ValueError("expected ROWSxCOLUMNS, rows 64 or 128 and columns 128 or 256, e.g. 128x256")
    return int(bm), int(bn)


def _text(raw: str) -> str:
    return raw.strip()


# The gemv opcode's tunables and the values a build may set (runtime_cuda/core/module.py says what each does).
GEMV_TUNABLES = {"GC3_CMP_INFLIGHT": (64, 128, 256), "GC3_CMP_MMA_INFLIGHT": (64, 128, 256), "GC3_CMP_MMA_WIDE": (0, 1)}

_ZERO_ONE = _choice({"0": False, "1": True}, "0 or 1")
_DAY = 86400.0   # longest wait: beyond a day a hang is not worth waiting for, and inf or nan would disable it

_DECLARED: List[Setting] = [
    # --- compiler and simulator ---------------------------------------------
    Setting("GC3_SIM_MAX_BYTES", "size", limits.MAX_SIMULATED_BYTES,
            "memory `gc3 simulate` may use; a larger run is refused before it starts",
            parse_size, "a size, e.g. 1GiB", "compiler"),
    # --- runtime: kernels and launches --------------------------------------
    Setting("GC3_TIMEOUT_S", "float", 5.0,
            "seconds a collective kernel waits for a peer's data, credit or dependency before it reports a hang",
            _float(0.001, _DAY), f"0.001 to {_DAY:g}", blank_is_unset=False),
    Setting("GC3_CACHE_ENTRIES", "int", None,
            "lowers every per-group cache's entry limit (1024 call shapes, 256 buffer tables): stress runs "
            "retire often",
            _int(1, 1 << 20), f"1 to {1 << 20}", blank_is_unset=False),
    *(Setting(f"GC3_SLOT_BYTES_{p.upper()}", "int", limits.SLOT_BYTES[p],
              f"bytes of one {p} FIFO slot (a positive multiple of {limits.slot_align(p)})",
              _int(64, 1 << 30), f"64 to {1 << 30}", blank_is_unset=False) for p in limits.SLOT_BYTES),
    *(Setting(f"GC3_TILE_SPLIT_{p.upper()}", "TILES:MIN_BYTES", None,
              f"cut each {p} chunk into at least TILES tiles while a tile keeps MIN_BYTES (unset: no split)",
              _tile_split, "TILES >= 1, MIN_BYTES >= 0", blank_is_unset=False) for p in limits.SLOT_BYTES),
    Setting("GC3_SMALL_THREADS", "int", None,
            "threads a block of the small-message kernels (one-shot/two-shot allreduce, one-shot allgather and "
            "reducescatter, on LL or LL128 lines; unset: an LL line a thread, or 8 threads an LL128 line, in the "
            "group's most blocks, 128 to 512 threads; the LL128 kernels round it up to whole warps)",
            _int(32, limits.SMALL_ALLREDUCE_THREADS), f"32 to {limits.SMALL_ALLREDUCE_THREADS}"),
    Setting("GC3_PDL", "flag", True,
            "mark the captured launches of the small-message and GEMV + allreduce kernels for programmatic "
            "dependent launch (sm_90 and up, cuda.bindings, a CUDA 12.3 driver): in a graph a launch may start "
            "while the kernel before it ends, and waits on the device for it; 0 launches them plainly",
            lambda raw: raw != "0", "0 or anything else", blank_is_unset=False),
    Setting("GC3_ORDER_COUNT", "flag", True,
            "mark the end of an eager small-message kernel call on a stream passed by handle with a device "
            "counter its blocks bump as they end (a switch to another stream waits for it with "
            "cuStreamWaitValue32; cuda.bindings), and of a call routed to NCCL (2.14 on) with NCCL's own launch "
            "order (a gc3 call on another stream after it waits through one byte NCCL sends to self there), "
            "instead of an event record on every call; 0 records the event",
            lambda raw: raw != "0", "0 or anything else", blank_is_unset=False),
    Setting("GC3_TRACE", "flag", False,
            "build kernels that timestamp each block's steps (Executor.trace); any value but 0 turns it on",
            lambda raw: raw != "0", "0 or anything else", blank_is_unset=False),
    Setting("GC3_COOPERATIVE", "flag", True,
            "launch collective kernels cooperatively; 0 launches them plainly",
            lambda raw: raw != "0", "0 or anything else", blank_is_unset=False),
    Setting("GC3_NVRTC_LINEINFO", "flag", False,
            "compile kernels with -lineinfo (source lines in profilers); any value turns it on",
            lambda raw: True, "anything", blank_is_unset=False),
    Setting("GC3_CMP_INFLIGHT", "int", None,
            "gemv opcode: weight bytes a thread loads ahead in the CUDA-core passes (unset: prims_compute.cuh's)",
            _one_of_ints(GEMV_TUNABLES["GC3_CMP_INFLIGHT"]), "64, 128, 256", blank_is_unset=False),
    Setting("GC3_CMP_MMA_INFLIGHT", "int", None,
            "gemv opcode: the same for the 16-bit tensor-core passes (unset: prims_compute.cuh's)",
            _one_of_ints(GEMV_TUNABLES["GC3_CMP_MMA_INFLIGHT"]), "64, 128, 256", blank_is_unset=False),
    Setting("GC3_CMP_MMA_WIDE", "int", None,
            "gemv opcode: 1 takes wider warp tiles above 16 rows (unset: prims_compute.cuh's)",
            _one_of_ints(GEMV_TUNABLES["GC3_CMP_MMA_WIDE"]), "0, 1", blank_is_unset=False),
    Setting("GC3_FAULT", "names", "",
            "known bugs put back on purpose, for the differential fuzz (runtime_cuda/core/faults.py); "
            "never in production",
            _text, "comma-separated names from runtime_cuda/core/faults.py"),
    # --- NCCL drop-in ---------------------------------------------------------
    Setting("GC3_NCCL", "bool", False,
            "importing runtime_cuda.auto (the startup hook) replaces CuPy's NCCL communicator with gc3's",
            _words(TRUE_WORDS), "1/true/yes/on, else off", "drop-in"),
    Setting("GC3_DEBUG", "level", "WARN",
            "the drop-in's log level; another value logs a warning and uses WARN",
            _text, "WARN, INFO, TRACE", "drop-in"),
    Setting("GC3_XML_FILES", "paths", "",
            "algorithm XML files the drop-in serves, before any catalog (as MSCCL_XML_FILES)",
            _text, "colon-separated files or folders", "drop-in"),
    Setting("GC3_CONFIG", "path", "",
            "the catalog the drop-in and the fused operators read, instead of the machine's",
            _text, "a .json catalog or an XML config", "drop-in"),
    Setting("GC3_CACHE_DIR", "path", None,
            "where tuned catalogs are cached (unset: $XDG_CACHE_HOME/gc3, else ~/.cache/gc3)",
            str, "a folder", "drop-in", blank_is_unset=False),
    Setting("GC3_AUTOTUNE", "bool", False,
            "a communicator whose GPUs have no cached or shipped catalog measures one first",
            _words(TRUE_WORDS), "1/true/yes/on, else off", "drop-in"),
    Setting("GC3_AUTOTUNE_S", "float", 300.0,
            "seconds of measuring GC3_AUTOTUNE may spend",
            _float(1, _DAY), f"1 to {_DAY:g}", "drop-in", blank_is_unset=False),
    Setting("GC3_AUTOTUNE_MAX_BYTES", "size", 1 << 30,
            "largest message size GC3_AUTOTUNE measures",
            parse_size, "a size, e.g. 64K", "drop-in"),
    # --- torch backend --------------------------------------------------------
    Setting("GC3_TORCH", "bool", False,
            "backend=\"nccl\" in torch.distributed runs on gc3 (the startup hook patches init_process_group)",
            _words(TRUE_WORDS), "1/true/yes/on, else off", "torch"),
    Setting("GC3_TORCH_FALLBACK", "bool", True,
            "calls gc3 cannot serve go to NCCL; 0/false/no/off makes them raise instead",
            _not_words(FALSE_WORDS), "0/false/no/off, else on", "torch"),
    # --- fused operators ------------------------------------------------------
    Setting("GC3_FUSED", "choice", None,
            "force the fused or the sequential path of every fused operator (unset or auto: the catalog decides)",
            _choice({"auto": None, "0": False, "sequential": False, "1": True, "fused": True},
                    "0/sequential, 1/fused or auto"), "auto, 0/sequential, 1/fused", "fused"),
    Setting("GC3_FUSED_MIN_ROWS", "int", 128,
            "fewest GEMM rows per chunk at which the fused GEMM+collective overlaps (fewer: sequential)",
            _int(0, 1 << 40), f"0 to {1 << 40}", "fused"),
    Setting("GC3_FUSED_RELEASE", "choice", None,
            "how fused operators release flags (unset: driver where cuda.bindings finds a driver, else kernel)",
            _choice({"driver": "driver", "kernel": "kernel"}, "'driver' or 'kernel'", fold=True),
            "driver, kernel", "fused"),
    Setting("GC3_FUSED_WAIT", "choice", "kernel",
            "how fused operators' streams wait for flags",
            _choice({"driver": "driver", "kernel": "kernel"}, "'driver' or 'kernel'", fold=True),
            "driver, kernel", "fused"),
    Setting("GC3_FUSED_EXCHANGE", "choice", "tile-store",
            "how the torch GEMM operators' fused path moves data: the GEMM stores each output tile straight into "
            "the peer that needs it (a Triton GEMM; where it cannot serve a call, the collectives), the group's "
            "collectives beside cuBLAS, or copy-engine copies straight into the peers' buffers",
            _choice({"tile-store": "tile-store", "collective": "collective", "copy-engine": "copy-engine"},
                    "'tile-store', 'collective' or 'copy-engine'", fold=True), "tile-store, collective, copy-engine",
            "fused"),
    Setting("GC3_FUSED_PEER_TILES", "choice", None,
            "how the tile-store GEMM + reduce-scatter, + all-reduce and + all-to-all send the peers' tiles in eager "
            "calls: stored by the GEMM across the link, or stored locally and carried by the copy engines chunk by "
            "chunk (needs cuda-bindings; a captured call, or a shape whose tiles span two ranks, stores them); "
            "unset: the machine catalog's measured choice for the shape (gc3 tune --fused), else store",
            _choice({"store": "store", "copy-engine": "copy-engine"}, "'store' or 'copy-engine'", fold=True),
            "store, copy-engine", "fused"),
    Setting("GC3_FUSED_TILE", "choice", None,
            "the tile-store GEMM's output tile, rows x columns (unset: chosen per shape; 128 rows where a rank has "
            "64 span two ranks)", _fused_tile, "64x128, 64x256, 128x128, 128x256", "fused"),
    Setting("GC3_FUSED_GATHER_COPIERS", "int", None,
            "programs of the tile-store all-gather + GEMM that push the rank's rows to its peers before they join "
            "the GEMM (unset: 4 per rank and 8, measured best at 2 and 4 H100s)", _int(1, 1024), "1 to 1024",
            "fused", blank_is_unset=False),
    Setting("GC3_FUSED_PARTIALS", "choice", "fp32",
            "the type GEMM+reduce-scatter/all-reduce partial products cross the links in: fp32, or the input's "
            "(half the bytes; each partial rounded once, then summed in fp32)",
            _choice({"fp32": "fp32", "input": "input"}, "'fp32' or 'input'", fold=True), "fp32, input", "fused"),
    Setting("GC3_FUSED_TRACE", "flag", False,
            "time each fused GEMM chunk and flag wait (gc3 bench --fused reads the stamps)",
            _ZERO_ONE, "0, 1", "fused"),
    Setting("GC3_FUSED_TIMEOUT", "float", 60.0,
            "seconds a fused operator's stream waits for a peer's flag before it reports a hang",
            _float(0.001, _DAY), f"0.001 to {_DAY:g}", "fused"),
    Setting("GC3_FUSED_COMPUTE_TBS", "int", None,
            "compute thread blocks per rank of the memory-bound operators' gc3 programs on the interpreter "
            "(0: compute in the sending TBs; unset: from the SM count)", _int(0, 1 << 30), f"0 to {1 << 30}", "fused",
            blank_is_unset=False),
    # --- development: the test and setup scripts ------------------------------
    *(Setting(name, kind, default, meaning, parse, allowed, "development")
      for name, kind, default, meaning, parse, allowed in (
        ("GC3_SKIP_TORCH", "flag", False, "scripts/test.sh: 1 does not install torch (its CPU tests then skip)",
         _ZERO_ONE, "0, 1"),
        ("GC3_TEST_TORCH", "version", "2.11.0", "scripts/test.sh: the torch version it installs", _text,
         "a torch version"),
        ("GC3_README_GPU_ROWS", "flag", False,
         "tests/test_readme_walkthrough.py: 1 also runs the README's GPU rows on a GPU machine", _ZERO_ONE, "0, 1"),
        ("GC3_TEST_EXTRA_OPCODE", "name", "",
         "tests/test_opcode_coverage.py: a made-up opcode, to see the coverage test fail", _text, "an opcode name"))),
]

SETTINGS: Dict[str, Setting] = {s.name: s for s in _DECLARED}
assert len(SETTINGS) == len(_DECLARED), "a setting declared twice"


def _raw(name: str, env: Optional[Mapping[str, str]]) -> Optional[str]:
    setting = SETTINGS[name]     # KeyError: a reader of an undeclared variable
    raw = (os.environ if env is None else env).get(name)
    if raw is None or raw == "" or (setting.blank_is_unset and not raw.strip()):
        return None
    return raw


def get(name: str, env: Optional[Mapping[str, str]] = None) -> Any:
    """`name`'s value in `env` (default os.environ) as its declared type, its default where
    unset; InputError naming the variable and the value where it cannot be read."""
    raw = _raw(name, env)
    if raw is None:
        return SETTINGS[name].default
    try:
        return SETTINGS[name].parse(raw)
    except ValueError as exc:
        raise InputError(f"environment variable {name}={raw!r}: {exc}") from None


def is_set(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    return _raw(name, env) is not None


def default(name: str) -> Any:
    return SETTINGS[name].default


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) and not value else str(value)


def effective(env: Optional[Mapping[str, str]] = None) -> List[Tuple[str, str, str]]:
    """(name, value, where it came from) per setting: a bad value is shown with its error."""
    rows = []
    for name in SETTINGS:
        try:
            value = _shown(get(name, env))
        except InputError as exc:
            value = f"invalid: {exc}"
        rows.append((name, value, "environment" if is_set(name, env) else "default"))
    return rows


def markdown() -> str:
    """The README's table of settings, one row each."""
    lines = ["| variable | group | type | default | allowed | meaning |", "|---|---|---|---|---|---|"]
    for s in SETTINGS.values():
        lines.append(f"| `{s.name}` | {s.group} | {s.kind} | {_shown(s.default)} | {s.allowed} | {s.meaning} |")
    return "\n".join(lines)
