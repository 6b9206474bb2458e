"""Benchmark of the GEMM fusions (runtime_cuda/fused/gemm.py), bf16.

    python scripts/bench_fused_gemm.py --compute-only --ranks 4   one GPU: the compute side only (< 1 min)
    python scripts/bench_fused_gemm.py --virtual 2 [--quick]       every rank on one GPU, one process
    mpirun -np 4 python scripts/bench_fused_gemm.py [--quick]      one rank per process (GPU rank % count)
    python -m runtime_cuda.benchmarks.fused_gemm ...               the same, as a module

Per shape, with CUDA events, median over --iters per rank, max across ranks:
  T_gemm          one cuBLAS call of the rank's whole GEMM (same output type as the fused path)
  T_gemm_chunked  the fused path's GEMM: one call per destination chunk (n chunks, rank-swizzled order),
                  each followed by a flag release; and the ratio T_gemm_chunked / T_gemm
  release, wait   the cost of one flag release (each backend available) and of one wait on a set flag
  T_comm_ce       the operator's exchange alone (gc3's copy-engine transfers + fp32 sum), run with the GEMM
                  emptied (K = 0, or no B columns for AG+GEMM): the same bytes move
  T_comm_nccl     NCCL's collective on the unfused data (only with one GPU per process: NCCL refuses two
                  ranks on one GPU)
  T_seq           the sequential path (one cuBLAS call, then the same exchange); T_seq_nccl = T_gemm + T_comm_nccl
  T_fused         the fused operator
  overlap         1 - (T_fused - T_gemm) / T_comm (T_comm_nccl where measured, else T_comm_ce)
  check           the fused result against a float64 reference on sampled rows (bf16 rel 2e-2)
With --virtual the ranks share one GPU: their GEMMs and copies compete, so the times of the whole
operator say how the pieces fit together, not how fast n GPUs would be.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List, Optional

from gc3 import settings

OPS = ("gemm_reduce_scatter", "all_gather_gemm", "gemm_all_reduce", "gemm_all_to_all")


def shapes(n: int, quick: bool) -> List[Dict]:
    """The benchmark's shapes for n ranks (n = 2 and 4 as given; other n take n = 4's).
    Each: op, M (total rows for RS/AR/AG, per-rank rows for A2A), K (per-rank K for RS/AR, full K for AG),
    N (full N for RS/AR/A2A, per-rank N for AG), splits ('equal' or 'skewed')."""
    if quick:
        return ([dict(op=op, M=1024, K=1024, N=1024, splits="equal") for op in OPS]
                + [dict(op="gemm_all_to_all", M=1024, K=1024, N=1024, splits="skewed")])
    k_rs = 14336 if n == 2 else 7168
    n_ag = 14336 if n == 2 else 7168
    out = []
    for M in (4096, 8192):
        out.append(dict(op="gemm_reduce_scatter", M=M, K=k_rs, N=8192, splits="equal"))
        out.append(dict(op="gemm_all_reduce", M=M, K=k_rs, N=8192, splits="equal"))
        out.append(dict(op="all_gather_gemm", M=M, K=8192, N=n_ag, splits="equal"))
    out.append(dict(op="all_gather_gemm", M=1024 * n, K=4096, N=4096 // n, splits="equal"))   # balanced (JAX)
    for split in ("equal", "skewed"):
        out.append(dict(op="gemm_all_to_all", M=4096, K=4096, N=4096, splits=split))
    return out


def split_vector(kind: str, M: int, n: int, rank: int) -> List[int]:
    """Equal, or skewed: half the rows to one destination (a different one per rank), the rest shared."""
    if kind == "equal":
        base = [M // n] * n
        base[-1] += M - sum(base)
        return base
    if n == 1:
        return [M]
    rest = M - M // 2
    v = [rest // (n - 1)] * n
    v[(rank + 1) % n] = M // 2
    v[rank] += rest - (rest // (n - 1)) * (n - 1)
    return v


def local_dims(s: Dict, n: int):
    """(A shape, B shape, rows per chunk) of one rank."""
    if s["op"] == "all_gather_gemm":
        m = s["M"] // n
        return (m, s["K"]), (s["K"], s["N"]), m
    return (s["M"], s["K"]), (s["K"], s["N"]), s["M"] // n


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--virtual", type=int, default=0, help="N virtual ranks on this GPU (else: one rank per process)")
    p.add_argument("--compute-only", action="store_true", help="only T_gemm, T_gemm_chunked and flag costs")
    p.add_argument("--ranks", type=int, default=0, help="n for --compute-only (shapes and chunk count)")
    p.add_argument("--quick", action="store_true", help="small shapes")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated operator names to run")
    p.add_argument("--json", default="", help="also write the rows to this file")
    return p.parse_args(argv)


# --- timing ------------------------------------------------------------------------
class Timer:
    """Median of per-iteration CUDA-event times on one stream, in ms."""

    def __init__(self, stream):
        import cupy

        self.s = stream
        self.cp = cupy

    def median(self, fn, iters: int, warmup: int) -> float:
        cp = self.cp
        for _ in range(warmup):
            fn()
        self.s.synchronize()
        times = []
        for _ in range(iters):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(self.s)
            fn()
            b.record(self.s)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        return statistics.median(times)


def compute_side(s: Dict, n: int, args, stream) -> Dict:
    """T_gemm (one cuBLAS call) and T_gemm_chunked (the n calls of the fused path, in its order, a flag
    release after each), with the fused path's output type (fp32 partials for the sums, bf16 otherwise).
    AG+GEMM multiplies the gathered A (n copies of the rank's rows) by its B."""
    import cupy

    from runtime_cuda.core import streams
    from runtime_cuda.fused import gemm as G
    from runtime_cuda.fused import gemm_reference as ref
    from runtime_cuda.fused import gemm_signal as sig

    a_shape, b_shape, rows = local_dims(s, n)
    ag = s["op"] == "all_gather_gemm"
    fp32_out = s["op"] in ("gemm_reduce_scatter", "gemm_all_reduce")
    bf16 = G.TYPES["uint16"][1]
    out_type, osz = (G._R_32F, 4) if fp32_out else (bf16, 2)
    a = ref.matrix(1, 0, "A", a_shape, "bfloat16", stream)
    b = ref.matrix(1, 0, "B", b_shape, "bfloat16", stream)
    K, N = b_shape
    with streams.current(stream):
        full = cupy.concatenate([a] * n) if ag else a
        c = cupy.empty((full.shape[0], N), dtype=cupy.float32 if fp32_out else cupy.uint16)
        flag = cupy.zeros(1, dtype=cupy.uint32)
    m = full.shape[0]
    if s["op"] == "gemm_all_to_all":
        v = split_vector(s["splits"], m, n, 0)
        bounds = [sum(v[:d]) for d in range(n + 1)]
    else:
        bounds = G.row_bounds(m, n)
    order = G.arrival_order(0, n) if ag else G.peers_first(0, n)
    handle = cupy.cuda.cublas.create()
    backend = sig.release_backend()
    epoch = [0]

    def whole():
        G.gemm_rows(handle, stream, full.data.ptr, b.data.ptr, c.data.ptr, m, K, N, bf16, out_type)

    def chunked():
        for d in order:
            lo, hi = bounds[d], bounds[d + 1]
            G.gemm_rows(handle, stream, full.data.ptr + lo * K * 2, b.data.ptr, c.data.ptr + lo * N * osz,
                        hi - lo, K, N, bf16, out_type)
            epoch[0] += 1
            sig.release(stream.ptr, flag.data.ptr, epoch[0], backend)

    t = Timer(stream)
    t_gemm = t.median(whole, args.iters, args.warmup)
    t_chunk = t.median(chunked, args.iters, args.warmup)
    cupy.cuda.cublas.destroy(handle)
    return dict(t_gemm=t_gemm, t_gemm_chunked=t_chunk, chunk_ratio=t_chunk / t_gemm, chunks=n,
                release=backend, rows_per_chunk=rows)


def flag_costs(stream, reps: int = 2000) -> Dict:
    """µs per release (each backend available) and per wait on a flag already set."""
    import cupy

    from runtime_cuda.core import cudadriver, streams
    from runtime_cuda.fused import gemm_signal as sig
    from runtime_cuda.fused.groups import VirtualGemmGroup

    with streams.current(stream):
        flag = cupy.zeros(1, dtype=cupy.uint32)
    t = Timer(stream)
    out = {}
    backends = ["kernel"] + (["driver"] if cudadriver.driver() is not None else [])
    for b in backends:
        out[f"release_{b}_us"] = 1000 * t.median(
            lambda b=b: [sig.release(stream.ptr, flag.data.ptr, 1, b) for _ in range(reps)], 3, 1) / reps
    g = VirtualGemmGroup(1)
    out["wait_kernel_us"] = 1000 * t.median(
        lambda: [g.watchdog.wait(stream.ptr, flag.data.ptr, 1, "benchmark flag") for _ in range(reps)], 3, 1) / reps
    if cudadriver.driver() is not None:
        out["wait_driver_us"] = 1000 * t.median(
            lambda: [cudadriver.wait_value32(stream.ptr, flag.data.ptr, 1) for _ in range(reps)], 3, 1) / reps
    g.watchdog.check()
    g.close()
    return out


# --- the operators ---------------------------------------------------------------------
def run_operator(s: Dict, group, args, user, mpi) -> Dict:
    """T_fused, T_seq, T_comm_ce (and T_comm_nccl with one GPU per process), checked."""
    import cupy

    from runtime_cuda.fused import gemm as G
    from runtime_cuda.fused import gemm_reference as ref

    n, local = group.n, group.local
    virtual = len(local) > 1 or args.virtual
    a_shape, b_shape, _ = local_dims(s, n)
    arg = (lambda per: per) if virtual else (lambda per: per[0])
    strm = [user[r] for r in local] if virtual else user[local[0]]
    A = [ref.matrix(2, r, "A", a_shape, "bfloat16", user[r]) for r in local]
    B = [ref.matrix(2, r, "B", b_shape, "bfloat16", user[r]) for r in local]
    empty_A = [cupy.empty((a_shape[0], 0), dtype=cupy.uint16) for _ in local]
    empty_B = [cupy.empty((0, b_shape[1]), dtype=cupy.uint16) for _ in local]
    none_B = [cupy.empty((b_shape[0], 0), dtype=cupy.uint16) for _ in local]
    op = getattr(G, s["op"])
    S = [split_vector(s["splits"], a_shape[0], n, r) for r in range(n)]

    def call(fused, a=A, b=B):
        if s["op"] == "gemm_all_to_all":
            return op(arg(a), arg(b), S if virtual else S[local[0]], group, stream=strm, fused=fused)
        return op(arg(a), arg(b), group, stream=strm, fused=fused)

    def timed(fn) -> float:
        """Median over iterations per rank, max across ranks (events on each rank's stream)."""
        for _ in range(args.warmup):
            fn()
        group.synchronize()
        per_rank = {r: [] for r in local}
        for _ in range(args.iters):
            if mpi is not None:
                mpi.Barrier()
            evs = {r: (cupy.cuda.Event(), cupy.cuda.Event()) for r in local}
            for r in local:
                evs[r][0].record(user[r])
            fn()
            for r in local:
                evs[r][1].record(user[r])
            group.synchronize()
            for r in local:
                evs[r][1].synchronize()
                per_rank[r].append(cupy.cuda.get_elapsed_time(*evs[r]))
        worst = max(statistics.median(v) for v in per_rank.values())
        return max(mpi.allgather(worst)) if mpi is not None else worst

    row = dict(T_fused=timed(lambda: call(True)), T_seq=timed(lambda: call(False)))
    if s["op"] == "all_gather_gemm":
        row["T_comm_ce"] = timed(lambda: call(True, b=none_B))
    else:
        row["T_comm_ce"] = timed(lambda: call(True, a=empty_A, b=empty_B))
    # data check on sampled rows, fused result, after everything above
    got = call(True)
    group.synchronize()
    row["check"] = check(s, got if virtual else [got], A, B, S, n, local, mpi, a_shape, b_shape)
    return row


def check(s, got, A, B, S, n, local, mpi, a_shape, b_shape, rows: int = 64) -> str:
    """Compare sampled rows of each local result with float64; inputs of remote ranks are rebuilt from the seed."""
    from runtime_cuda.fused import gemm_reference as ref

    every_A = [A[local.index(r)] if r in local else ref.matrix(2, r, "A", a_shape, "bfloat16") for r in range(n)]
    every_B = [B[local.index(r)] if r in local else ref.matrix(2, r, "B", b_shape, "bfloat16") for r in range(n)]
    bad = []
    # 16-bit partials (GC3_FUSED_PARTIALS=input) carry one more rounding each before the sum.
    partials = settings.get("GC3_FUSED_PARTIALS") == "input"
    for i, r in enumerate(local):
        out, slack = got[i], 0
        if s["op"] in ("gemm_reduce_scatter", "gemm_all_reduce"):
            lo = r * a_shape[0] // n if s["op"] == "gemm_reduce_scatter" else 0
            take = min(rows, a_shape[0] // n) if s["op"] == "gemm_reduce_scatter" else rows
            parts = [a[lo:lo + take] for a in every_A]
            want = ref.reduce_scatter_ref(parts, every_B)
            if partials:
                slack = ref.partials_slack(parts, every_B, "bfloat16")
        elif s["op"] == "all_gather_gemm":
            want = ref.f64(every_A[0][:rows]) @ ref.f64(every_B[r])
        else:
            take = min(rows, S[0][r])
            off = sum(S[0][:r])
            want = ref.f64(every_A[0][off:off + take]) @ ref.f64(every_B[0])
        msg = ref.mismatch(out[:want.shape[0]], want, "bfloat16", f"{s['op']} rank {r}", slack)
        if msg:
            bad.append(msg)
    verdict = "ok" if not bad else "WRONG: " + "; ".join(bad)
    if mpi is not None:
        verdicts = mpi.allgather(verdict)
        verdict = "ok" if all(v == "ok" for v in verdicts) else "; ".join(v for v in verdicts if v != "ok")
    return verdict


def nccl_comm_time(s: Dict, n: int, rank: int, mpi, args, stream) -> Optional[float]:
    """NCCL's collective on the unfused (bf16) data, one GPU per process; None where NCCL cannot run."""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < n:
        return None
    try:
        from cupy.cuda import nccl
    except Exception:
        return None
    uid = mpi.bcast(nccl.get_unique_id() if rank == 0 else None)
    comm = nccl.NcclCommunicator(n, uid, rank)
    a_shape, b_shape, _ = local_dims(s, n)
    M, N = a_shape[0], b_shape[1]
    bf16 = nccl.NCCL_BFLOAT16 if hasattr(nccl, "NCCL_BFLOAT16") else 9
    from runtime_cuda.core import streams
    with streams.current(stream):
        if s["op"] == "all_gather_gemm":
            send = cupy.zeros(a_shape, dtype=cupy.uint16)
            recv = cupy.zeros((n * a_shape[0], a_shape[1]), dtype=cupy.uint16)
        else:
            send = cupy.zeros((M, N), dtype=cupy.uint16)
            recv = cupy.zeros((M, N), dtype=cupy.uint16)
    S = [split_vector(s["splits"], M, n, q) for q in range(n)]
    with streams.current(stream):
        if s["op"] == "gemm_all_to_all":
            recv = cupy.zeros((sum(S[q][rank] for q in range(n)), N), dtype=cupy.uint16)

    def go():
        p = stream.ptr
        if s["op"] == "gemm_reduce_scatter":
            comm.reduceScatter(send.data.ptr, recv.data.ptr, M * N // n, bf16, nccl.NCCL_SUM, p)
        elif s["op"] == "gemm_all_reduce":
            comm.allReduce(send.data.ptr, recv.data.ptr, M * N, bf16, nccl.NCCL_SUM, p)
        elif s["op"] == "all_gather_gemm":
            comm.allGather(send.data.ptr, recv.data.ptr, send.size, bf16, p)
        else:
            nccl.groupStart()
            for d in range(n):
                comm.send(send.data.ptr + sum(S[rank][:d]) * N * 2, S[rank][d] * N, bf16, d, p)
                comm.recv(recv.data.ptr + sum(S[q][rank] for q in range(d)) * N * 2, S[d][rank] * N, bf16, d, p)
            nccl.groupEnd()

    t = Timer(stream).median(go, args.iters, args.warmup)
    comm.destroy()
    return max(mpi.allgather(t))


def main(argv=None) -> int:
    args = parse(argv)
    import cupy

    from runtime_cuda.fused import gemm_signal as sig

    mpi = None
    if args.compute_only:
        n = args.ranks or max(args.virtual, 2)
        rank = 0
    elif args.virtual:
        n, rank = args.virtual, 0
    else:
        from mpi4py import MPI

        mpi = MPI.COMM_WORLD
        n, rank = mpi.size, mpi.rank
        cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    stream = cupy.cuda.Stream(non_blocking=True)
    only = {x for x in args.only.split(",") if x}
    todo = [s for s in shapes(n, args.quick) if not only or s["op"] in only]
    say = print if rank == 0 else (lambda *a, **k: None)
    mode = "compute side only" if args.compute_only else (f"virtual {n} ranks on one GPU" if args.virtual
                                                          else f"{n} processes")
    say(f"# bench_fused_gemm: {name}, {mode}, bf16, release={sig.release_backend()}, wait={sig.wait_backend()}, "
        f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}, "
        f"median of {args.iters} (ms)")
    costs = flag_costs(stream)
    say("# flag costs (us): " + ", ".join(f"{k[:-3]}={v:.2f}" for k, v in costs.items()))
    group, user = None, None
    if not args.compute_only:
        from runtime_cuda.fused import IpcGemmGroup, VirtualGemmGroup

        group = VirtualGemmGroup(n) if args.virtual else IpcGemmGroup(mpi)
        user = {r: cupy.cuda.Stream(non_blocking=True) for r in group.local}
    rows = []
    for s in todo:
        row = dict(s, n=n, device=name)
        row.update(compute_side(s, n, args, stream))
        if group is not None:
            row.update(run_operator(s, group, args, user, mpi))
            if mpi is not None:
                row["T_comm_nccl"] = nccl_comm_time(s, n, rank, mpi, args, stream)
            t_comm = row.get("T_comm_nccl") or row["T_comm_ce"]
            row["overlap"] = 1 - (row["T_fused"] - row["t_gemm"]) / t_comm if t_comm else float("nan")
            if row.get("T_comm_nccl"):
                row["T_seq_nccl"] = row["t_gemm"] + row["T_comm_nccl"]
        rows.append(row)
        say(format_row(row))
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(dict(device=name, mode=mode, flag_costs_us=costs, rows=rows), f, indent=1)
    if group is not None:
        group.close()
    wrong = [r for r in rows if r.get("check", "ok") != "ok"]
    return 1 if wrong else 0


def format_row(r: Dict) -> str:
    head = (f"{r['op']:<20} M={r['M']:<5} K={r['K']:<5} N={r['N']:<5} {r['splits']:<6} n={r['n']} "
            f"T_gemm={r['t_gemm']:.3f} T_gemm_chunked={r['t_gemm_chunked']:.3f} "
            f"(x{r['chunk_ratio']:.3f}, {r['chunks']} chunks of {r['rows_per_chunk']} rows)")
    if "T_fused" not in r:
        return head
    tail = f" T_comm_ce={r['T_comm_ce']:.3f}"
    if r.get("T_comm_nccl"):
        tail += f" T_comm_nccl={r['T_comm_nccl']:.3f} T_seq_nccl={r['T_seq_nccl']:.3f}"
    tail += (f" T_seq={r['T_seq']:.3f} T_fused={r['T_fused']:.3f} speedup={r['T_seq'] / r['T_fused']:.3f} "
             f"overlap={r['overlap']:.2f} check={r['check']}")
    return head + tail


if __name__ == "__main__":
    sys.exit(main())
