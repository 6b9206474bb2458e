"""Micro-benchmark of the gemv opcode alone (kernels/prims_compute.cuh gemv_tile in a kernel of its
own, runtime_cuda.fused.gemv_opcode) against cuBLAS on the same shapes, one GPU, compute only:

    python3 scripts/bench_gemv_opcode.py [--iters 50] [--chunks 128] [--dtype bfloat16]

Per (batch, K_shard, N) of issue 16: the median time of --iters runs of each, the bandwidth it
achieves (weight + x read, y written, once each) and gc3 / cuBLAS.  cuBLAS is cupy.matmul for
float16/float32; bfloat16, which CuPy lacks, is torch.matmul (cuBLAS) on the same stream.  Each
timed run is bracketed by its own CUDA events; a spin kernel queued first keeps the GPU behind the
host, so the events time the kernels, not the launch overheads.  Before timing, the opcode's
result is checked against cuBLAS's (bf16/fp16: rtol 2e-2 / 4e-3 of the magnitudes; the inputs are
small multiples of 1/8, so the products are exact and only the rounding of y differs).  Exit 1
when a check fails.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=50, help="timed runs per kernel (the median is printed)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=128, help="blocks of the opcode kernel (column chunks of y)")
    ap.add_argument("--threads", type=int, default=512, choices=(128, 256, 512))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--shape", action="append", metavar="B,K,N", help="instead of the issue's shapes")
    a = ap.parse_args(argv)
    if a.iters < 1:
        ap.error("--iters must be at least 1")
    import cupy

    from runtime_cuda.fused.gemv_opcode import gemv_chunks, unchunk
    from runtime_cuda.fused.memory_bound import storage, to_f32

    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shape] if a.shape else SHAPES
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    spin = cupy.RawKernel(_SPIN, "gc3_spin")
    clock_hz = dev.attributes["ClockRate"] * 1e3
    stream = cupy.cuda.Stream(non_blocking=True)
    cublas = _cublas(a.dtype, stream)
    print(f"bench_gemv_opcode: {name} ({dev.attributes['MultiProcessorCount']} SMs), {a.dtype}, opcode kernel "
          f"{a.chunks} blocks x {a.threads} threads, median of {a.iters} runs after {a.warmup} warm-up", flush=True)
    ok = True
    for batch, k, n_out in shapes:
        if n_out % a.chunks:
            print(f"batch {batch} K {k} N {n_out}: skipped, --chunks {a.chunks} does not divide N")
            continue
        with stream:
            x = _values(cupy, (batch, k), a.dtype, 1)
            w = _values(cupy, (k, n_out), a.dtype, 2)
            y_gc3 = cupy.empty((a.chunks, batch, n_out // a.chunks), dtype=storage(a.dtype))
            y_ref = cupy.empty((batch, n_out), dtype=storage(a.dtype))

            def gc3():
                gemv_chunks(x, w, a.chunks, out=y_gc3, threads=a.threads, stream=stream)

            def ref():
                cublas(x, w, y_ref)
            gc3()
            ref()
            got, want = to_f32(unchunk(y_gc3), a.dtype), to_f32(y_ref, a.dtype)
            mag = cupy.matmul(cupy.abs(to_f32(x, a.dtype)), cupy.abs(to_f32(w, a.dtype)))
            wrong = int((cupy.abs(got - want) > 2 * RTOL[a.dtype] * mag + 1e-6).sum())
        ok &= wrong == 0
        times = {}
        for label, fn in (("gc3", gc3), ("cuBLAS", ref)):
            with stream:
                for _ in range(a.warmup):
                    fn()
                events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(a.iters)]
                # Enough spin for the host to queue every run behind it (~30 us per launch, generous).
                spin((1,), (1,), (cupy.int64(int(clock_hz * (5e-3 + 30e-6 * a.iters))),))
                for e0, e1 in events:
                    e0.record(stream)
                    fn()
                    e1.record(stream)
            stream.synchronize()
            times[label] = statistics.median(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 for e0, e1 in events)
        nbytes = (k * n_out + batch * k + batch * n_out) * storage(a.dtype).itemsize
        gbs = {key: nbytes / (t * 1e3) for key, t in times.items()}
        print(f"batch {batch:3d} K {k:5d} N {n_out:5d}: gc3 {times['gc3']:8.1f} us ({gbs['gc3']:7.1f} GB/s)  "
              f"cuBLAS {times['cuBLAS']:8.1f} us ({gbs['cuBLAS']:7.1f} GB/s)  gc3/cuBLAS bandwidth "
              f"{gbs['gc3'] / gbs['cuBLAS']:5.2f}  check {'OK' if wrong == 0 else f'WRONG ({wrong} elements)'}",
              flush=True)
    print("all checks OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
