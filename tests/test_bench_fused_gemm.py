"""runtime_cuda.benchmarks.fused_gemm's shape tables and split vectors (the GPU part
runs on the device: see tests/test_fused_gemm_gpu.py for the operators)."""
import pytest

from runtime_cuda.benchmarks import fused_gemm as bench


@pytest.mark.parametrize("n", [2, 4])
def test_the_issue_shapes(n):
    rows = bench.shapes(n, quick=False)
    rs = [(r["M"], r["K"], r["N"]) for r in rows if r["op"] == "gemm_reduce_scatter"]
    assert rs == [(4096, 14336 if n == 2 else 7168, 8192), (8192, 14336 if n == 2 else 7168, 8192)]
    ag = [(r["M"], r["K"], r["N"]) for r in rows if r["op"] == "all_gather_gemm"]
    assert (1024 * n, 4096, 4096 // n) in ag and (8192, 8192, 14336 if n == 2 else 7168) in ag
    assert {r["splits"] for r in rows if r["op"] == "gemm_all_to_all"} == {"equal", "skewed"}
    for r in rows:   # per-rank chunks: at least n of them, every rank's rows whole
        a_shape, b_shape, per_chunk = bench.local_dims(r, n)
        assert a_shape[1] == b_shape[0] and per_chunk * n <= a_shape[0] * (n if r["op"] == "all_gather_gemm" else 1)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("M", [4096, 1001])
def test_split_vectors(n, M):
    for kind in ("equal", "skewed"):
        firsts = set()
        for r in range(n):
            v = bench.split_vector(kind, M, n, r)
            assert len(v) == n and sum(v) == M and min(v) >= 0
            firsts.add(max(range(n), key=v.__getitem__))
        if kind == "skewed" and n > 2:   # each rank's big block goes elsewhere
            assert len(firsts) == n


def test_quick_covers_every_operator():
    assert {r["op"] for r in bench.shapes(2, quick=True)} == set(bench.OPS)
