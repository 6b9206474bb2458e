"""The GEMV + AllReduce kernel (runtime_cuda/fused/gemv_kernel.py) on virtual ranks of one GPU,
in both its forms (split-K and column tiles over all of K):
random values against a float64 reference, the same bits on every rank, odd shapes (columns no
16-byte load fits, one column, tiles that wrap around the grid, slices of K, a weight no vector
load fits), every float type, back-to-back
calls on a non-default stream with no synchronisation, CUDA-graph replay as new calls, and
a peer's partial put in the wrong slot must come out wrong."""
import numpy as np
import pytest

from fused_cases import count_wrong, gemv_case, poisoned, to_host

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


def _gpu():
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


if not _gpu():
    pytest.skip("no GPU", allow_module_level=True)

from runtime_cuda.fused.gemv_kernel import GemvAllreduce  # noqa: E402

_GROUPS = {}


def _run(g, xs, ws, outs, dtype, stream=None):
    g(xs, ws, outs, dtype=dtype, stream=stream)


def _check(outs, want, scale, dtype, what):
    got = [to_host(o, dtype) for o in outs]
    bad = count_wrong(got[0], want, scale, dtype)
    assert bad == 0, f"{what}: {bad} of {want.size} wrong"
    for r, o in enumerate(outs[1:], 1):
        assert (o.get() == outs[0].get()).all(), f"{what}: rank {r}'s bits differ from rank 0's"


def _misaligned(a):
    """A copy of `a` one element past an allocation's start: no vector load of it is aligned."""
    buf = cupy.empty(a.size + 1, dtype=a.dtype)
    out = buf[1:].reshape(a.shape)
    out[...] = a
    return out


# (split-K?, its row limit): the default forms (split-K to 8 rows, on tensor cores from 3 in the
# 16-bit types), split-K to 2 rows only (column tiles above), column tiles at every batch.
@pytest.fixture(params=[(True, None), (True, 2), (False, None)], ids=["split-k", "split-k-2-rows", "column-tiles"])
def split_k(request):
    yield request.param
    for g in _GROUPS.values():
        g.split_k, g.split_max_batch = True, None


def group(n):
    if n not in _GROUPS:
        _GROUPS[n] = GemvAllreduce.virtual(n, timeout=20)
    return _GROUPS[n]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("batch,k,n_out", [(1, 512, 4096), (3, 96, 232), (5, 40, 235), (8, 300, 1), (32, 64, 1000),
                                           (1, 7, 8), (1, 2048, 4096), (2, 3000, 1032), (6, 1030, 1024),
                                           (8, 777, 520), (4, 2500, 34000), (8, 1500, 34000),
                                           (1, 2048, 8192), (1, 1000, 8200), (2, 1500, 8192), (1, 100, 16384)])
def test_matches_float64_and_every_rank_has_the_same_bits(n, dtype, batch, k, n_out, split_k):
    """(4, 2500, 34000) and (8, 1500, 34000) have more tiles than blocks, so a split-K slice is all
    of K: longer than the x rows a block holds at once.  The last four take the 16-bit types' rows
    form with rows of two tiles, a last tile 8 columns wide, 2 rows, and slices of a few rows each
    whose sums a group of lanes shares."""
    rng = np.random.default_rng(batch * 1000 + k + n_out)
    xs, ws, want, scale = gemv_case(rng, n, batch, k, n_out, dtype)
    outs = [poisoned((batch, n_out), dtype) for _ in range(n)]
    g = group(n)
    g.split_k, g.split_max_batch = split_k
    _run(g, xs, ws, outs, dtype)
    cupy.cuda.Device().synchronize()
    g.check()
    _check(outs, want, scale, dtype, f"{n} ranks {dtype} {batch}x{k}x{n_out}")


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_weight_no_vector_load_fits(dtype, batch):
    """Rank 1's weight starts one element past an aligned address: its loads go element by element
    and the ranks still agree (the tile layout does not depend on the alignment)."""
    n, k, n_out = 2, 1500, 2048
    rng = np.random.default_rng(77)
    xs, ws, want, scale = gemv_case(rng, n, batch, k, n_out, dtype)
    ws = [ws[0], _misaligned(ws[1])]
    outs = [poisoned((batch, n_out), dtype) for _ in range(n)]
    g = group(n)
    _run(g, xs, ws, outs, dtype)
    cupy.cuda.Device().synchronize()
    g.check()
    _check(outs, want, scale, dtype, f"misaligned {dtype}")


