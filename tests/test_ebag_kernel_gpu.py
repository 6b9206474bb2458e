"""The embedding-bag + AllToAll kernel (runtime_cuda/fused/ebag_kernel.py) on virtual ranks of one
GPU: random tables against a float64 reference for every float type, odd shapes (one sample,
more samples than blocks, empty bags, ranks with different numbers of indices), back-to-back
calls on a non-default stream with no synchronisation, CUDA-graph replay as new calls, a bad
index raised at the next call, and rows delivered to the wrong rank must come out wrong."""
import numpy as np
import pytest

from fused_cases import count_wrong, ebag_case, poisoned, to_host, values

from gc3.errors import GC3Error
from runtime_cuda.core.launcher import CommunicatorBroken
from runtime_cuda.fused.ebag_kernel import EbagAlltoall, refusal

pytestmark = pytest.mark.gpu      # skipped by conftest where there is no GPU
cupy = pytest.importorskip("cupy")

SLOT = 1 << 22
_GROUPS = {}


def group(n):
    if n not in _GROUPS:
        _GROUPS[n] = EbagAlltoall.virtual(n, SLOT, timeout=20)
    return _GROUPS[n]


def _run(g, tables, indices, offsets, outs, dtype, stream=None):
    t, rows, dim = tables[0].shape
    g.run_ptrs([a.data.ptr for a in tables], [a.data.ptr for a in indices], [a.data.ptr for a in offsets],
               [a.data.ptr for a in outs], [a.shape[1] for a in indices], t, rows, dim, outs[0].shape[1], dtype,
               stream)


def _check(outs, expected, dtype, what):
    for p, (want, scale) in enumerate(expected):
        wrong = count_wrong(to_host(outs[p], dtype), want, scale, dtype)
        assert wrong == 0, f"{what}: rank {p}: {wrong} of {want.size} wrong"


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("t,rows,dim,b", [(3, 57, 24, 5), (1, 10, 8, 1), (8, 1000, 64, 37), (2, 300, 128, 300),
                                          (5, 77, 16, 251)])
def test_matches_float64(n, dtype, t, rows, dim, b):
    rng = np.random.default_rng(n * 100 + t * 10 + b)
    tables, indices, offsets, expected = ebag_case(rng, n, t, rows, dim, b, dtype)
    assert len({i.shape[1] for i in indices}) > 1 or t * n * b < 4, "ranks should differ in nnz"
    outs = [poisoned((n, b, t * dim), dtype) for _ in range(n)]
    g = group(n)
    _run(g, tables, indices, offsets, outs, dtype)
    cupy.cuda.Device().synchronize()
    g.check()
    _check(outs, expected, dtype, f"{n} ranks {dtype} T={t} rows={rows} dim={dim} b={b}")


def test_back_to_back_on_a_stream_and_graph_replay():
    n, dtype = 4, "bfloat16"
    g = group(n)
    stream = cupy.cuda.Stream(non_blocking=True)
    cases = []
    for i, shape in enumerate([(3, 57, 24, 5), (8, 1000, 64, 37), (2, 300, 128, 300), (1, 10, 8, 1)] * 3):
        rng = np.random.default_rng(i)
        tables, indices, offsets, expected = ebag_case(rng, n, *shape, dtype)
        with stream:
            outs = [poisoned((n, shape[3], shape[0] * shape[2]), dtype) for _ in range(n)]
        _run(g, tables, indices, offsets, outs, dtype, stream)
        cases.append((outs, expected, shape, tables, indices, offsets))
    stream.synchronize()
    g.check()
    for i, (outs, expected, shape, *_) in enumerate(cases):
        _check(outs, expected, dtype, f"call {i} {shape}")

    # A captured call replays as a new call (the call number lives on the device): new values
    # and indices of the same widths between replays.
    outs, _, shape, tables, indices, offsets = cases[1]
    t, rows, dim, b = shape
    cap = cupy.cuda.Stream(non_blocking=True)
    cap.begin_capture()
    _run(g, tables, indices, offsets, outs, dtype, cap)
    graph = cap.end_capture()
    for rep in range(3):
        rng = np.random.default_rng(100 + rep)
        with cap:
            for a in tables:
                a[...] = values(rng, a.shape, dtype)[0]
            for a in indices:
                a[...] = cupy.asarray(rng.integers(0, rows, size=a.shape).astype(np.int32))
            for o in outs:
                o[...] = poisoned(o.shape, dtype)
        cap.synchronize()
        expected = reference(tables, indices, offsets, n, b, dtype)
        graph.launch(cap)
        cap.synchronize()
        _check(outs, expected, dtype, f"graph replay {rep}")
    g.check()


