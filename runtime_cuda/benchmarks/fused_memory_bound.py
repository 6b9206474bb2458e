"""Benchmark of the compute-fused collectives (GEMV+AllReduce, embedding-bag+AllToAll) against the sequential baselines.

    mpirun --allow-run-as-root -np N python3 scripts/bench_fused.py [--quick] [--op OP]   # one rank per process
    python3 scripts/bench_fused.py --virtual N [--quick]                                   # N virtual ranks, one GPU
    python3 scripts/bench_fused.py --compute-only [--quick]                                # opcodes vs cuBLAS/CuPy
    python3 -m runtime_cuda.benchmarks.fused_memory_bound ...                              # the same, as a module

Per operator and shape (OPERATORS: operator -> bench function; the GEMM fusions have their own,
runtime_cuda/benchmarks/fused_gemm.py), times with CUDA events after warm-up, the median per
rank and the maximum across ranks:

  T_compute   the compute alone on one rank's inputs: the interpreter's opcode (a 1-rank gc3
              program whose compute steps are spread over up to 128 thread blocks, no
              communication; the fused kernels pool and multiply with the same device code)
              and cuBLAS (GEMV through CuPy/torch) or CuPy (gather + sum), with the GB/s each
              moves (weights/table rows read, inputs, output) and the ratio gc3/baseline;
  T_comm      the collective alone on the result: NCCL (one GPU per process only) and gc3's
              own program (allreduce_allpairs / alltoall_direct);
  T_seq       cuBLAS/CuPy compute, then NCCL (one GPU per process only);
  T_unf       the same compute, then gc3's collective;
  T_fused     runtime_cuda.fused's fused path (one kernel on every SM); --graph: also replayed
              from a CUDA graph, where the call allocates nothing;
  speedups    T_seq/T_fused and T_unf/T_fused; fusion is claimed ("FUSED WINS") only where
              T_fused < T_unf.
  check       the fused output against a float64 reference of the same inputs (every
              element within rtol x the sum of the magnitudes added; bf16 rtol 2e-2).

Inputs are small multiples of 1/8 drawn by a hash of (rank, tensor, index), so every rank can
regenerate any rank's inputs for the reference without communication.  Ranks sharing one GPU
(--virtual, or more processes than GPUs) time-slice it: their times show correctness and
overheads, not what N GPUs do.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional

RTOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}

# Shapes of the workloads these operators serve (GEMV+AR at decode; DLRM embedding tables), and --quick ones.
GEMV_SHAPES = {"full": [(b, k, 8192) for b in (1, 8, 32) for k in (2048, 7168, 4096)],
               "quick": [(b, k, 4096) for b in (1, 8) for k in (1024, 2048)]}
GEMV_DTYPES = ("bfloat16",)
EBAG_SHAPES = {"full": [(8, 1 << 20, 128, 32, b) for b in (2048, 8192)],   # T, rows, dim, pooling, samples/rank
               "quick": [(4, 1 << 16, 64, 8, 256)]}
EBAG_DTYPES = ("float32", "bfloat16")

_PREAMBLE = r"""
__device__ __forceinline__ float gc3_bench_value(unsigned long long i, unsigned long long seed) {
  unsigned long long z = seed * 0x9E3779B97F4A7C15ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)((int)(z % 17ull) - 8) * 0.125f;   // exact in bf16, fp16 and fp32
}
__device__ __forceinline__ unsigned long long gc3_bench_mix(unsigned long long i, unsigned long long seed) {
  unsigned long long z = (seed + 1) * 0xD1B54A32D192ED03ull + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 29);
}
"""


def _kernels():
    import cupy

    return {
        "float": cupy.ElementwiseKernel("uint64 seed", "T out", "out = (T)gc3_bench_value(i, seed)",
                                        "gc3_bench_fill", preamble=_PREAMBLE),
        "bf16": cupy.ElementwiseKernel("uint64 seed", "uint16 out",
                                       "out = (unsigned short)(__float_as_uint(gc3_bench_value(i, seed)) >> 16)",
                                       "gc3_bench_fill_bf16", preamble=_PREAMBLE),
        "at": cupy.ElementwiseKernel("int64 idx, uint64 seed", "float64 out", "out = gc3_bench_value(idx, seed)",
                                     "gc3_bench_value_at", preamble=_PREAMBLE),
        "index": cupy.ElementwiseKernel("uint64 seed, int32 rows", "int32 out",
                                        "out = (int)(gc3_bench_mix(i, seed) % (unsigned long long)rows)",
                                        "gc3_bench_index", preamble=_PREAMBLE),
    }


class Bench:
    """The ranks of this run, the GPU, and the helpers every operator's bench uses."""

    def __init__(self, virtual: int, compute_only: bool, warmup: int, iters: int, graph: bool = False):
        import cupy

        from runtime_cuda.fused import VirtualComm

        self.cupy = cupy
        self.warmup, self.iters, self.graph = warmup, iters, graph
        self.k = _kernels()
        self.world = None
        self.nccl = None          # the raw NCCL communicator, when each rank has a GPU of its own
        if compute_only:
            self.n, self.local, self.rank = 1, [0], 0
            self.comm = None
        elif virtual:
            self.n, self.local, self.rank = virtual, list(range(virtual)), 0
            self.comm = VirtualComm(virtual)
        else:
            from mpi4py import MPI

            from runtime_cuda.nccl import NcclCommunicator
            from runtime_cuda.nccl.fallback import originals

            self.world = MPI.COMM_WORLD
            self.n, self.rank = self.world.size, self.world.rank
            self.local = [self.rank]
            ndev = cupy.cuda.runtime.getDeviceCount()
            cupy.cuda.Device(self.rank % ndev).use()
            if self.n > ndev:     # NCCL refuses two ranks on one GPU
                self.comm = NcclCommunicator.from_mpi(self.world)
            else:
                uid = originals()["get_unique_id"]() if self.rank == 0 else None
                self.comm = NcclCommunicator(self.n, self.world.bcast(uid, root=0), self.rank)
                self.nccl = self.comm._nccl
        self.stream = cupy.cuda.Stream(non_blocking=True)
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self._groups: Dict[tuple, object] = {}

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def say(self, *parts) -> None:
        if self.lead:
            print(*parts, flush=True)

    def max(self, value: float) -> float:
        if self.world is None:
            return value
        from mpi4py import MPI

        return self.world.allreduce(value, op=MPI.MAX)

    def on(self):
        from runtime_cuda.core import streams

        return streams.current(self.stream)

    def time(self, fn: Callable[[], None]) -> float:
        """Median µs of `fn` (which queues its work on self.stream) on this rank; max across ranks."""
        cupy = self.cupy
        for _ in range(self.warmup):
            fn()
        self.stream.synchronize()
        if self.world is not None:
            self.world.Barrier()
        events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(self.iters)]
        for a, b in events:
            a.record(self.stream)
            fn()
            b.record(self.stream)
        self.stream.synchronize()
        return self.max(statistics.median(cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in events))

    def graph_time(self, fn: Callable[[], None]):
        """(median µs of replaying one call of `fn` captured in a CUDA graph, or None, and why not).
        Only for calls that allocate nothing while captured (the pool could hand the memory on)."""
        why, graph = "", None
        try:
            fn()
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                fn()
            finally:
                graph = self.stream.end_capture()
        except Exception as exc:     # reported in the row: capture is optional
            why = f"(not captured: {type(exc).__name__}: {exc})"
        if self.world is not None:   # every rank times the replay, or none does (time() is collective)
            why = next((w for w in self.world.allgather(why) if w), "")
        if why:
            return None, why
        return self.time(lambda: graph.launch(self.stream)), ""

    # -- inputs ---------------------------------------------------------------------------------
    def fill(self, shape, dtype: str, seed: int):
        """Hash values of `dtype` (bfloat16 as uint16 bits), on self.stream."""
        from runtime_cuda.fused.memory_bound import storage

        with self.on():
            out = self.cupy.empty(shape, dtype=storage(dtype))
            (self.k["bf16"] if dtype == "bfloat16" else self.k["float"])(seed, out)
        return out

    def fill64(self, shape, seed: int):
        with self.on():
            out = self.cupy.empty(shape, dtype=self.cupy.float64)
            self.k["float"](seed, out)
        return out

    def gc3_collective(self, name: str, args: tuple, instances: Optional[int] = None):
        """gc3's own launch group of gc3/algorithms/<name>.py (virtual ranks or this process's rank)."""
        key = (name, args, instances)
        if key not in self._groups:
            from runtime_cuda.nccl.library import compile_program

            _, prog = compile_program(name, args, instances=instances)
            if self.world is None:
                from runtime_cuda.ranks.virtual import VirtualRanks

                self._groups[key] = VirtualRanks(prog)
            else:
                from runtime_cuda.ranks.ipc import IpcRanks

                self._groups[key] = IpcRanks(prog, self.world)
        return self._groups[key]

    def compute_group(self, algo: str, args: tuple, dtype: str):
        """A 1-rank fused program on this GPU: the opcode alone, spread over `args`' compute TBs."""
        from runtime_cuda.fused.programs import fused_program
        from runtime_cuda.ranks.virtual import VirtualRanks

        key = ("compute", algo, args, dtype)
        if key not in self._groups:
            self._groups[key] = VirtualRanks(fused_program(algo, args, dtype))
        return self._groups[key]

    def compute_tbs(self) -> int:
        return 1 << (min(128, self.sms).bit_length() - 1)