def test_back_to_back_on_a_stream_and_graph_replay():
    n, dtype = 2, "bfloat16"
    g = group(n)
    stream = cupy.cuda.Stream(non_blocking=True)
    cases = []
    for i, shape in enumerate([(1, 256, 2048), (4, 128, 520), (1, 2560, 2048), (8, 64, 4096), (2, 3000, 1032)] * 3):
        rng = np.random.default_rng(i)
        with stream:        # operands made on the stream the calls run on, so ordered before them
            xs, ws, want, scale = gemv_case(rng, n, *shape, dtype)
            outs = [poisoned((shape[0], shape[2]), dtype) for _ in range(n)]
        _run(g, xs, ws, outs, dtype, stream)
        cases.append((outs, want, scale, shape, xs, ws))
    stream.synchronize()
    g.check()
    for i, (outs, want, scale, shape, _, _) in enumerate(cases):
        _check(outs, want, scale, dtype, f"call {i} {shape}")

    # A captured call replays as a new call (the call number lives on the device).
    outs, _, _, shape, xs, ws = cases[0]
    cap = cupy.cuda.Stream(non_blocking=True)
    cap.begin_capture()
    _run(g, xs, ws, outs, dtype, cap)
    graph = cap.end_capture()
    for rep in range(3):
        rng = np.random.default_rng(100 + rep)
        xs2, ws2, want, scale = gemv_case(rng, n, *shape, dtype)
        with cap:
            for a, b in zip(xs + ws, xs2 + ws2):
                a[...] = b
            for o in outs:
                o[...] = poisoned(o.shape, dtype)
        graph.launch(cap)
        cap.synchronize()
        _check(outs, want, scale, dtype, f"graph replay {rep}")


def test_a_graph_whose_kernels_ahead_write_the_weight_and_x():
    """Each captured call follows plain kernels that write its x and its weight.  A captured
    launch is marked for programmatic dependent launch and prefetches weight rows into L2
    before it waits for the kernel ahead: a call that read either operand early would use
    the values of the call before."""
    n, dtype, shape, steps = 2, "bfloat16", (1, 2560, 2048), 4
    g = group(n)
    cap = cupy.cuda.Stream(non_blocking=True)
    xs, ws, _, _ = gemv_case(np.random.default_rng(200), n, *shape, dtype)
    new = [gemv_case(np.random.default_rng(300 + i), n, *shape, dtype) for i in range(steps)]
    outs = [[poisoned((shape[0], shape[2]), dtype) for _ in range(n)] for _ in range(steps)]
    cupy.cuda.Device().synchronize()
    cap.begin_capture()
    for i in range(steps):
        with cap:
            for a, b in zip(xs + ws, new[i][0] + new[i][1]):
                a[...] = b
        _run(g, xs, ws, outs[i], dtype, cap)
    graph = cap.end_capture()
    for rep in range(2):
        graph.launch(cap)
        cap.synchronize()
        g.check()
        for i in range(steps):
            _check(outs[i], new[i][2], new[i][3], dtype, f"replay {rep} step {i}")


def test_a_partial_in_the_wrong_place_is_wrong():
    """Negative control of the check: rank 1's operands given to rank 0 too."""
    n, dtype = 2, "bfloat16"
    rng = np.random.default_rng(5)
    xs, ws, want, scale = gemv_case(rng, n, 2, 128, 512, dtype)
    outs = [poisoned((2, 512), dtype) for _ in range(n)]
    _run(group(n), [xs[1], xs[1]], [ws[1], ws[1]], outs, dtype)
    cupy.cuda.Device().synchronize()
    with pytest.raises(AssertionError, match="wrong"):
        _check(outs, want, scale, dtype, "shifted")


def test_a_call_after_the_last_calls_stream_was_destroyed():
    """Each call on a temporary stream, destroyed once the call is done: the next call, on
    another stream (made while the old one lived, so its handle differs), must not touch the old
    one (the hand-over used to be recorded there and the process crashed)."""
    import gc
    n, dtype = 2, "bfloat16"
    g = group(n)
    current = cupy.cuda.Stream(non_blocking=True)
    for i in range(4):
        rng = np.random.default_rng(200 + i)
        xs, ws, want, scale = gemv_case(rng, n, 1, 512, 1024, dtype)
        outs = [poisoned((1, 1024), dtype) for _ in range(n)]
        cupy.cuda.Device().synchronize()
        following = cupy.cuda.Stream(non_blocking=True)
        assert following.ptr != current.ptr
        _run(g, xs, ws, outs, dtype, current)
        current.synchronize()
        _check(outs, want, scale, dtype, f"call {i} on a temporary stream")
        del current
        gc.collect()
        current = following
    current.synchronize()
