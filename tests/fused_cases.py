"""Inputs and float64 references for the fused operators' GPU checks (tests/test_fused_gpu.py and
tests/gpu_programs/fused_ops.py): random values exactly representable in the dtype, the
reference computed in float64 from those same values, and the per-element bound of
gc3/simulator/compute.py (rtol times the sum of the magnitudes added)."""
import numpy as np

RTOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}


def _np_dtype(dtype):
    import ml_dtypes
    return {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]


def values(rng, shape, dtype):
    """(device array, float64 host copy) of random values of `dtype` (bfloat16 as uint16 bits)."""
    import cupy
    host = rng.standard_normal(shape).astype(_np_dtype(dtype))
    return cupy.asarray(host.view(np.uint16) if dtype == "bfloat16" else host), host.astype(np.float64)


def poisoned(shape, dtype):
    """An output buffer of NaNs, so that any element never written fails the comparison.
    Filled before it is returned: the fill runs on CuPy's current stream, and a call on
    another stream (a non-blocking one above all) would otherwise race with it, its
    output then overwritten by the poison."""
    import cupy
    if dtype == "bfloat16":
        out = cupy.full(shape, 0x7FC1, dtype=cupy.uint16)
    else:
        out = cupy.full(shape, np.nan, dtype=dtype)
    cupy.cuda.get_current_stream().synchronize()
    return out


def to_host(a, dtype):
    h = a.get()
    return (h.view(_np_dtype(dtype)) if dtype == "bfloat16" else h).astype(np.float64)


def count_wrong(got, want, scale, dtype) -> int:
    return int((~(np.abs(got - want) <= RTOL[dtype] * scale + 1e-6)).sum())


def gemv_case(rng, n, batch, k, n_out, dtype):
    """Per rank x [batch, k], w [k, n_out] on the device, and (y, bound scale) of sum_r x_r @ w_r."""
    xs, ws = zip(*[(values(rng, (batch, k), dtype), values(rng, (k, n_out), dtype)) for _ in range(n)])
    want = sum(x[1] @ w[1] for x, w in zip(xs, ws))
    scale = sum(np.abs(x[1]) @ np.abs(w[1]) for x, w in zip(xs, ws))
    return [x[0] for x in xs], [w[0] for w in ws], want, scale


def ebag_case(rng, n, t, rows, dim, b, dtype, max_bag=6):
    """Per rank tables, indices, offsets on the device (bags of 0..max_bag indices, a few unused
    index positions at the end), and per receiving rank p (expected [n, b, t*dim], bound scale)."""
    import cupy
    batch = n * b
    tables, indices, offsets, pooled, mags = [], [], [], [], []
    for _ in range(n):
        dev, host = values(rng, (t, rows, dim), dtype)
        off = np.zeros((t, batch + 1), np.int32)
        off[:, 1:] = np.cumsum(rng.integers(0, max_bag + 1, size=(t, batch)), axis=1)
        idx = rng.integers(0, rows, size=(t, int(off[:, -1].max()) + 3)).astype(np.int32)
        p = np.zeros((batch, t, dim))
        m = np.zeros((batch, t, dim))
        for k in range(t):
            for s in range(batch):
                bag = host[k][idx[k, off[k, s]:off[k, s + 1]]]
                p[s, k], m[s, k] = bag.sum(0), np.abs(bag).sum(0)
        tables.append(dev)
        indices.append(cupy.asarray(idx))
        offsets.append(cupy.asarray(off))
        pooled.append(p.reshape(batch, t * dim))
        mags.append(m.reshape(batch, t * dim))
    expected = [(np.stack([pooled[r][p * b:(p + 1) * b] for r in range(n)]),
                 np.stack([mags[r][p * b:(p + 1) * b] for r in range(n)])) for p in range(n)]
    # Copied on the legacy stream: a non-blocking stream's call would not wait for them.
    cupy.cuda.Device().synchronize()
    return tables, indices, offsets, expected
