"""Micro-benchmark of the gemv opcode alone (kernels/prims_compute.cuh gemv_tile in a kernel of its
own, runtime_cuda.fused.gemv_opcode) against cuBLAS on the same shapes, one GPU, compute only:

    python3 scripts/bench_gemv_opcode.py [--iters 50] [--chunks 128] [--dtype bfloat16] [--sweep]

Per (batch, K_shard, N) of the decode shapes: the median time of --iters runs of each, the bandwidth it
achieves (weight + x read, y written, once each) and gc3 / cuBLAS.  cuBLAS is cupy.matmul for
float16/float32; bfloat16, which CuPy lacks, is torch.matmul (cuBLAS) on the same stream.  Each
timed run is bracketed by its own CUDA events; a spin kernel queued first keeps the GPU behind the
host, so the events time the kernels, not the launch overheads.  Before timing, the opcode's
result is checked against cuBLAS's (bf16/fp16: rtol 2e-2 / 4e-3 of the magnitudes; the inputs are
small multiples of 1/8, so the products are exact and only the rounding of y differs).  Exit 1
when a check fails.

--sweep: the same per variant of the opcode -- its build's tunables (runtime_cuda.core.module.
GEMV_LEVELS, the settings the GPU tests cover; on sm_80+ the 16-bit types' batch 1 uses only
"inflight", batch 2..16 only "mma_inflight", batch 17+ "mma_wide" and, where that is 0,
"mma_inflight" up to 128, so the best row of each batch names each tunable's best value) x
threads per block x blocks (chunks: 256 puts two blocks of 256 threads on an SM) -- one row per
(shape, variant), each variant checked before it is timed, then the fastest variant per shape
and the variants ranked by their geometric-mean gc3/cuBLAS bandwidth over the shapes.
--vary NAME=V1,V2 (a tunable, threads or chunks) replaces that axis.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = [(b, k, 8192) for b in (1, 8, 32) for k in (2048, 4096, 7168)]
RTOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}
_SPIN = r"""
extern "C" __global__ void gc3_spin(long long ns) {
  const long long t0 = clock64();
  while (clock64() - t0 < ns) {}
}
"""


def _values(cupy, shape, dtype, seed):
    """Multiples of 1/8 in [-1, 1] (exact in every type) in `dtype`'s storage."""
    from runtime_cuda.fused.memory_bound import from_f32

    f = cupy.random.RandomState(seed).randint(-8, 9, size=shape).astype(cupy.float32) / 8
    return from_f32(f, dtype)


def _cublas(dtype, stream):
    """fn(x, w, out): out = x @ w by cuBLAS on `stream` (CuPy's current one for cupy.matmul; made
    torch's current stream here, once, so that no call pays for a switch)."""
    import cupy

    if dtype != "bfloat16":
        return lambda x, w, out: cupy.matmul(x, w, out=out)
    import torch

    torch.cuda.set_stream(torch.cuda.ExternalStream(stream.ptr, device=torch.device("cuda", stream.device_id)))

    def run(x, w, out):
        tx, tw, to = (torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16) for a in (x, w, out))
        torch.matmul(tx, tw, out=to)
    return run


def _launch_axes(a, vary):
    """(threads, chunks) pairs: --vary's lists where given, else the sweep's, else the flags'."""
    threads = vary.get("threads", (256, 512) if a.sweep else (a.threads,))
    chunks = vary.get("chunks", (128, 256) if a.sweep else (a.chunks,))
    return [(t, c) for t in threads for c in chunks]


def _tunings(a, vary):
    """Tunable settings to build ({}: the defaults): --vary's product where it names tunables, else
    with --sweep the levels the GPU tests cover (runtime_cuda.core.module.GEMV_LEVELS: each a build),
    else the defaults."""
    import itertools

    from runtime_cuda.core.module import GEMV_LEVELS, GEMV_TUNABLES

    named = {k: v for k, v in vary.items() if k in GEMV_TUNABLES}
    if named:
        return [dict(zip(named, vals)) for vals in itertools.product(*named.values())]
    return GEMV_LEVELS if a.sweep else [{}]


def _parse_vary(ap, items):
    from runtime_cuda.core.module import GEMV_TUNABLES

    vary = {}
    for item in items or ():
        name, _, vals = item.partition("=")
        if name not in (*GEMV_TUNABLES, "threads", "chunks") or not vals:
            ap.error(f"--vary {item!r}: expected NAME=V1,V2 with NAME one of threads, chunks, "
                     f"{', '.join(GEMV_TUNABLES)}")
        try:
            vary[name] = tuple(int(v) for v in vals.split(","))
        except ValueError:
            ap.error(f"--vary {item!r}: the values must be integers")
        allowed = GEMV_TUNABLES.get(name, (128, 256, 512) if name == "threads" else None)
        if allowed and any(v not in allowed for v in vary[name]):
            ap.error(f"--vary {item!r}: {name} takes {allowed}")
        if name == "chunks" and min(vary[name]) < 1:
            ap.error(f"--vary {item!r}: chunks must be positive")
    return vary