def _fmt(us: Optional[float]) -> str:
    return "n/a" if us is None else f"{us:9.1f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "n/a" if a is None or b is None or b <= 0 else f"{a / b:5.2f}x"


def _row(bench: Bench, what: str, t: Dict[str, Optional[float]], gb: Dict[str, float], wrong: Optional[int],
         total: int) -> None:
    bench.say(f"{what}")
    bench.say(f"  T_compute gc3 {_fmt(t['cgc3'])} us ({gb.get('cgc3', 0):7.1f} GB/s)   baseline {_fmt(t['cbase'])} us "
              f"({gb.get('cbase', 0):7.1f} GB/s)   gc3/baseline bandwidth {_ratio(gb.get('cgc3'), gb.get('cbase'))}")
    if "fused" not in t:
        return
    wins = t["fused"] is not None and t["unf"] is not None and t["fused"] < t["unf"]
    bench.say(f"  T_comm NCCL {_fmt(t['cnccl'])}  gc3 {_fmt(t['cg3'])}   T_seq {_fmt(t['seq'])}  T_unf {_fmt(t['unf'])}"
              f"  T_fused {_fmt(t['fused'])} us   T_seq/T_fused {_ratio(t['seq'], t['fused'])}  "
              f"T_unf/T_fused {_ratio(t['unf'], t['fused'])}  {'FUSED WINS' if wins else 'no fusion win'}")
    if "graph" in t:
        bench.say(f"  T_fused replayed from a CUDA graph: {_fmt(t['graph'])} us {t.get('graph_why', '')}")
    bench.say(f"  check: {'OK' if wrong == 0 else 'WRONG'} ({wrong} of {total} elements outside the bound)")


