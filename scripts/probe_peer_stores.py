"""What storing a GEMM's tiles into a peer GPU costs the GEMM (dev tooling).

    python scripts/probe_peer_stores.py          # one process, two GPUs with peer access
    python scripts/probe_peer_stores.py ce       # both GPUs at once, stores against copy engines

A persistent TMA GEMM with the tile-store's tiles and order (runtime_cuda/torch_dist/tile_store.py)
runs on GPU 0 and stores each tile either into GPU 0 or, by peer access, into GPU 1: every tile
local; every tile far; the first three quarters far (the tile-store's order at 4 ranks: the
peers' tiles first); three of every four far, spread over the call.  A last form stores each
tile locally into the program's own stash and carries it to the peer in pieces, one a step of
the next tile's K loop ("trickle"), also timed with a local destination (what the pieces cost
the K loop by themselves).  bf16, us per call in a 20-call CUDA graph, median of 5 replays,
cuBLAS beside them; the trickled result is compared with the local one bit for bit.
With `ce` (copy_engines): both GPUs run the GEMM at once and send each other half their rows,
stored across the link or carried by a copy engine chunk by chunk as the GEMM counts them.
Its runs and what they showed: measured/peer_stores_2xH200_2026-11-28.txt,
measured/peer_tiles_copy_engine_2xH200_2026-11-28.txt (the `ce` mode), docs/history.md.
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
         FORM: tl.constexpr, PIECE: tl.constexpr, CNT=None, FAR_ROWS=0, CHUNK_ROWS=1):
    """FORM 0-3: FORMS' stores (C local, P far; 2: rows below FAR_ROWS far); 4: the trickle into P
    through the stash S; 5: every tile local, and a tile of rows below FAR_ROWS counted, once it
    has landed, in CNT[its rows // CHUNK_ROWS] (after the next tile's K loop), for a copy engine
    waiting on that count."""
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
    prev_c = -1
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
        elif FORM == 5:
            _count(CNT, prev_c)
            c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
            c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))
            prev_c = tl.where(pid_m * BM < FAR_ROWS, (pid_m * BM) // CHUNK_ROWS, -1)
        else:
            if FORM == 0:
                far = False
            elif FORM == 1:
                far = True
            elif FORM == 2:
                far = pid_m * BM < FAR_ROWS
            else:
                far = (t % 4) != 3
            c_desc = tl.make_tensor_descriptor(tl.where(far, P, C), shape=[M, N], strides=[N, 1],
                                               block_shape=[BM, BN])
            c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))
    if FORM == 4:
        if prev_m >= 0:
            _carry(stash, P, prev_m * BM, prev_n * BN, N, 0, pieces, BN, PIECE)
    if FORM == 5:
        _count(CNT, prev_c)


@triton.jit
def _count(CNT, c):
    """CNT[c] += 1 (c >= 0) once this program's TMA stores have landed."""
    v = tl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.b32 $0, $1;",
                                  "=r,r", [c], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()
    tl.atomic_add(CNT + tl.maximum(v, 0), 1, mask=v >= 0, sem="release", scope="sys")


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
                       PIECE=PIECE, FAR_ROWS=3 * M // 4, num_stages=tile_store.STAGES, num_warps=tile_store.WARPS)
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


def _on_both(fn) -> None:
    for d in (0, 1):
        with torch.cuda.device(d):
            fn(d)


def _slower(work) -> float:
    """us per call of `work` (which queues 20 calls on each GPU), the slower GPU's, median of 5
    rounds."""
    times = []
    for _ in range(5):
        ev = [(torch.cuda.Event(True), torch.cuda.Event(True)) for _ in (0, 1)]
        _on_both(lambda d: ev[d][0].record())
        work()
        _on_both(lambda d: ev[d][1].record())
        for s, e in ev:
            e.synchronize()
        times.append(max(s.elapsed_time(e) for s, e in ev) * 1000 / 20)
    return sorted(times)[2]


def _both(calls) -> float:
    """calls[d]() on GPU d's current stream for d = 0, 1 at once, eager (the host queues both GPUs'
    calls in turn)."""
    _on_both(lambda d: calls[d]())
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    return _slower(lambda: [_on_both(lambda d: calls[d]()) for _ in range(20)])


def _both_graph(calls) -> float:
    """_both's calls captured as one 20-call CUDA graph a GPU, both graphs replayed at once."""
    graphs = []
    for d in (0, 1):
        with torch.cuda.device(d):
            calls[d]()
            torch.cuda.synchronize(d)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    calls[d]()
            graphs.append(g)
    return _slower(lambda: _on_both(lambda d: graphs[d].replay()))


def copy_engines() -> None:
    """Both GPUs run the GEMM at once (two ranks of GEMM + reduce-scatter) and each sends the
    first half of its rows (the peer's) to the other: by storing those tiles across the link
    ("far half"), or by storing every tile locally while a copy engine on a side stream waits
    for each 1024-row chunk's count (cuStreamWaitValue32) and copies it across ("ce half").
    Also the copies alone, and cuBLAS.  Eager, us per call, the slower GPU."""
    import faulthandler

    from runtime_cuda.core import cudadriver

    tile_store._ensure_allocator()
    for d in (0, 1):
        with torch.cuda.device(d):
            try:
                cupy.cuda.Device(d).use()
                cupy.cuda.runtime.deviceEnablePeerAccess(1 - d)
            except cupy.cuda.runtime.CUDARuntimeError:
                pass
    chunk = GROUP_M * BM
    print(f"# {torch.cuda.get_device_name(0)} x2: both GPUs at once, eager, us per call, the slower GPU, median of 5")
    print("| M | K | N | cuBLAS | local | far half | ce half | copies alone | ce half exact |")
    for M, K, N in SHAPES:
        far_rows = M // 2
        st = []
        for d in (0, 1):
            dev = f"cuda:{d}"
            with torch.cuda.device(d):
                g = torch.Generator(device=dev).manual_seed(d)
                a = torch.randn(M, K, device=dev, generator=g).bfloat16()
                b = (torch.randn(K, N, device=dev, generator=g) * K ** -0.5).bfloat16()
                st.append(dict(a=a, b=b, c=torch.empty(M, N, device=dev, dtype=torch.bfloat16),
                               recv=torch.zeros(M, N, device=dev, dtype=torch.bfloat16),
                               cnt=torch.zeros(M // chunk + 1, device=dev, dtype=torch.int32),
                               side=torch.cuda.Stream(device=d, priority=-1),
                               stash=torch.empty(1, device=dev, dtype=torch.bfloat16)))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        grid = (min(sms, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)
        per_chunk = (chunk // BM) * triton.cdiv(N, BN)
        nbytes = chunk * N * 2

        def gemm_on(d, form):
            x, y = st[d], st[1 - d]
            gemm[grid](x["a"], x["b"], x["c"], y["recv"], x["stash"], M, N, K, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M,
                       FORM=form, PIECE=PIECE, CNT=x["cnt"], FAR_ROWS=far_rows, CHUNK_ROWS=chunk,
                       num_stages=tile_store.STAGES, num_warps=tile_store.WARPS)

        def copies(d, wait: bool, after):
            """The side stream's copies, after the event `after` on the main stream.  Queued after
            the GEMM: a wait queued first could sit in front of it where the two streams share
            a hardware queue."""
            x, y = st[d], st[1 - d]
            side = x["side"]
            side.wait_event(after)
            for c in range(far_rows // chunk):
                if wait:
                    cudadriver.wait_value32(side.cuda_stream, x["cnt"].data_ptr() + 4 * c, per_chunk)
                cupy.cuda.runtime.memcpyAsync(y["recv"].data_ptr() + c * nbytes, x["c"].data_ptr() + c * nbytes,
                                              nbytes, 4, side.cuda_stream)
            torch.cuda.current_stream(d).wait_stream(side)

        def ce(d):
            st[d]["cnt"].zero_()
            zeroed = torch.cuda.Event()
            zeroed.record()
            gemm_on(d, 5)
            copies(d, True, zeroed)

        def alone(d):
            now = torch.cuda.Event()
            now.record()
            copies(d, False, now)

        row = []
        for name, pair in (("cuBLAS", [lambda: torch.matmul(st[0]["a"], st[0]["b"]),
                                       lambda: torch.matmul(st[1]["a"], st[1]["b"])]),
                           ("local", [lambda: gemm_on(0, 0), lambda: gemm_on(1, 0)]),
                           ("far half", [lambda: gemm_on(0, 2), lambda: gemm_on(1, 2)]),
                           ("ce half", [lambda: ce(0), lambda: ce(1)]),
                           ("copies alone", [lambda: alone(0), lambda: alone(1)])):
            faulthandler.dump_traceback_later(60, exit=True)
            row.append(_both(pair))
            try:
                graph = f"{_both_graph(pair):.1f}"
            except Exception as exc:    # a stream memory operation that a capture refuses
                graph = f"{type(exc).__name__}: {exc}"[:200]
            faulthandler.cancel_dump_traceback_later()
            print(f"#   {M} {K} {N} {name}: {row[-1]:.1f} eager, {graph} in a graph", flush=True)
        # When each copy ends, from the GEMM's start (both GPUs running, after the rounds above).
        marks = []
        for d in (0, 1):
            with torch.cuda.device(d):
                t0 = torch.cuda.Event(True)
                t0.record()
                st[d]["cnt"].zero_()
                zeroed = torch.cuda.Event()
                zeroed.record()
                gemm_on(d, 5)
                done = torch.cuda.Event(True)
                done.record()
                side = st[d]["side"]
                side.wait_event(zeroed)
                ends = []
                for c in range(far_rows // chunk):
                    cudadriver.wait_value32(side.cuda_stream, st[d]["cnt"].data_ptr() + 4 * c, per_chunk)
                    e = torch.cuda.Event(True)
                    e.record(side)
                    cupy.cuda.runtime.memcpyAsync(st[1 - d]["recv"].data_ptr() + c * nbytes,
                                                  st[d]["c"].data_ptr() + c * nbytes, nbytes, 4, side.cuda_stream)
                    e2 = torch.cuda.Event(True)
                    e2.record(side)
                    ends.append((e, e2))
                torch.cuda.current_stream(d).wait_stream(side)
                marks.append((t0, done, ends))
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        for d, (t0, done, ends) in enumerate(marks):
            print(f"#   GPU {d}: GEMM ends {t0.elapsed_time(done) * 1000:.0f} us; chunk ready -> copied: "
                  + ", ".join(f"{t0.elapsed_time(a) * 1000:.0f}->{t0.elapsed_time(b) * 1000:.0f}" for a, b in ends),
                  flush=True)
        for d in (0, 1):
            st[d]["recv"].zero_()
        for d in (0, 1):
            with torch.cuda.device(d):
                ce(d)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        exact = all(torch.equal(st[1 - d]["recv"][:far_rows].to(f"cuda:{d}"), st[d]["c"][:far_rows]) for d in (0, 1))
        print(f"| {M} | {K} | {N} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {exact} |", flush=True)


if __name__ == "__main__":
    import sys
    copy_engines() if sys.argv[1:] == ["ce"] else main()
