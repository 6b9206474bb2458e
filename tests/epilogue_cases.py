"""Inputs and references for the epilogue AllReduce's GPU checks (tests/test_epilogue_gpu.py,
tests/gpu_programs/epilogue_ops.py): small integers, so that every sum, scale (a power of two),
bias and residual is exact in every float type and a result can be compared bit for bit."""
import numpy as np

from fused_cases import _np_dtype

EPILOGUES = {   # name -> (scale, bias?, residual?)
    "scale": (2.0, False, False),
    "bias": (None, True, False),
    "residual": (None, False, True),
    "all": (0.5, True, True),
}


def device(host, dtype):
    import cupy
    h = host.astype(_np_dtype(dtype))
    out = cupy.asarray(h.view(np.uint16) if dtype == "bfloat16" else h)
    cupy.cuda.get_current_stream().synchronize()   # read by calls on other streams (see poisoned)
    return out


def case(rng, n, shape, dtype, which):
    """Per rank x, bias, residual on the device (None where the epilogue has none), the scale,
    and per rank the float64 references: wanted, and the result of the epilogue skipped and
    applied twice (which the wanted one must differ from, or the check could not fail)."""
    scale, has_bias, has_res = EPILOGUES[which]
    xs = [rng.integers(-8, 9, size=shape).astype(np.float64) for _ in range(n)]
    bias = [rng.integers(-8, 9, size=shape[-1]).astype(np.float64) if has_bias else None for _ in range(n)]
    res = [rng.integers(-8, 9, size=shape).astype(np.float64) if has_res else None for _ in range(n)]
    total = sum(xs)

    def epi(y, r):
        y = y * (scale if scale is not None else 1.0)
        y = y + (bias[r] if has_bias else 0) + (res[r] if has_res else 0)
        return y
    want = [epi(total, r) for r in range(n)]
    skipped = [total for _ in range(n)]
    twice = [epi(epi(total, r), r) for r in range(n)]
    dev = lambda hs: [None if h is None else device(h, dtype) for h in hs]   # noqa: E731
    return dev(xs), scale, dev(bias), dev(res), want, skipped, twice


def wrong(got, want) -> int:
    """Elements of `got` (float64 host copy) that are not exactly `want`; NaN counts as wrong."""
    return int((~(got == want)).sum())