# --- GEMV + AllReduce ---------------------------------------------------------------------------------
def bench_gemv(bench: Bench, quick: bool, compute_only: bool) -> bool:
    from runtime_cuda.fused import gemv_allreduce
    from runtime_cuda.fused.memory_bound import matmul, storage
    from runtime_cuda.nccl.constants import DTYPE_CODES, NCCL_SUM

    cupy, n, ok = bench.cupy, bench.n, True
    for dtype in GEMV_DTYPES:
        isz = storage(dtype).itemsize
        for batch, k, n_out in GEMV_SHAPES["quick" if quick else "full"]:
            xs = {r: bench.fill((batch, k), dtype, 1000 + 2 * r) for r in bench.local}
            ws = {r: bench.fill((k, n_out), dtype, 1001 + 2 * r) for r in bench.local}
            r0 = bench.local[0]
            t: Dict[str, Optional[float]] = {}
            nbytes = (k * n_out + batch * k + batch * n_out) * isz
            chunks = next(c for c in (128, 64, 32, 16, 8, 4, 2, 1) if n_out % c == 0 and n_out // c >= 64)
            solo = bench.compute_group("gemv_allreduce", (1, batch, k, n_out, chunks, 2,
                                                          min(chunks, bench.compute_tbs())), dtype)
            y = cupy.empty(batch * n_out, dtype=storage(dtype))
            t["cgc3"] = bench.time(lambda: solo.run_ptrs([y.data.ptr], [y.data.ptr], batch * n_out, dtype, "sum",
                                                         bench.stream, compute=[(xs[r0].data.ptr, ws[r0].data.ptr)]))

            def cublas():
                with bench.on():
                    matmul(xs[r0], ws[r0], dtype)
            t["cbase"] = bench.time(cublas)
            gb = {key: nbytes / (t[key] * 1e3) for key in ("cgc3", "cbase")}
            what = f"gemv_allreduce {dtype} batch {batch} K_shard {k} N {n_out}, {n} rank(s) on {bench.device}"
            if compute_only:
                _row(bench, what, t, gb, None, 0)
                continue
            outs = {r: cupy.empty((batch, n_out), dtype=storage(dtype)) for r in bench.local}
            ar = bench.gc3_collective("allreduce_allpairs", (n, 1))
            optrs = [outs[r].data.ptr for r in bench.local]
            t["cg3"] = bench.time(lambda: ar.run_ptrs(optrs, optrs, batch * n_out, dtype, "sum", bench.stream))
            t["cnccl"] = t["seq"] = None
            if bench.nccl is not None:
                code = DTYPE_CODES[dtype]
                o = outs[r0]
                t["cnccl"] = bench.time(lambda: bench.nccl.allReduce(o.data.ptr, o.data.ptr, o.size, code, NCCL_SUM,
                                                                     bench.stream.ptr))

                def seq():
                    with bench.on():
                        part = matmul(xs[r0], ws[r0], dtype)
                    bench.nccl.allReduce(part.data.ptr, o.data.ptr, o.size, code, NCCL_SUM, bench.stream.ptr)
                t["seq"] = bench.time(seq)

            def unfused():
                with bench.on():
                    parts = [matmul(xs[r], ws[r], dtype) for r in bench.local]
                ptrs = [p.data.ptr for p in parts]
                ar.run_ptrs(ptrs, optrs, batch * n_out, dtype, "sum", bench.stream)
            t["unf"] = bench.time(unfused)
            args_x = [xs[r] for r in bench.local]
            args_w = [ws[r] for r in bench.local]
            args_o = [outs[r] for r in bench.local]
            comm = bench.comm
            if bench.world is None:
                def fused_call():
                    gemv_allreduce(args_x, args_w, comm, out=args_o, stream=bench.stream, path="fused")
            else:
                def fused_call():
                    gemv_allreduce(args_x[0], args_w[0], comm, out=args_o[0], stream=bench.stream, path="fused")
            t["fused"] = bench.time(fused_call)
            if bench.graph and batch == 1:     # batch > 1 reorders the blocks through a temporary
                t["graph"], t["graph_why"] = bench.graph_time(fused_call)
            bench.stream.synchronize()
            wrong, total = _check_gemv(bench, outs, batch, k, n_out, dtype)
            ok &= wrong == 0
            what += " (fused: the GEMV + AllReduce kernel)"
            _row(bench, what, t, gb, bench.max(wrong), total)
            for d in (xs, ws, outs):
                d.clear()
    return ok


def _check_gemv(bench: Bench, outs, batch: int, k: int, n_out: int, dtype: str):
    from runtime_cuda.fused.memory_bound import to_f32

    cupy = bench.cupy
    want = cupy.zeros((batch, n_out))
    scale = cupy.zeros((batch, n_out))
    for r in range(bench.n):      # every rank's inputs, regenerated in float64
        x, w = bench.fill64((batch, k), 1000 + 2 * r), bench.fill64((k, n_out), 1001 + 2 * r)
        with bench.on():
            want += x @ w
            scale += cupy.abs(x) @ cupy.abs(w)
        del x, w
    wrong = 0
    with bench.on():
        for r in bench.local:
            got = to_f32(outs[r], dtype).astype(cupy.float64)
            wrong += int((~(cupy.abs(got - want) <= RTOL[dtype] * scale + 1e-6)).sum())
    return wrong, batch * n_out * len(bench.local)


# --- embedding-bag + AllToAll -----------------------------------------------------------------------------
def bench_ebag(bench: Bench, quick: bool, compute_only: bool) -> bool:
    from runtime_cuda.fused import embedding_bag_alltoall
    from runtime_cuda.fused.memory_bound import pool, storage
    from runtime_cuda.fused.programs import ebag_chunks

    cupy, n, ok = bench.cupy, bench.n, True
    for dtype in EBAG_DTYPES:
        isz = storage(dtype).itemsize
        for t_count, rows, dim, pooling, b in EBAG_SHAPES["quick" if quick else "full"]:
            batch = n * b
            tables = {r: bench.fill((t_count, rows, dim), dtype, 2000 + 3 * r) for r in bench.local}
            indices = {r: _indices(bench, r, t_count, batch * pooling, rows) for r in bench.local}
            with bench.on():
                offsets = cupy.ascontiguousarray(cupy.broadcast_to(
                    cupy.arange(batch + 1, dtype=cupy.int32) * pooling, (t_count, batch + 1)))
            r0 = bench.local[0]
            t: Dict[str, Optional[float]] = {}
            nbytes = t_count * batch * (pooling * (dim * isz + 4) + 4 + dim * isz)
            chunks = ebag_chunks(1, batch)
            # All B samples of rank r0's tables as one rank: the compute the fused program does per rank.
            solo = bench.compute_group("embedding_bag_alltoall",
                                       (1, t_count, rows, dim, batch, pooling, chunks, 0,
                                        min(chunks, bench.compute_tbs())), dtype)
            y = cupy.empty(batch * t_count * dim, dtype=storage(dtype))
            cmp = [(tables[r0].data.ptr, indices[r0].data.ptr, offsets.data.ptr)]
            t["cgc3"] = bench.time(lambda: solo.run_ptrs([y.data.ptr], [y.data.ptr], y.size, dtype, "sum",
                                                         bench.stream, compute=cmp))

            def gather_sum():
                with bench.on():
                    pool(tables[r0], indices[r0], offsets, dtype)
            t["cbase"] = bench.time(gather_sum)
            gb = {key: nbytes / (t[key] * 1e3) for key in ("cgc3", "cbase")}
            what = (f"embedding_bag_alltoall {dtype} T {t_count} rows {rows} dim {dim} pooling {pooling} "
                    f"samples/rank {b}, {n} rank(s) on {bench.device}")
            if compute_only:
                _row(bench, what, t, gb, None, 0)
                tables.clear()
                indices.clear()
                continue
            outs = {r: cupy.empty((n, b, t_count * dim), dtype=storage(dtype)) for r in bench.local}
            a2a = bench.gc3_collective("alltoall_direct", (n, 1), instances=4)
            optrs = [outs[r].data.ptr for r in bench.local]
            with bench.on():
                src = {r: cupy.empty(batch * t_count * dim, dtype=storage(dtype)) for r in bench.local}
            sptrs = [src[r].data.ptr for r in bench.local]
            count = batch * t_count * dim
            t["cg3"] = bench.time(lambda: a2a.run_ptrs(sptrs, optrs, count, dtype, "sum", bench.stream))
            t["cnccl"] = t["seq"] = None
            if bench.nccl is not None:
                t["cnccl"] = bench.time(lambda: _nccl_alltoall(bench, src[r0], outs[r0], dtype))

                def seq():
                    with bench.on():
                        p = pool(tables[r0], indices[r0], offsets, dtype)
                    _nccl_alltoall(bench, p, outs[r0], dtype)
                t["seq"] = bench.time(seq)

            def unfused():
                with bench.on():
                    pooled = [pool(tables[r], indices[r], offsets, dtype) for r in bench.local]
                a2a.run_ptrs([p.data.ptr for p in pooled], optrs, count, dtype, "sum", bench.stream)
            t["unf"] = bench.time(unfused)
            tl, il, ol = ([d[r] for r in bench.local] for d in (tables, indices, outs))
            comm = bench.comm
            if bench.world is None:
                def fused_call():
                    embedding_bag_alltoall(tl, il, [offsets] * n, comm, out=ol, stream=bench.stream, path="fused",
                                           check_inputs=False)
            else:
                def fused_call():
                    embedding_bag_alltoall(tl[0], il[0], offsets, comm, out=ol[0], stream=bench.stream, path="fused",
                                           check_inputs=False)
            t["fused"] = bench.time(fused_call)
            if bench.graph:     # indices hold exactly B*pooling positions: the call allocates nothing
                t["graph"], t["graph_why"] = bench.graph_time(fused_call)
            bench.stream.synchronize()
            wrong, total = _check_ebag(bench, outs, t_count, rows, dim, pooling, b, dtype)
            ok &= wrong == 0
            _row(bench, what, t, gb, bench.max(wrong), total)
            for d in (tables, indices, outs, src):
                d.clear()
    return ok


def _indices(bench: Bench, rank: int, t_count: int, nnz: int, rows: int):
    with bench.on():
        out = bench.cupy.empty((t_count, nnz), dtype=bench.cupy.int32)
        bench.k["index"](2100 + 3 * rank, rows, out)
    return out


def _nccl_alltoall(bench: Bench, send, recv, dtype: str) -> None:
    from runtime_cuda.nccl.constants import DTYPE_CODES
    from runtime_cuda.nccl.fallback import originals

    code, blk = DTYPE_CODES[dtype], send.size // bench.n
    off = blk * send.itemsize
    originals()["groupStart"]()
    for peer in range(bench.n):
        bench.nccl.send(send.data.ptr + peer * off, blk, code, peer, bench.stream.ptr)
        bench.nccl.recv(recv.data.ptr + peer * off, blk, code, peer, bench.stream.ptr)
    originals()["groupEnd"]()


def _check_ebag(bench: Bench, outs, t_count: int, rows: int, dim: int, pooling: int, b: int, dtype: str):
    """Rank p's output [n, b, T*dim] against float64 pooling of every rank's regenerated rows."""
    from runtime_cuda.fused.memory_bound import to_f32

    cupy, n = bench.cupy, bench.n
    wrong = 0
    for p in bench.local:
        with bench.on():
            got = to_f32(outs[p], dtype).astype(cupy.float64).reshape(n, b, t_count, dim)
            for r in range(n):
                idx = _indices(bench, r, t_count, n * b * pooling, rows)[:, p * b * pooling:(p + 1) * b * pooling]
                flat = (cupy.arange(t_count, dtype=cupy.int64)[:, None] * rows + idx)[:, :, None] * dim \
                    + cupy.arange(dim, dtype=cupy.int64)
                vals = bench.k["at"](flat, 2000 + 3 * r)                  # [T, b*pooling, dim]
                want = vals.reshape(t_count, b, pooling, dim).sum(axis=2).transpose(1, 0, 2)
                scale = cupy.abs(vals).reshape(t_count, b, pooling, dim).sum(axis=2).transpose(1, 0, 2)
                wrong += int((~(cupy.abs(got[r] - want) <= RTOL[dtype] * scale + 1e-6)).sum())
    return wrong, len(bench.local) * n * b * t_count * dim


# Operator -> its bench function (bench, quick, compute_only) -> all checks passed.
OPERATORS: Dict[str, Callable[[Bench, bool, bool], bool]] = {
    "gemv_allreduce": bench_gemv,
    "embedding_bag_alltoall": bench_ebag,
}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--virtual", type=int, default=0, help="N virtual ranks on this GPU instead of mpirun")
    ap.add_argument("--compute-only", action="store_true", help="only T_compute: the opcodes vs cuBLAS/CuPy, one GPU")
    ap.add_argument("--quick", action="store_true", help="smaller shapes")
    ap.add_argument("--op", choices=sorted(OPERATORS), action="append", help="operators to run (default: all)")
    ap.add_argument("--graph", action="store_true", help="also time the fused call replayed from a CUDA graph")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    # Ranks time-slicing one GPU keep their peers waiting longer than the runtime's default allows.
    os.environ.setdefault("GC3_TIMEOUT_S", "60")
    bench = Bench(a.virtual, a.compute_only, a.warmup, a.iters, a.graph)
    mode = ("compute only, one rank" if a.compute_only else f"{bench.n} virtual ranks on one GPU" if a.virtual
            else f"{bench.n} processes" + (", NCCL" if bench.nccl is not None else ", sharing GPUs: no NCCL"))
    bench.say(f"bench_fused: {bench.device} ({bench.sms} SMs), {mode}, warm-up {a.warmup}, median of {a.iters}, "
              f"times in us (max across ranks)")
    ok = True
    for name in a.op or OPERATORS:
        ok &= OPERATORS[name](bench, a.quick, a.compute_only)
    bench.say("all checks OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