def reference(tables, indices, offsets, n, b, dtype):
    """Per receiving rank p: (expected [n, b, T*dim], bound scale), from the operands on the device."""
    pooled, mags = [], []
    for tab, idx, off in zip(tables, indices, offsets):
        host, idx, off = to_host(tab, dtype), idx.get(), off.get()
        t_count, _, dim = host.shape
        p = np.zeros((n * b, t_count, dim))
        m = np.zeros_like(p)
        for k in range(t_count):
            for s in range(n * b):
                bag = host[k][idx[k, off[k, s]:off[k, s + 1]]]
                p[s, k], m[s, k] = bag.sum(0), np.abs(bag).sum(0)
        pooled.append(p.reshape(n * b, -1))
        mags.append(m.reshape(n * b, -1))
    return [(np.stack([pooled[r][q * b:(q + 1) * b] for r in range(n)]),
             np.stack([mags[r][q * b:(q + 1) * b] for r in range(n)])) for q in range(n)]


def test_rows_delivered_to_the_wrong_rank_are_wrong():
    """Negative control of the check: rank 1's operands given to rank 0 too."""
    n, dtype = 2, "float32"
    rng = np.random.default_rng(5)
    tables, indices, offsets, expected = ebag_case(rng, n, 3, 57, 24, 5, dtype)
    outs = [poisoned((n, 5, 72), dtype) for _ in range(n)]
    _run(group(n), [tables[1]] * 2, [indices[1]] * 2, [offsets[1]] * 2, outs, dtype)
    cupy.cuda.Device().synchronize()
    with pytest.raises(AssertionError, match="wrong"):
        _check(outs, expected, dtype, "shifted")


def test_a_bad_index_is_raised_at_the_next_call_and_stops_the_group():
    n, dtype = 2, "float32"
    g = EbagAlltoall.virtual(n, 1 << 20, timeout=20)
    rng = np.random.default_rng(9)
    tables, indices, offsets, _ = ebag_case(rng, n, 2, 40, 8, 3, dtype)
    bad = indices[1].copy()
    pos = int(offsets[1].get()[1, 2])            # a position inside table 1's bags
    assert int(offsets[1].get()[1, -1]) > pos
    bad[1, pos] = 40
    outs = [poisoned((n, 3, 16), dtype) for _ in range(n)]
    _run(g, tables, [indices[0], bad], offsets, outs, dtype)
    cupy.cuda.Device().synchronize()
    with pytest.raises(ValueError, match=rf"rank 1: indices\[1, {pos}\] = 40 is outside the table's rows"):
        g.check()
    with pytest.raises(CommunicatorBroken):
        _run(g, tables, indices, offsets, outs, dtype)


def test_bad_bag_bounds_are_raised():
    n, dtype = 2, "float32"
    g = EbagAlltoall.virtual(n, 1 << 20, timeout=20)
    rng = np.random.default_rng(11)
    tables, indices, offsets, _ = ebag_case(rng, n, 1, 40, 8, 3, dtype)
    off = offsets[0].copy()
    off[0, 4] = indices[0].shape[1] + 5
    outs = [poisoned((n, 3, 8), dtype) for _ in range(n)]
    _run(g, tables, indices, [off, offsets[1]], outs, dtype)
    with pytest.raises(ValueError, match=r"rank 0: offsets\[0, (3:5|4:6)\] are not bag bounds"):
        g.check()


def test_refusals():
    assert "not a multiple of 16" in refusal("float32", 2, 1, 10, 3, 4, 4)
    assert "single rank" in refusal("float32", 1, 1, 10, 4, 4, 4)
    assert "dtype int32" in refusal("int32", 2, 1, 10, 4, 4, 4)
    assert refusal("bfloat16", 4, 26, 1 << 20, 128, 8192, 8192 * 4 * 32) is None
    g = group(2)
    rng = np.random.default_rng(3)
    tables, indices, offsets, _ = ebag_case(rng, 2, 1, 10, 8, 2, "float32")
    outs = [poisoned((2, 2, 8), "float32") for _ in range(2)]
    with pytest.raises(GC3Error, match="slots of"):
        g.run_ptrs([a.data.ptr for a in tables], [a.data.ptr for a in indices], [a.data.ptr for a in offsets],
                   [a.data.ptr for a in outs], [4, 4], 1, 10, 8, SLOT, "float32")
