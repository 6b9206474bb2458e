"""The gemv opcode alone on a GPU (runtime_cuda.fused.gemv_opcode: kernels/prims_compute.cuh's
gemv_tile, one block per chunk of y's columns): batch 1 (CUDA cores), batch 2..32 and beyond
(the 16-bit types' tensor-core passes, fp32's CUDA-core passes), odd K and N (element-wise loads),
tiles that cover part of a chunk, every block size a launch group picks.  Integer-valued inputs:
fp32 must match the float64 reference exactly; bf16/fp16 within the simulator's bound (rtol times
the sum of the magnitudes added).  Outputs start as NaN, so a lane left unwritten, or written
outside its tile, fails."""
import numpy as np
import pytest

from gc3.errors import GC3Error

from runtime_cuda.core.module import GEMV_LEVELS

pytestmark = pytest.mark.gpu

# Every tested level of the opcode's tunables (module.GEMV_TUNABLES): the cases run under each, the
# tile tests (whose bounds no tunable touches) under the defaults only.
LEVELS = GEMV_LEVELS

CASES = [  # (batch, K, N, chunks, dtype, threads)
    (1, 301, 231, 7, "bfloat16", 512),      # batch 1: the CUDA-core pass
    (3, 301, 231, 7, "bfloat16", 512),      # odd K and N: element-wise loads, 33-column chunks
    (8, 2048, 1024, 16, "bfloat16", 512),   # 16-byte weight loads, one n-tile
    (12, 64, 264, 2, "float16", 512),       # 132-column chunks: a part of a warp's column tile
    (17, 257, 520, 8, "float16", 256),      # odd K, 65-column chunks, four n-tiles
    (32, 1024, 512, 4, "bfloat16", 128),    # 8-byte weight loads, 4 warps per block
    (40, 96, 136, 1, "bfloat16", 512),      # two passes of rows (32 + 8)
    (3, 301, 231, 7, "float32", 512),
    (17, 256, 512, 8, "float32", 256),      # passes of 8 rows
    (32, 130, 96, 4, "float32", 128),
    (1, 1000, 1024, 8, "bfloat16", 256),    # batch 1, 16-byte loads, K not a multiple of a round of loads
    (1, 999, 512, 4, "float32", 512),
]


def _ints(rng, shape, dtype, bound):
    """(device array, float64 copy) of integers in [-bound, bound] stored as `dtype`."""
    import cupy
    import ml_dtypes
    host = rng.integers(-bound, bound + 1, size=shape).astype(np.float64)
    np_t = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[dtype]
    stored = host.astype(np_t)
    return cupy.asarray(stored.view(np.uint16) if dtype == "bfloat16" else stored), host


def _poison(shape, dtype):
    import cupy
    if dtype == "bfloat16":
        return cupy.full(shape, 0x7FC1, dtype=cupy.uint16)
    return cupy.full(shape, np.nan, dtype=dtype)


def _check(got_chunks, want, scale, dtype, lane0, n):
    """Lanes [lane0, lane0 + n) of every chunk right, every other lane still NaN."""
    from fused_cases import count_wrong, to_host
    chunks, batch, per = got_chunks.shape
    got = to_host(got_chunks, dtype).reshape(chunks, batch * per)
    ref = want.reshape(batch, chunks, per).transpose(1, 0, 2).reshape(chunks, batch * per)
    mag = scale.reshape(batch, chunks, per).transpose(1, 0, 2).reshape(chunks, batch * per)
    inside = got[:, lane0:lane0 + n]
    if dtype == "float32":   # integer-valued, every partial sum exact in fp32
        bad = int((inside != ref[:, lane0:lane0 + n]).sum())
    else:
        bad = count_wrong(inside, ref[:, lane0:lane0 + n], mag[:, lane0:lane0 + n], dtype)
    outside = np.concatenate([got[:, :lane0], got[:, lane0 + n:]], axis=1)
    assert bad == 0, f"{bad} of {inside.size} lanes wrong"
    assert np.isnan(outside).all(), f"{int((~np.isnan(outside)).sum())} lanes written outside the tile"


