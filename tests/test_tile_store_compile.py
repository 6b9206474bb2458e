"""The tile-store GEMM's kernel (runtime_cuda/torch_dist/tile_store.py) compiles for sm_90a
without a GPU: Triton lowers it to PTX and its bundled ptxas assembles it.  Every operator, at
the group sizes the kernel unrolls differently for, in both 16-bit types; the shared memory it asks for must fit an
H100's block (a tile or stage change that overflows it would fail only at launch).  Skipped
where Triton (an optional extra) is not installed."""
import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

H100_SHARED = 227 * 1024      # the most dynamic shared memory one block may take on sm_90


@pytest.mark.parametrize("G, dtype, tile, span, chunk", [(2, "bf16", (128, 256), 1, 0), (8, "bf16", (64, 128), 1, 0),
                                                         (4, "fp16", (64, 256), 1, 0), (4, "bf16", (128, 256), 2, 0),
                                                         (2, "fp16", (128, 128), 2, 0), (8, "bf16", (128, 128), 2, 0),
                                                         (2, "bf16", (128, 256), 1, 8), (4, "fp16", (64, 256), 1, 16)])
@pytest.mark.parametrize("op", ["gemm_rs", "gemm_ar", "gemm_a2a"])
def test_the_tile_store_kernel_compiles_for_hopper(G, dtype, tile, span, chunk, op):
    """At each tile shape tile_store.tile_shape picks, tiles of two ranks' rows too, and with the
    peers' tiles left in the outbox for the copy engines (CHUNK row blocks a chunk)."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from runtime_cuda.torch_dist import tile_store as ts

    signature = {"A": f"*{dtype}", "B": f"*{dtype}", "out": f"*{dtype}", "table": "*i64", "cnt": "*i32", "M": "i32", "N": "i32",
                 "K": "i32", "rows": "i32", "first_block": "i32", "rank": "i32", "timeout_ns": "i64", "ident": "i32"}
    constexprs = {"DT": {"bf16": tl.bfloat16, "fp16": tl.float16}[dtype], "G": G, "OP": ts.OPS.index(op), "BM": tile[0],
                  "BN": tile[1], "BK": ts.BK, "GROUP_M": ts.GROUP_M, "SPAN": span, "CHUNK": chunk}
    signature.update({name: "constexpr" for name in constexprs})
    compiled = triton.compile(ASTSource(fn=ts.kernels()["gemm_exchange"], signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": ts.WARPS, "num_stages": ts.STAGES})
    assert "cp.async.bulk.wait_group 0" in compiled.asm["ptx"]      # the stores land before their flag
    assert "cubin" in compiled.asm and 0 < compiled.metadata.shared <= H100_SHARED


def _gather_kernel(G, dtype, return_a, trace):
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from runtime_cuda.torch_dist import tile_store as ts

    signature = {name: f"*{dtype}" for name in ("A", "B", "out", "A_out")}
    signature.update({"stamps": "*i64", "table": "*i64", "cnt": "*i32", "M": "i32", "N": "i32", "K": "i32",
                      "rows": "i32", "rank": "i32", "copiers": "i32", "timeout_ns": "i64", "ident": "i32"})
    constexprs = {"DT": {"bf16": tl.bfloat16, "fp16": tl.float16}[dtype], "G": G, "RETURN_A": return_a, "TRACE": trace,
                  "BM": ts.BM, "BN": ts.BN, "BK": ts.BK, "CW": ts.COPY_COLUMNS, "GROUP_M": ts.GROUP_M}
    signature.update({name: "constexpr" for name in constexprs})
    return triton.compile(ASTSource(fn=ts.kernels()["gather_gemm"], signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": ts.WARPS, "num_stages": ts.STAGES})


@pytest.mark.parametrize("G, dtype", [(2, "bf16"), (8, "bf16"), (4, "fp16")])
@pytest.mark.parametrize("return_a", [0, 1])
def test_the_all_gather_kernel_compiles_for_hopper(G, dtype, return_a):
    compiled = _gather_kernel(G, dtype, return_a, 0)
    assert "fence.acq_rel.sys" in compiled.asm["ptx"]      # the pushes are visible before their count
    # One K loop's stages: a second (a branch per source) would not fit beside the first.
    assert "cubin" in compiled.asm and 0 < compiled.metadata.shared <= H100_SHARED
    # GC3_FUSED_TRACE's build reads the clock four more times (a push's and a tile's start and end).
    traced = _gather_kernel(G, dtype, return_a, 1)
    assert traced.asm["ptx"].count("%globaltimer") >= compiled.asm["ptx"].count("%globaltimer") + 4
    assert 0 < traced.metadata.shared <= H100_SHARED
