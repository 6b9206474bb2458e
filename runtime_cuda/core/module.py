"""Builds the interpreter kernel with NVRTC (cupy.RawModule), one binary per
dtype x op x protocol, cached for the process (and by CuPy on disk)."""
from __future__ import annotations

import functools
import re
from typing import Dict, Mapping, Optional, Tuple

from gc3 import limits, settings

from .. import KERNEL_DIR
from . import abi

KERNEL_NAME = "gc3_interpreter"
MAX_THREADS = 512
_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.M)


def source(entry: str = "interpreter.cu") -> str:
    """`entry` (a file of kernels/) with its local headers inlined, so that CuPy's cache key
    (a hash of the source text) changes whenever any of them does."""
    seen = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (KERNEL_DIR / name).read_text()
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text.replace("#pragma once", ""))

    return expand(entry)


def trace_enabled() -> bool:
    """GC3_TRACE=1: build the kernel that timestamps each block's steps (Executor.trace)."""
    return settings.get("GC3_TRACE")


# The gemv opcode's tunables (kernels/prims_compute.cuh, which holds their defaults and says what
# each does) and the values a build may set: weight bytes a thread loads before it uses any, in the
# CUDA-core passes (batch 1; fp32) and in the 16-bit types' tensor-core passes (batch >= 2), and the
# wider warp tiles of the tensor-core passes above 16 rows.  An environment variable of the macro's
# name overrides the default in every compute build.
GEMV_TUNABLES = settings.GEMV_TUNABLES
# The settings the GPU tests run and scripts/bench_gemv_opcode.py --sweep times, each one build
# (per dtype): together they take every value of every tunable, and on sm_80+ each tunable acts on
# batch sizes of its own (16-bit types: batch 1, 2..16, 17+), so one sweep times each value.
GEMV_LEVELS = ({"GC3_CMP_INFLIGHT": 64, "GC3_CMP_MMA_INFLIGHT": 64, "GC3_CMP_MMA_WIDE": 0},
               {"GC3_CMP_INFLIGHT": 128, "GC3_CMP_MMA_INFLIGHT": 128, "GC3_CMP_MMA_WIDE": 0},
               {"GC3_CMP_INFLIGHT": 256, "GC3_CMP_MMA_INFLIGHT": 256, "GC3_CMP_MMA_WIDE": 1})


@functools.lru_cache(maxsize=None)
def gemv_defaults() -> Dict[str, int]:
    """Each tunable's default, as prims_compute.cuh defines it (#ifndef NAME / #define NAME value)."""
    text = (KERNEL_DIR / "prims_compute.cuh").read_text()
    found = {}
    for name in GEMV_TUNABLES:
        m = re.search(rf"^#ifndef {name}\n#define {name} (\d+)$", text, re.M)
        if m is None:
            raise RuntimeError(f"kernels/prims_compute.cuh: no '#ifndef {name}' default for the gemv tunable")
        found[name] = int(m.group(1))
    return found


def gemv_tuning(tune: Optional[Mapping[str, int]] = None) -> Tuple[Tuple[str, int], ...]:
    """The tunables a compute build sets apart from prims_compute.cuh's defaults, sorted: the
    environment's, then `tune`'s (which wins).  A name or value outside GEMV_TUNABLES
    is an InputError naming where it came from."""
    from gc3.errors import InputError

    chosen = {}
    for name in GEMV_TUNABLES:
        given = settings.get(name)
        if given is not None:
            chosen[name] = given
    for name, value in (tune or {}).items():
        if name not in GEMV_TUNABLES:
            raise InputError(f"gemv tunable {name!r}: expected one of {sorted(GEMV_TUNABLES)}")
        if isinstance(value, bool) or value not in GEMV_TUNABLES[name]:
            raise InputError(f"gemv tunable {name}={value!r}: expected one of {GEMV_TUNABLES[name]}")
        chosen[name] = int(value)
    # The defaults are left out, so that a setting of them is the default build (one binary, one cache entry).
    return tuple(sorted((k, v) for k, v in chosen.items() if v != gemv_defaults()[k]))