def _level_id(tune):
    return "-".join(f"{k.replace('GC3_CMP_', '').lower()}{v}" for k, v in tune.items())


@pytest.mark.parametrize("tune", LEVELS, ids=_level_id)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_gemv_opcode_against_float64(case, tune):
    import cupy
    from runtime_cuda.fused.gemv_opcode import gemv_chunks
    batch, k, n_out, chunks, dtype, threads = case
    rng = np.random.default_rng(batch * 1000 + k)
    x, xh = _ints(rng, (batch, k), dtype, 2)
    w, wh = _ints(rng, (k, n_out), dtype, 2)
    out = _poison((chunks, batch, n_out // chunks), dtype)
    gemv_chunks(x, w, chunks, out=out, threads=threads, tune=tune)
    cupy.cuda.get_current_stream().synchronize()
    _check(out, xh @ wh, np.abs(xh) @ np.abs(wh), dtype, 0, batch * (n_out // chunks))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("lanes", [(70, 500), (5, 30), (65, 65), (0, 1), (1040, 65)])
def test_gemv_opcode_computes_only_its_tile(dtype, lanes):
    """A tile that starts and ends inside rows (several rows, one row, one whole row, one lane, the
    last row): the step's lanes and no others."""
    import cupy
    from runtime_cuda.fused.gemv_opcode import gemv_chunks
    batch, k, n_out, chunks = 17, 257, 520, 8
    lane0, n = lanes
    rng = np.random.default_rng(lane0 + n)
    x, xh = _ints(rng, (batch, k), dtype, 2)
    w, wh = _ints(rng, (k, n_out), dtype, 2)
    out = _poison((chunks, batch, n_out // chunks), dtype)
    gemv_chunks(x, w, chunks, out=out, lane0=lane0, n=n)
    cupy.cuda.get_current_stream().synchronize()
    _check(out, xh @ wh, np.abs(xh) @ np.abs(wh), dtype, lane0, n)


@pytest.mark.parametrize("tune", LEVELS, ids=_level_id)
@pytest.mark.parametrize("batch", [1, 32])
def test_gemv_opcode_random_bf16_at_an_issue_shape(batch, tune):
    """Batch 1 / 32 x K 2048 x N 8192 bf16, normal values: the CUDA-core / tensor-core pass within
    bf16's bound, with K long enough for many rounds of loads in flight."""
    import cupy
    from fused_cases import count_wrong, gemv_case, to_host
    from runtime_cuda.fused.gemv_opcode import gemv_chunks, unchunk
    xs, ws, want, scale = gemv_case(np.random.default_rng(7), 1, batch, 2048, 8192, "bfloat16")
    y = unchunk(gemv_chunks(xs[0], ws[0], 128, tune=tune))
    cupy.cuda.get_current_stream().synchronize()
    assert count_wrong(to_host(y, "bfloat16"), want, scale, "bfloat16") == 0


def test_gemv_opcode_refuses_bad_input():
    import cupy
    from runtime_cuda.fused.gemv_opcode import gemv_chunks
    x = cupy.zeros((2, 8), cupy.float32)
    with pytest.raises(ValueError, match="do not multiply"):
        gemv_chunks(x, cupy.zeros((9, 16), cupy.float32), 2)
    with pytest.raises(ValueError, match="chunks=3 must divide N=16"):
        gemv_chunks(x, cupy.zeros((8, 16), cupy.float32), 3)
    with pytest.raises(ValueError, match=r"lanes \[10, 20\) are outside a chunk of 2 x 8"):
        gemv_chunks(x, cupy.zeros((8, 16), cupy.float32), 2, lane0=10, n=10)
    with pytest.raises(ValueError, match="dtype float64"):
        gemv_chunks(x.astype(cupy.float64), cupy.zeros((8, 16), cupy.float64), 2)
    with pytest.raises(GC3Error, match="gemv tunable GC3_CMP_INFLIGHT=96: expected one of"):
        gemv_chunks(x, cupy.zeros((8, 16), cupy.float32), 2, tune={"GC3_CMP_INFLIGHT": 96})
