"""The four GEMM fusions on a GPU against float64 references of the same
inputs: on virtual ranks (--virtual N) or one rank per process under
`mpirun -np N` (processes may share one GPU; buffers shared by CUDA IPC).

Each round calls every operator once, back to back, on per-rank
non-default streams after a random per-rank delay, into poisoned (NaN)
output buffers; AG+GEMM has an odd row count and a list of two B, GEMM+AR
an M not divisible by n, GEMM+A2A alternates equal and skewed splits.
Everything is checked after one synchronization at the end.  Prints
"fused_gemm_check: K results checked, W wrong" and exits 1 when W > 0.

--stuck (mpirun): rank 1 skips a call; rank 0 must raise
RuntimeTimeoutError naming the wait within GC3_FUSED_TIMEOUT, not hang.
--never-set: a wait on a flag nobody releases must raise the same way.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import cupy as cp  # noqa: E402

from gc3 import settings  # noqa: E402
from gc3.errors import GC3Error, RuntimeTimeoutError  # noqa: E402
from runtime_cuda.core import streams  # noqa: E402
from runtime_cuda.fused import (IpcGemmGroup, VirtualGemmGroup, all_gather_gemm, gemm_all_reduce,  # noqa: E402
                                gemm_all_to_all, gemm_reduce_scatter, gemm_signal)
from runtime_cuda.fused import gemm_reference as ref  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--virtual", type=int, default=0, help="N virtual ranks in this process (else: mpirun)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--m", type=int, default=512, help="rows M of GEMM+RS/AR/A2A (a multiple of n)")
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--n", type=int, default=384, help="columns N")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--fused", choices=("auto", "1", "0"), default="auto")
    p.add_argument("--max-delay-ms", type=float, default=2.0)
    p.add_argument("--stuck", action="store_true")
    p.add_argument("--timeout", type=float, default=3.0, help="the watchdog's deadline for --stuck (s)")
    p.add_argument("--never-set", action="store_true")
    p.add_argument("--corrupt", action="store_true", help="spoil one result element: the check must fail")
    return p.parse_args()


def never_set(args):
    """A flag nobody releases: the wait must give up and say which it was."""
    g = VirtualGemmGroup(1)
    s = cp.cuda.Stream(non_blocking=True)
    flag = cp.zeros(1, dtype=cp.uint32)
    other = cp.cuda.Stream(non_blocking=True)
    t0 = time.monotonic()
    g.watchdog.wait(s.ptr, flag.data.ptr, 1, "test flag 'never', chunk 3, rank 0")
    ev = cp.cuda.runtime.eventCreate()
    cp.cuda.runtime.eventRecord(ev, s.ptr)
    with streams.current(other):   # work queued behind the stuck wait must still run
        after = cp.arange(10, dtype=cp.float32).sum()
    try:
        g.watchdog.synchronize([ev])
    except RuntimeTimeoutError as exc:
        dt = time.monotonic() - t0
        other.synchronize()
        ok = "chunk 3, rank 0" in str(exc) and dt < g.watchdog.timeout + 10 and float(after) == 45.0
        print(f"never-set: raised after {dt:.1f} s: {exc}")
        print("WATCHDOG OK" if ok else "WATCHDOG WRONG")
        return 0 if ok else 1
    print("WATCHDOG WRONG: the wait on a flag nobody sets returned")
    return 1


def stuck(args):
    from mpi4py import MPI

    cp.cuda.Device(MPI.COMM_WORLD.rank % cp.cuda.runtime.getDeviceCount()).use()
    g = IpcGemmGroup(MPI.COMM_WORLD)
    M, K, N = 256, 64, 64
    A = ref.matrix(1, g.rank, "A", (M, K), args.dtype)
    B = ref.matrix(1, g.rank, "B", (K, N), args.dtype)
    gemm_reduce_scatter(A, B, g, fused=True)   # one good call registers the shape (a collective step) on both
    g.synchronize()
    # Only now the short deadline: the first call may wait for a peer still compiling its kernels.
    g.watchdog.timeout = args.timeout
    MPI.COMM_WORLD.Barrier()
    code = 0
    if g.rank == 0:
        t0 = time.monotonic()
        try:
            gemm_reduce_scatter(A, B, g, fused=True)
            g.synchronize()
            print("WATCHDOG WRONG: rank 0's call returned without rank 1")
            code = 1
        except RuntimeTimeoutError as exc:
            dt = time.monotonic() - t0
            ok = "from rank 1" in str(exc) and dt < g.watchdog.timeout + 10
            print(f"stuck: rank 0 raised after {dt:.1f} s: {exc}")
            print("WATCHDOG OK" if ok else "WATCHDOG WRONG")
            code = 0 if ok else 1
    MPI.COMM_WORLD.Barrier()
    return code


def main():
    args = parse()
    if args.never_set:
        return never_set(args)
    if args.stuck:
        return stuck(args)
    dtype = args.dtype
    if args.virtual:
        g = VirtualGemmGroup(args.virtual)
    else:
        from mpi4py import MPI

        cp.cuda.Device(MPI.COMM_WORLD.rank % cp.cuda.runtime.getDeviceCount()).use()
        g = IpcGemmGroup(MPI.COMM_WORLD)
    n, local = g.n, g.local
    virtual = bool(args.virtual)
    fused = {"auto": None, "1": True, "0": False}[args.fused]
    M, K, N = args.m, args.k, args.n
    if M % n:
        raise SystemExit(f"--m {M} must be a multiple of n={n}")
    user = {r: cp.cuda.Stream(non_blocking=True) for r in local}
    rnd = random.Random(args.seed * 1000 + (local[0] if not virtual else 0))
    arg = (lambda per: per) if virtual else (lambda per: per[0])
    strm = [user[r] for r in local] if virtual else user[local[0]]
    checks = []   # (what, result, reference thunk)

    def delay():
        for r in local:
            gemm_signal.spin(user[r].ptr, rnd.uniform(0, args.max_delay_ms) * 1e-3)
        if not virtual:
            time.sleep(rnd.uniform(0, args.max_delay_ms) * 1e-3)

    def inputs(seed, name, shape_of):
        """Every rank's input (for the reference) and the local ranks' list."""
        every = [ref.matrix(seed, r, name, shape_of(r), dtype, user.get(r)) for r in range(n)]
        return every, [every[r] for r in local]

    # Partials rounded to the input's type before the sum carry one more rounding each.
    rounded_partials = settings.get("GC3_FUSED_PARTIALS") == "input" and dtype != "float32"

    def summed(As, Bs, rows):
        """The reference of a sum of per-rank products (rows `rows`), with the slack of
        16-bit partials where they are sent."""
        want = ref.reduce_scatter_ref(As, Bs)[rows]
        return (want, ref.partials_slack(As, Bs, dtype)[rows]) if rounded_partials else want

    def poisoned(shape_of):
        out = []
        for r in local:
            with streams.current(user[r]):
                out.append(ref.poison(shape_of(r), dtype))
        return out

    # bad input: a clear error, before anything is queued
    try:
        gemm_reduce_scatter(arg([cp.zeros((M + 1, K), ref.storage(dtype))] * len(local)),
                            arg([cp.zeros((K, N), ref.storage(dtype))] * len(local)), g)
        checks.append(("odd M for reduce-scatter", None, "no error"))
    except GC3Error as exc:
        if "cannot be scattered evenly" not in str(exc):
            checks.append(("odd M for reduce-scatter", None, f"unclear error: {exc}"))

    for rnd_i in range(args.rounds):
        seed = args.seed * 100 + rnd_i
        # GEMM + reduce-scatter
        As, A = inputs(seed, "rsA", lambda r: (M, K))
        Bs, B = inputs(seed, "rsB", lambda r: (K, N))
        delay()
        out = poisoned(lambda r: (M // n, N))
        got = gemm_reduce_scatter(arg(A), arg(B), g, out=arg(out), stream=strm, fused=fused)
        for i, r in enumerate(local):
            checks.append((f"round {rnd_i} gemm_reduce_scatter rank {r}", out[i],
                           lambda As=As, Bs=Bs, r=r: summed(As, Bs, slice(r * M // n, (r + 1) * M // n))))
        assert (got if virtual else [got])[0] is out[0]
        # GEMM + all-reduce, M not divisible by n
        Ma = M + 1
        As, A = inputs(seed, "arA", lambda r: (Ma, K))
        Bs, B = inputs(seed, "arB", lambda r: (K, N))
        delay()
        out = poisoned(lambda r: (Ma, N))
        gemm_all_reduce(arg(A), arg(B), g, out=arg(out), stream=strm, fused=fused)
        for i, r in enumerate(local):
            checks.append((f"round {rnd_i} gemm_all_reduce rank {r}", out[i],
                           lambda As=As, Bs=Bs: summed(As, Bs, slice(None))))
        # all-gather + GEMM: odd rows per rank, per-rank widths, a list of two B, gathered A returned
        m = M // n + 1
        As, A = inputs(seed, "agA", lambda r: (m, K))
        B1s, B1 = inputs(seed, "agB1", lambda r: (K, N // n + 8 * r))
        B2s, B2 = inputs(seed, "agB2", lambda r: (K, 64))
        delay()
        o1 = poisoned(lambda r: (n * m, N // n + 8 * r))
        o2 = poisoned(lambda r: (n * m, 64))
        ga, _ = all_gather_gemm(arg(A), arg([[x, y] for x, y in zip(B1, B2)]), g, return_a=True,
                                out=arg([[x, y] for x, y in zip(o1, o2)]), stream=strm, fused=fused)
        ga = ga if virtual else [ga]
        for i, r in enumerate(local):
            checks.append((f"round {rnd_i} all_gather_gemm B1 rank {r}", o1[i],
                           lambda As=As, b=B1s[r]: ref.all_gather_ref(As, b)))
            checks.append((f"round {rnd_i} all_gather_gemm B2 rank {r}", o2[i],
                           lambda As=As, b=B2s[r]: ref.all_gather_ref(As, b)))
            checks.append((f"round {rnd_i} all_gather_gemm gathered A rank {r}", ga[i],
                           lambda As=As: cp.concatenate([ref.f64(a) for a in As])))
        # GEMM + all-to-all: equal splits, then a skewed split different on every rank
        if rnd_i % 2:
            skew = [M - (n - 1) * 8] + [8] * (n - 1)
            S = [skew[-r:] + skew[:-r] if r else skew for r in range(n)]
        else:
            S = [[M // n] * n for _ in range(n)]
        As, A = inputs(seed, "a2aA", lambda r: (M, K))
        Bs, B = inputs(seed, "a2aB", lambda r: (K, N))
        delay()
        out = poisoned(lambda r: (sum(S[s][r] for s in range(n)), N))
        gemm_all_to_all(arg(A), arg(B), S if virtual else S[local[0]], g, out=arg(out), stream=strm, fused=fused)
        for i, r in enumerate(local):
            checks.append((f"round {rnd_i} gemm_all_to_all rank {r} splits {S}", out[i],
                           lambda As=As, Bs=Bs, S=S, r=r: ref.all_to_all_ref(As, Bs, S, r)))

    # the current-stream path: s.use(), stream=None; the current stream must stay s
    s = user[local[0]]
    s.use()
    As, A = inputs(args.seed + 7, "curA", lambda r: (M, K))
    Bs, B = inputs(args.seed + 7, "curB", lambda r: (K, N))
    for r in local:   # the inputs were made on their ranks' streams
        user[r].synchronize()
    got = gemm_all_reduce(arg(A), arg(B), g, fused=fused)
    if cp.cuda.get_current_stream().ptr != s.ptr:
        checks.append(("current stream", None, "the call changed CuPy's current stream"))
    for i, r in enumerate(local):
        checks.append((f"current-stream gemm_all_reduce rank {r}", (got if virtual else [got])[i],
                       lambda As=As, Bs=Bs: summed(As, Bs, slice(None))))

    g.synchronize()
    for r in local:
        user[r].synchronize()
    if args.corrupt:
        checks[1][1][0, 0] = checks[1][1][0, 1] * 2 + 1
    wrong = []
    for what, result, expected in checks:
        if result is None:
            wrong.append(f"{what}: {expected}")
            continue
        want = expected()
        want, slack = want if isinstance(want, tuple) else (want, 0)
        bad = ref.mismatch(result, want, dtype, what, slack)
        if bad:
            wrong.append(bad)
    for w in wrong[:20]:
        print("MISMATCH", w)
    where = f"virtual {n}" if virtual else f"rank {local[0]} of {n}"
    print(f"fused_gemm_check ({where}, release={g.watchdog.release_backend}, wait={g.watchdog.wait_backend}, "
          f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}): "
          f"{len(checks)} results checked, {len(wrong)} wrong")
    g.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
