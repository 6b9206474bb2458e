"""The fused AllReduce + epilogue (runtime_cuda.fused.allreduce_epilogue: the small kernels'
epilogue build up to 2 MiB, the allreduce then the epilogue pass above) on virtual ranks, random
data against a float64 reference:

* sizes from 1 element through odd shapes and 16 KiB .. 8 MiB (both paths, both small kernels),
  bf16, fp16, fp32 and fp32 -> bf16, every combination of scale, bias and residual: the fused
  result's error is no larger than the sequential path's, and every rank holds the same bits;
* CUDA-graph capture of a call up to 2 MiB, replayed on new input values;
* back-to-back calls of alternating sizes and kinds with no synchronisation in between;
* the shifted-peer hook (small_allreduce.SHIFT_PEERS) gives results the same check rejects;
* a cast refuses an output that overlaps x.
"""
import itertools

import numpy as np
import pytest

from gc3 import limits

pytestmark = pytest.mark.gpu

MiB = 1 << 20
TERMS = [c for k in (1, 2, 3) for c in itertools.combinations(("scale", "bias", "residual"), k)]
CASTS = [("bfloat16", None), ("float16", None), ("float32", None), ("float32", "bfloat16")]


def shapes(itemsize):
    """1 element, odd shapes (one just above 2 MiB in fp32), and 16 KiB .. 8 MiB of x."""
    out = [(1,), (7,), (13, 79), (1021, 515)]
    for nbytes in (16 << 10, 256 << 10, MiB, 2 * MiB, 8 * MiB):
        out.append((nbytes // itemsize // 256, 256))
    return out


def _np(dtype):
    from fused_cases import _np_dtype
    return _np_dtype(dtype)


def make(rng, n, shape, dtype, terms):
    """Per rank x (device), and the bias and residual every rank shares (device, or None),
    the scale, and their float64 host copies."""
    import cupy
    from fused_cases import values
    xs = [values(rng, shape, dtype) for _ in range(n)]
    bias = values(rng, shape[-1:], dtype) if "bias" in terms else (None, 0.0)
    res = values(rng, shape, dtype) if "residual" in terms else (None, 0.0)
    scale = 1.0 / n if "scale" in terms else None
    ref = sum(x[1] for x in xs) * (1.0 if scale is None else scale) + bias[1] + res[1]
    cupy.cuda.Device().synchronize()     # copied on the legacy stream; the tests' streams do not wait for it
    return [x[0] for x in xs], bias[0], res[0], scale, ref


def call(comm, n, xs, bias, res, scale, out_dtype, path, stream, outs=None):
    from runtime_cuda.fused import allreduce_epilogue
    return allreduce_epilogue(xs, comm, scale=scale, bias=None if bias is None else [bias] * n,
                              residual=None if res is None else [res] * n, out=outs, stream=stream, path=path,
                              out_dtype=out_dtype)


def error(got, ref):
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def rounding(dtype):
    return 2 ** -6 if dtype in ("bfloat16", "float16") else 2 ** -18


def close(got, ref, seq, dtype, what):
    """got's error against the float64 reference is no larger than the sequential path's (+ a rounding)."""
    e_got, e_seq = error(got, ref), error(seq, ref)
    assert e_got <= max(1.25 * e_seq, e_seq + rounding(dtype) / 4), \
        f"{what}: error {e_got:.3e} against float64, sequential path {e_seq:.3e}"


def same_bits(outs, what):
    for r, o in enumerate(outs[1:], 1):
        assert o.tobytes() == outs[0].tobytes(), f"{what}: rank {r} holds other bits than rank 0"


def host(outs, dtype, stream=None):
    """Host copies of `outs`, after `stream` (which made them) has finished: .get() waits only
    for the legacy stream, which a non-blocking stream's work does not join."""
    from fused_cases import to_host
    if stream is not None:
        stream.synchronize()
    return [to_host(o, dtype) for o in outs]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype, out_dtype", CASTS)
def test_sizes_types_and_terms_against_float64(n, dtype, out_dtype, monkeypatch):
    import cupy
    from runtime_cuda.fused import VirtualComm, check
    from runtime_cuda.fused import epilogue as ep
    comm = VirtualComm(n)
    s = cupy.cuda.Stream(non_blocking=True)
    odt = out_dtype or dtype
    rng = np.random.default_rng([n, CASTS.index((dtype, out_dtype))])
    itemsize = np.dtype(_np(dtype)).itemsize
    for i, shape in enumerate(shapes(itemsize)):
        count = int(np.prod(shape))
        # every term combination at a few sizes, all three terms at the others
        for terms in (TERMS if i in (0, 2, 5) else [("scale", "bias", "residual")]):
            xs, bias, res, scale, ref = make(rng, n, shape, dtype, terms)
            seq = host(call(comm, n, xs, bias, res, scale, out_dtype, "sequential", s), odt, s)
            kinds = limits.SMALL_ALLREDUCE_KERNELS if ep.fits_kernel(count, dtype) else ("-",)
            for kind in kinds:
                monkeypatch.setattr(ep, "kernel_kind", lambda nbytes, nranks, _k=kind: _k)
                outs = call(comm, n, xs, bias, res, scale, out_dtype, "fused", s)
                s.synchronize()
                check(comm)
                what = f"{n} ranks {dtype}->{odt} {shape} {'+'.join(terms)} {kind}"
                assert all(o.dtype == ep.storage(odt) and o.shape == shape for o in outs), what
                same_bits([o.get() for o in outs], what)
                got = host(outs, odt)
                for r in range(n):
                    close(got[r], ref, seq[r], odt, f"{what} rank {r}")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype, out_dtype", [("bfloat16", None), ("float32", "bfloat16")])
def test_graph_capture_replays_on_new_inputs(n, dtype, out_dtype):
    import cupy
    from runtime_cuda.fused import VirtualComm, check
    comm = VirtualComm(n)
    s = cupy.cuda.Stream(non_blocking=True)
    odt = out_dtype or dtype
    for shape in ((7,), (33, 257), (2 * MiB // np.dtype(_np(dtype)).itemsize // 512, 512)):    # up to 2 MiB
        rng = np.random.default_rng(len(shape) + shape[0])
        xs, bias, res, scale, _ = make(rng, n, shape, dtype, TERMS[-1])
        outs = call(comm, n, xs, bias, res, scale, out_dtype, "fused", s)     # warm: set-up outside the capture
        s.synchronize()
        s.begin_capture()
        call(comm, n, xs, bias, res, scale, out_dtype, "fused", s, outs=outs)
        graph = s.end_capture()
        for rep in range(3):
            new, _, _, _, _ = make(np.random.default_rng([rep, 9]), n, shape, dtype, ())
            with s:
                for x, v in zip(xs, new):
                    x[...] = v
            s.synchronize()
            ref = sum(host(new, dtype)) * scale + host([bias], dtype)[0] + host([res], dtype)[0]
            graph.launch(s)
            seq = host(call(comm, n, xs, bias, res, scale, out_dtype, "sequential", s), odt, s)
            s.synchronize()
            check(comm)
            got = host(outs, odt)
            same_bits([o.get() for o in outs], f"replay {rep} {shape}")
            for r in range(n):
                close(got[r], ref, seq[r], odt, f"replay {rep} {shape} rank {r}")


@pytest.mark.parametrize("n", [2, 4])
def test_back_to_back_alternating_sizes_without_synchronisation(n):
    import cupy
    from runtime_cuda.fused import VirtualComm, check
    comm = VirtualComm(n)
    s = cupy.cuda.Stream(non_blocking=True)
    queued = []
    sizes = [(5, 64), (700, 512), (3000, 1024), (1, 3), (2048, 256)]     # one-shot, two-shot at 4, pass, ...
    for i in range(15):
        dtype, out_dtype = CASTS[i % len(CASTS)]
        shape = sizes[i % len(sizes)]
        xs, bias, res, scale, ref = make(np.random.default_rng([n, i]), n, shape, dtype, TERMS[i % len(TERMS)])
        outs = call(comm, n, xs, bias, res, scale, out_dtype, "fused", s)
        seq = call(comm, n, xs, bias, res, scale, out_dtype, "sequential", s)
        queued.append((i, shape, out_dtype or dtype, outs, seq, ref, xs, bias, res))
    s.synchronize()
    check(comm)
    for i, shape, odt, outs, seq, ref, *_ in queued:
        got, want = host(outs, odt), host(seq, odt)
        same_bits([o.get() for o in outs], f"call {i} {shape}")
        for r in range(n):
            close(got[r], ref, want[r], odt, f"call {i} {shape} rank {r}")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("shape", [(9, 64), (1024, 512)])       # one-shot; two-shot at 4 ranks
def test_a_shifted_peer_fails_the_check(n, shape, monkeypatch):
    import cupy
    from runtime_cuda.ranks import small_allreduce
    from runtime_cuda.fused import VirtualComm
    s = cupy.cuda.Stream(non_blocking=True)
    xs, bias, res, scale, ref = make(np.random.default_rng(n), n, shape, "bfloat16", TERMS[-1])
    seq = host(call(VirtualComm(n), n, xs, bias, res, scale, None, "sequential", s), "bfloat16", s)
    monkeypatch.setattr(small_allreduce, "SHIFT_PEERS", True)
    got = host(call(VirtualComm(n), n, xs, bias, res, scale, None, "fused", s), "bfloat16", s)   # a fresh group
    for r in range(n):
        with pytest.raises(AssertionError, match="error"):
            close(got[r], ref, seq[r], "bfloat16", f"shifted rank {r}")


def test_a_cast_in_place_is_refused():
    import cupy
    from runtime_cuda.fused import VirtualComm, allreduce_epilogue
    x = [cupy.ones((4, 8), cupy.float32) for _ in range(2)]
    with pytest.raises(ValueError, match="rank 0: out overlaps x: a float32 result cast to bfloat16"):
        allreduce_epilogue(x, VirtualComm(2), scale=0.5, out=[a.reshape(-1).view(cupy.uint16)[:32].reshape(4, 8) for a in x],
                           out_dtype="bfloat16")