def _label(threads, chunks, tune):
    """The variant as built: the tunables' values after the environment's and prims_compute.cuh's."""
    from runtime_cuda.core.module import gemv_defaults, gemv_tuning

    values = dict(gemv_defaults(), **dict(gemv_tuning(tune)))
    knobs = " ".join(f"{k.replace('GC3_CMP_', '').lower()} {v:3d}" for k, v in values.items())
    return f"threads {threads:3d} chunks {chunks:4d} {knobs}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=50, help="timed runs per kernel (the median is printed)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=128, help="blocks of the opcode kernel (column chunks of y)")
    ap.add_argument("--threads", type=int, default=512, choices=(128, 256, 512))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--shape", action="append", metavar="B,K,N", help="instead of the decode shapes")
    ap.add_argument("--sweep", action="store_true", help="time the opcode's variants (see above)")
    ap.add_argument("--vary", action="append", metavar="NAME=V1,V2", help="one axis of the variants")
    a = ap.parse_args(argv)
    if a.iters < 1:
        ap.error("--iters must be at least 1")
    vary = _parse_vary(ap, a.vary)
    import cupy

    from runtime_cuda.fused.gemv_opcode import gemv_chunks, unchunk
    from runtime_cuda.fused.memory_bound import storage, to_f32

    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shape] if a.shape else SHAPES
    variants = [(t, c, tune) for tune in _tunings(a, vary) for t, c in _launch_axes(a, vary)]
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    spin = cupy.RawKernel(_SPIN, "gc3_spin")
    clock_hz = dev.attributes["ClockRate"] * 1e3
    stream = cupy.cuda.Stream(non_blocking=True)
    cublas = _cublas(a.dtype, stream)
    print(f"bench_gemv_opcode: {name} ({dev.attributes['MultiProcessorCount']} SMs), {a.dtype}, "
          f"{len(variants)} variant(s) of the opcode kernel, median of {a.iters} runs after {a.warmup} warm-up",
          flush=True)

    def timed(fn):
        with stream:
            for _ in range(a.warmup):
                fn()
            events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(a.iters)]
            # Enough spin for the host to queue every run behind it (~100 us per launch, generous).
            spin((1,), (1,), (cupy.int64(int(clock_hz * (5e-3 + 100e-6 * a.iters))),))
            for e0, e1 in events:
                e0.record(stream)
                fn()
                e1.record(stream)
        stream.synchronize()
        return statistics.median(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 for e0, e1 in events)

    ok = True
    ratios = {}   # variant -> [gc3/cuBLAS bandwidth per shape]
    for batch, k, n_out in shapes:
        with stream:
            x = _values(cupy, (batch, k), a.dtype, 1)
            w = _values(cupy, (k, n_out), a.dtype, 2)
            y_ref = cupy.empty((batch, n_out), dtype=storage(a.dtype))
            cublas(x, w, y_ref)
            want = to_f32(y_ref, a.dtype)
            mag = cupy.matmul(cupy.abs(to_f32(x, a.dtype)), cupy.abs(to_f32(w, a.dtype)))
        t_ref = timed(lambda: cublas(x, w, y_ref))
        nbytes = (k * n_out + batch * k + batch * n_out) * storage(a.dtype).itemsize
        print(f"batch {batch:3d} K {k:5d} N {n_out:5d}: cuBLAS {t_ref:8.1f} us ({nbytes / (t_ref * 1e3):7.1f} GB/s)",
              flush=True)
        best = None
        for threads, chunks, tune in variants:
            label = _label(threads, chunks, tune)
            if n_out % chunks:
                print(f"  {label}: skipped, chunks do not divide N")
                continue
            with stream:
                y_gc3 = cupy.empty((chunks, batch, n_out // chunks), dtype=storage(a.dtype))

                def gc3():
                    gemv_chunks(x, w, chunks, out=y_gc3, threads=threads, stream=stream, tune=tune)
                gc3()   # builds the variant before it is timed
                got = to_f32(unchunk(y_gc3), a.dtype)
                wrong = int((cupy.abs(got - want) > 2 * RTOL[a.dtype] * mag + 1e-6).sum())
            if wrong:
                ok = False
                print(f"  {label}: WRONG ({wrong} elements), not timed", flush=True)
                continue
            t = timed(gc3)
            ratio = t_ref / t   # the same bytes: the bandwidth ratio
            ratios.setdefault(label, []).append(ratio)
            if best is None or t < best[0]:
                best = (t, label)
            print(f"  {label}: gc3 {t:8.1f} us ({nbytes / (t * 1e3):7.1f} GB/s)  gc3/cuBLAS bandwidth {ratio:5.2f}"
                  f"  check OK", flush=True)
        if best is not None:
            print(f"  best: {best[1]}: {best[0]:.1f} us, gc3/cuBLAS {t_ref / best[0]:.2f}", flush=True)
    if len(variants) > 1:
        full = {v: r for v, r in ratios.items() if len(r) == len(shapes)}
        print("variants by geometric-mean gc3/cuBLAS bandwidth over the shapes:")
        for v, r in sorted(full.items(), key=lambda kv: -statistics.geometric_mean(kv[1])):
            print(f"  {statistics.geometric_mean(r):5.3f} (worst {min(r):4.2f})  {v}")
    print("all checks OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