def options(dtype: str, op: str, proto: str, trace: bool = False, compute: bool = False,
            epilogue: bool = False, tune: Optional[Mapping[str, int]] = None,
            out_dtype: Optional[str] = None) -> Tuple[str, ...]:
    """`compute`: with the compute opcodes (a fused IR's group; prims_compute.cuh says why not always)
    and the gemv tunables of gemv_tuning(tune); `epilogue`: with the epilogue on flagged stores (an
    epilogue IR's group, or the small kernels' epilogue build; plain collectives keep the store path
    without its branch and registers); `out_dtype`: the type the epilogue stores, where it is not
    `dtype` (epilogue.cuh's out_t)."""
    debug = ("-lineinfo",) if settings.get("GC3_NVRTC_LINEINFO") else ()
    debug += ("-DGC3_TRACE",) if trace else ()
    debug += ("-DGC3_COMPUTE",) + tuple(f"-D{k}={v}" for k, v in gemv_tuning(tune)) if compute else ()
    debug += ("-DGC3_EPILOGUE",) if epilogue else ()
    debug += (f"-DGC3_OUT_DTYPE={abi.DTYPE[out_dtype]}",) if out_dtype not in (None, dtype) else ()
    return debug + ("-std=c++17",
            f"-DGC3_DTYPE={abi.DTYPE[dtype]}", f"-DGC3_REDOP={abi.REDOP[op]}", f"-DGC3_PROTO={abi.PROTO[proto]}",
            f"-DGC3_MAX_FANIN={limits.MAX_REDUCE_FANIN}", f"-DGC3_MAX_THREADS={MAX_THREADS}",
            f"-DGC3_LL128_LINE_BYTES={limits.LL128_LINE_BYTES}",
            f"-DGC3_LL128_LINE_DATA_BYTES={limits.LL128_LINE_DATA_BYTES}")


def cooperative_default() -> bool:
    return settings.get("GC3_COOPERATIVE")


@functools.lru_cache(maxsize=None)
def kernel(dtype: str, op: str, proto: str, device: int, cooperative: bool = True, trace: bool = False,
           compute: bool = False, epilogue: bool = False):
    """The compiled interpreter for the current device (`device` is part of the cache key)."""
    import cupy

    mod = cupy.RawModule(code=source(), options=options(dtype, op, proto, trace, compute, epilogue),
                         enable_cooperative_groups=cooperative)
    return mod.get_function(KERNEL_NAME)


def _compile_one(variant: Tuple[str, str, str, bool]) -> str:
    import time

    dtype, op, proto, compute = variant
    name = "/".join(variant[:3]) + ("/compute" if compute else "")
    t0 = time.perf_counter()
    try:
        kernel(dtype, op, proto, device=0, cooperative=cooperative_default(), trace=trace_enabled(),
               compute=compute).kernel  # noqa: B018  (compiles and loads)
    except Exception as exc:  # reported, so that one bad variant does not hide the others
        return f"{name} FAILED: {type(exc).__name__}: {exc}"
    return f"{name} {time.perf_counter() - t0:.1f}s"


# The builds a fused IR's group uses: compute opcodes, float types, sum (tables.COMPUTE_DTYPES).
FUSED_DTYPES = ("float16", "bfloat16", "float32")


def warm(jobs: int = 8, fused_only: bool = False) -> None:
    """Compile every dtype x op x protocol and the fused programs' builds (or only those) in
    parallel processes, filling CuPy's on-disk cache, so that later processes only load
    binaries (GC3_TRACE=1: the trace builds)."""
    import itertools
    import multiprocessing

    variants = [] if fused_only else [v + (False,) for v in itertools.product(abi.DTYPE, abi.REDOP, abi.PROTO)]
    variants += [(dt, "sum", proto, True) for dt in FUSED_DTYPES for proto in abi.PROTO]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for line in pool.imap_unordered(_compile_one, variants):
            print(line, flush=True)


if __name__ == "__main__":
    import sys

    args = [a for a in sys.argv[1:] if a != "--fused"]
    warm(int(args[0]) if args else 8, fused_only="--fused" in sys.argv[1:])
