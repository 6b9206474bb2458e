"""What storing a GEMM's tiles into a peer GPU costs the GEMM (dev tooling).

    python scripts/probe_peer_stores.py          # one process, two GPUs with peer access

A persistent TMA GEMM with the tile-store's tiles and order (runtime_cuda/torch_dist/tile_store.py)
runs on GPU 0 and stores each tile either into GPU 0 or, by peer access, into GPU 1: every tile
local; every tile far; the first three quarters far (the tile-store's order at 4 ranks: the
peers' tiles first); three of every four far, spread over the call.  A last form stores each
tile locally into the program's own stash and carries it to the peer in pieces, one a step of
the next tile's K loop ("trickle"), also timed with a local destination (what the pieces cost
the K loop by themselves).  bf16, us per call in a 20-call CUDA graph, median of 5 replays,
cuBLAS beside them; the trickled result is compared with the local one bit for bit.
Its runs and what they showed: measured/peer_stores_2xH200_2026-11-28.txt, docs/history.md.
"""
from __future__ import annotations

import cupy
import torch
import triton
import triton.language as tl

from runtime_cuda.torch_dist import tile_store

BM, BN, BK, GROUP_M = tile_store.BM, tile_store.BN, tile_store.BK, tile_store.GROUP_M
PIECE = 512     # elements of the stashed tile carried per K step
SHAPES = ((8192, 7168, 4096), (4096, 14336, 8192), (8192, 4096, 7168), (2048, 3584, 8192))
FORMS = ("local", "far", "3/4 far first", "3/4 far spread")


@triton.jit
def _place(t, pm, pn, GROUP_M: tl.constexpr):
    group = GROUP_M * pn
    first = (t // group) * GROUP_M
    size = tl.minimum(pm - first, GROUP_M)
    return first + (t % group) % size, (t % group) // size


@triton.jit
def _carry(stash, P, row, col, N, lo, hi, BN: tl.constexpr, PIECE: tl.constexpr):
    for i in range(lo, hi):
        e = i * PIECE + tl.arange(0, PIECE)
        tl.store(P + (row + e // BN).to(tl.int64) * N + col + e % BN, tl.load(stash + e))


@triton.jit
def gemm(A, B, C, P, S, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
         FORM: tl.constexpr, PIECE: tl.constexpr):
    """FORM 0-3: FORMS' stores (C local, P far); 4: the trickle into P through the stash S."""
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(B, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    me = tl.program_id(0)
    stash = S + me.to(tl.int64) * BM * BN
    s_desc = tl.make_tensor_descriptor(stash, shape=[BM, BN], strides=[BN, 1], block_shape=[BM, BN])
    pm = tl.cdiv(M, BM)
    pn = tl.cdiv(N, BN)
    kt = tl.cdiv(K, BK)
    T = pm * pn
    pieces: tl.constexpr = BM * BN // PIECE
    prev_m = -1
    prev_n = 0
    for t in tl.range(me, T, tl.num_programs(0)):
        pid_m, pid_n = _place(t, pm, pn, GROUP_M)
        acc = tl.zeros((BM, BN), tl.float32)
        for ki in range(kt):
            acc = tl.dot(a_desc.load([pid_m * BM, ki * BK]), b_desc.load([ki * BK, pid_n * BN]), acc)
            if FORM == 4:
                if (prev_m >= 0) & (ki < pieces):
                    _carry(stash, P, prev_m * BM, prev_n * BN, N, ki, ki + 1, BN, PIECE)
        if FORM == 4:
            if prev_m >= 0:
                _carry(stash, P, prev_m * BM, prev_n * BN, N, kt, pieces, BN, PIECE)
            tl.debug_barrier()
            s_desc.store([0, 0], acc.to(tl.bfloat16))
            tl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.b32 $0, $1;",
                                      "=r,r", [pid_m], dtype=tl.int32, is_pure=False, pack=1)
            tl.debug_barrier()
            prev_m = pid_m
            prev_n = pid_n
        else:
            if FORM == 0:
                far = False
            elif FORM == 1:
                far = True
            elif FORM == 2:
                far = t < (3 * T) // 4
            else:
                far = (t % 4) != 3
            c_desc = tl.make_tensor_descriptor(tl.where(far, P, C), shape=[M, N], strides=[N, 1],
                                               block_shape=[BM, BN])
            c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))
    if FORM == 4:
        if prev_m >= 0:
            _carry(stash, P, prev_m * BM, prev_n * BN, N, 0, pieces, BN, PIECE)


def _timed(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / calls)
    return sorted(times)[2]


def main() -> None:
    tile_store._ensure_allocator()
    torch.cuda.set_device(0)
    cupy.cuda.Device(0).use()
    if not torch.cuda.can_device_access_peer(0, 1):
        raise SystemExit("GPU 0 cannot reach GPU 1 by peer access")
    try:
        cupy.cuda.runtime.deviceEnablePeerAccess(1)
    except cupy.cuda.runtime.CUDARuntimeError:   # already enabled (torch may have)
        pass
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}: GEMM on GPU 0, tiles into GPU 0 or GPU 1; "
          "us per call in a 20-call graph, median of 5")
    print("| M | K | N | cuBLAS | " + " | ".join(FORMS) + " | trickle far | trickle local | trickle exact |")
    for M, K, N in SHAPES:
        a = torch.randn(M, K, device="cuda:0").bfloat16()
        b = (torch.randn(K, N, device="cuda:0") * K ** -0.5).bfloat16()
        near = torch.empty(M, N, device="cuda:0", dtype=torch.bfloat16)
        far = torch.empty(M, N, device="cuda:1", dtype=torch.bfloat16)
        stash = torch.empty(sms * BM * BN, device="cuda:0", dtype=torch.bfloat16)
        grid = (min(sms, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)

        def run(form, dst=far):
            gemm[grid](a, b, near, dst, stash, M, N, K, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, FORM=form,
                       PIECE=PIECE, num_stages=tile_store.STAGES, num_warps=tile_store.WARPS)
        row = [_timed(lambda: torch.matmul(a, b))]
        row += [_timed(lambda: run(form)) for form in range(4)]
        row += [_timed(lambda: run(4)), _timed(lambda: run(4, near))]
        run(0)
        local = near.clone()
        far.zero_()
        run(4)
        torch.cuda.synchronize()
        exact = torch.equal(far.to("cuda:0"), local)
        print(f"| {M} | {K} | {N} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {exact} |", flush=True)


if __name__ == "__main__":
    main()
