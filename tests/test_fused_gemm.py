"""The GEMM fusions' host logic on the CPU (runtime_cuda/fused/gemm.py).

A numpy stand-in for CuPy executes every device operation the operators
issue at the moment it is issued, on real host memory: cuBLAS's column-major
gemmEx, cudaMemcpyAsync between raw pointers, the flag release/wait kernels
and the fp32 sum.  So the chunk offsets, the swizzled orders, the buffer
parities and the "consumed" flags are checked on data against a float64
reference; and since a wait whose flag is not yet set when it is issued
fails here at once, the test also proves that every wait is issued after the
work that releases it (what keeps one process's virtual ranks from
deadlocking under CUDA_DEVICE_MAX_CONNECTIONS=1).  The GPU tests
(test_fused_gemm_gpu.py) check the same on a device, with real concurrency.
"""
import ctypes
import itertools
import sys
import types

import ml_dtypes
import numpy as np
import pytest

from gc3.errors import GC3Error, InputError, RuntimeTimeoutError
from runtime_cuda.core import cudadriver
from runtime_cuda.fused import gemm, gemm_signal
from runtime_cuda.fused.gemm import (all_gather_gemm, arrival_order, fuse_decision, gemm_all_reduce, gemm_all_to_all,
                                     gemm_reduce_scatter, peers_first, row_bounds)

BF16 = ml_dtypes.bfloat16


# --- the stand-in ------------------------------------------------------------------
def view(ptr, count, dtype):
    """A writable numpy view of `count` elements at raw address `ptr`."""
    dtype = np.dtype(dtype)
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr))
    return raw.view(dtype)


def colmajor(ptr, rows, cols, ld, dtype):
    dtype = np.dtype(dtype)
    base = view(ptr, (cols - 1) * ld + rows, dtype)
    return np.lib.stride_tricks.as_strided(base, shape=(rows, cols), strides=(dtype.itemsize, ld * dtype.itemsize))


_CUDA_TYPES = {0: np.float32, 2: np.float16, 14: np.uint16}


def to_f32(x, ctype):
    return (x.astype(np.uint32) << 16).view(np.float32) if ctype == 14 else x.astype(np.float32)


def from_f32(x, ctype):
    return x.astype(BF16).view(np.uint16) if ctype == 14 else x.astype(_CUDA_TYPES[ctype])


class DevArray(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    @property
    def device(self):
        return types.SimpleNamespace(id=0)


class Stream:
    count = itertools.count(100)
    current = None

    def __init__(self, non_blocking=False, ptr=None):
        self.ptr = next(Stream.count) if ptr is None else ptr

    def use(self):
        Stream.current = self
        return self

    def synchronize(self):
        pass


class NotSetYet(AssertionError):
    pass


class Deadlock(AssertionError):
    pass


class FakeCupy(types.ModuleType):
    """What runtime_cuda.fused touches of CuPy, executing on the host at issue time."""

    def __init__(self):
        super().__init__("cupy")
        self.ndarray = DevArray
        self.uint8, self.uint32 = np.uint8, np.uint32
        self.keep = []
        self.waits = self.releases = self.copies = self.gemms = 0
        self.clock = itertools.count(1)   # what a trace stamp reads: the order in which work executes
        rt = types.SimpleNamespace(
            getDevice=lambda: 0, eventDisableTiming=2, eventCreateWithFlags=lambda f: next(Stream.count),
            eventRecord=self._record, streamWaitEvent=self._wait_event, eventQuery=lambda ev: 0,
            eventDestroy=lambda ev: None, memcpyAsync=self._memcpy, CUDARuntimeError=RuntimeError,
            memsetAsync=lambda p, v, nbytes, s: self._issue(s, lambda: ctypes.memset(p, v, nbytes)))
        null = Stream(ptr=0)
        Stream.current = null
        stream_cls = type("Stream", (Stream,), {"null": null})
        self.cuda = types.SimpleNamespace(
            runtime=rt, Stream=stream_cls, ExternalStream=lambda p: Stream(ptr=p),
            get_current_stream=lambda: Stream.current, alloc_pinned_memory=self._pinned,
            cublas=types.SimpleNamespace(create=lambda: 1, destroy=lambda h: None, gemmEx=self._gemm),
            Device=lambda *a: types.SimpleNamespace(synchronize=lambda: None, use=lambda: None, id=0),
            Event=lambda: types.SimpleNamespace(record=lambda s=None: None, synchronize=lambda: None),
            get_elapsed_time=lambda a, b: 1.0)
        rt.getDeviceProperties = lambda dev: {"name": b"numpy stand-in"}
        self.RawModule = lambda code, options=(): types.SimpleNamespace(get_function=self._function)
        self.ElementwiseKernel = lambda params, out, body, name: {"gc3_f32_to_bf16": self._to_bf16}[name]
        # How issued work executes: "immediate" (at issue; a wait whose flag is
        # not set yet is an error), "streams" (each stream in order, streams
        # interleaved at random: races between streams show), "one_connection"
        # (CUDA_DEVICE_MAX_CONNECTIONS=1: one hardware queue in issue order; an
        # item starts only when its stream's previous item is done, a wait
        # kernel runs until its flag is set and holds back what follows it).
        self.mode = "immediate"
        self.queue = []
        self.last = {}     # stream -> its last queued op
        self.events = {}   # event -> the op it was recorded after

    # --- queued execution ---------------------------------------------------------
    def _issue(self, stream, run, ready=None, spins=False):
        if self.mode == "immediate":
            if ready is not None and not ready():
                raise NotSetYet("wait issued before its release")
            run()
            return
        op = types.SimpleNamespace(run=run, ready=ready or (lambda: True), prev=self.last.get(stream), done=False,
                                   spins=spins)
        self.last[stream] = op
        self.queue.append(op)

    def _record(self, ev, stream):
        self.events[ev] = self.last.get(stream) if self.mode != "immediate" else None

    def _wait_event(self, stream, ev, flags):
        target = self.events.get(ev)
        self._issue(stream, lambda: None, ready=lambda: target is None or target.done)

    def drain(self, rng=None):
        """Execute everything queued; raise Deadlock if nothing can move."""
        ops, self.queue, self.last = self.queue, [], {}
        started = lambda op: op.prev is None or op.prev.done   # noqa: E731
        if self.mode == "streams":
            while ops:
                heads = [op for op in ops if started(op) and op.ready()]
                if not heads:
                    raise Deadlock(f"{len(ops)} operations left, none can run")
                op = heads[rng.integers(len(heads))]
                op.run()
                op.done = True
                ops.remove(op)
            return
        running, i = [], 0
        while i < len(ops) or running:
            moved = False
            for op in [op for op in running if op.ready()]:
                op.done = True
                running.remove(op)
                moved = True
            if i < len(ops) and started(ops[i]) and (ops[i].spins or ops[i].ready()):
                op = ops[i]
                i += 1
                moved = True
                if op.spins:   # a spinning kernel: later items of other streams may start beside it
                    running.append(op)
                else:
                    op.run()
                    op.done = True
            if not moved:
                raise Deadlock(f"the hardware queue is stuck at item {i} of {len(ops)}")

    def __getattr__(self, name):
        """Everything else of CuPy's array API: numpy's, results kept as device arrays."""
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(np, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def on_device(*args, **kwargs):
            out = attr(*args, **kwargs)
            if isinstance(out, np.ndarray) and not isinstance(out, DevArray):
                out = out.view(DevArray)
                self.keep.append(out)
            return out
        return on_device

    @property
    def random(self):
        fake = self

        class RandomState:
            def __init__(self, seed):
                self.g = np.random.default_rng(seed)

            def standard_normal(self, shape, dtype=np.float64):
                out = self.g.standard_normal(shape, dtype=dtype).view(DevArray)
                fake.keep.append(out)
                return out
        return types.SimpleNamespace(RandomState=RandomState)

    def _alloc(self, shape, dtype, fill=None):
        a = np.empty(shape, dtype=dtype).view(DevArray)
        if fill is not None:
            a.view(np.uint8)[...] = fill
        self.keep.append(a)
        return a

    def empty(self, shape, dtype):
        return self._alloc(shape, dtype, fill=0xFF)   # NaN in every float format: unwritten output shows

    def zeros(self, shape, dtype):
        return self._alloc(shape, dtype, fill=0)

    def _pinned(self, nbytes):
        mem = self._alloc(nbytes, np.uint8, fill=0)
        mem.ptr = mem.ctypes.data
        return mem

    def _memcpy(self, dst, src, nbytes, kind, stream):
        self.copies += 1
        self._issue(stream, lambda: ctypes.memmove(dst, src, nbytes))

    def _gemm(self, handle, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo):
        assert (ta, tb, compute) == (0, 0, 68) and Stream.current is not None
        self.gemms += 1
        self._issue(Stream.current.ptr, lambda: self._gemm_now(m, n, k, A, at, lda, B, bt, ldb, C, ct, ldc))

    def _gemm_now(self, m, n, k, A, at, lda, B, bt, ldb, C, ct, ldc):
        a = to_f32(colmajor(A, m, k, lda, _CUDA_TYPES[at]), at).astype(np.float64)
        b = to_f32(colmajor(B, k, n, ldb, _CUDA_TYPES[bt]), bt).astype(np.float64)
        colmajor(C, m, n, ldc, _CUDA_TYPES[ct])[...] = from_f32((a @ b).astype(np.float32), ct)

    @staticmethod
    def _to_bf16(f, out=None):
        h = np.asarray(f, dtype=np.float32).astype(BF16).view(np.uint16).view(DevArray)
        if out is None:
            return h
        out[...] = h
        return out

    def _function(self, name):
        def release(grid, block, args, stream=None):
            self.releases += 1
            flag, value = int(args[0]), int(args[1])
            self._issue(stream.ptr, lambda: view(flag, 1, np.uint32).__setitem__(0, value))

        def wait(grid, block, args, stream=None):
            self.waits += 1
            flag, want = int(args[0]), int(args[1])
            self._issue(stream.ptr, lambda: None,
                        ready=lambda: np.int32(np.uint32((int(view(flag, 1, np.uint32)[0]) - want) & 0xFFFFFFFF)) >= 0,
                        spins=True)

        def sum_round(grid, block, args, stream=None):
            self._issue(stream.ptr, lambda: sum_now(*(int(x) for x in args)))

        def sum_now(parts, stride, nparts, count, out, kind, in_kind):
            ctype = {0: 0, 1: 14, 2: 2}
            size = 4 if in_kind == 0 else 2
            total = np.zeros(count, np.float32)
            for p in range(nparts):
                total += to_f32(view(parts + size * p * stride, count, _CUDA_TYPES[ctype[in_kind]]),
                                ctype[in_kind])
            view(out, count, _CUDA_TYPES[ctype[kind]])[...] = from_f32(total, ctype[kind])

        def stamp(grid, block, args, stream=None):
            slot = int(args[0])
            self._issue(stream.ptr, lambda: view(slot, 1, np.uint64).__setitem__(0, next(self.clock)))

        return {"gc3_flag_release": release, "gc3_flag_wait": wait, "gc3_sum_round": sum_round,
                "gc3_spin_ns": lambda *a, **k: None, "gc3_stamp": stamp}[name]


@pytest.fixture
def cp(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setenv("GC3_FUSED_RELEASE", "kernel")
    monkeypatch.delenv("GC3_FUSED_WAIT", raising=False)
    monkeypatch.delenv("GC3_FUSED", raising=False)
    monkeypatch.delenv("GC3_FUSED_TRACE", raising=False)
    monkeypatch.setattr(gemm_signal, "_kernels", lambda device: {n: fake._function(n) for n in gemm_signal.KERNELS})
    # The stand-in's pointers are host memory: the real driver (present on a GPU machine) must not see them.
    monkeypatch.setattr(cudadriver, "driver", lambda min_version=0: None)
    from runtime_cuda.fused import memory_bound
    memory_bound._bf16_round.cache_clear()   # built by the stand-in from here on; never kept for a real CuPy
    from runtime_cuda.core import streams
    monkeypatch.setattr(streams, "_setup_streams", {})
    yield fake
    memory_bound._bf16_round.cache_clear()


def group(n, trace=None):
    from runtime_cuda.fused import VirtualGemmGroup
    return VirtualGemmGroup(n, trace=trace)


def matrices(cp, rng, shapes, dtype):
    """Small integers (exact in every dtype), as device arrays, and their float64 values."""
    devs, vals = [], []
    for shape in shapes:
        v = rng.integers(-3, 4, size=shape).astype(np.float64)
        store = v.astype(BF16).view(np.uint16) if dtype == "bfloat16" else v.astype(dtype)
        d = cp._alloc(shape, store.dtype)
        d[...] = store
        devs.append(d)
        vals.append(v)
    return devs, vals


def value(x):
    x = np.asarray(x)
    return to_f32(x, 14).astype(np.float64) if x.dtype == np.uint16 else x.astype(np.float64)


def same(got, want):
    """Products of small integers summed in fp32 are exact; the one rounding to
    bf16 keeps 8 bits, so compare with bf16's relative precision."""
    got = value(got)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= 2 ** -8 * np.abs(want)), np.argwhere(~(np.abs(got - want) <= 2 ** -8 * np.abs(want)))[:5]


# --- orders and choices ----------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_swizzled_orders_visit_every_rank_once_and_start_apart(n):
    for r in range(n):
        assert sorted(peers_first(r, n)) == list(range(n)) and peers_first(r, n)[-1] == r
        assert sorted(arrival_order(r, n)) == list(range(n)) and arrival_order(r, n)[0] == r
    if n > 1:   # no two ranks send their first chunk to the same destination
        assert len({peers_first(r, n)[0] for r in range(n)}) == n


def test_row_bounds_cover_all_rows():
    for m, n in [(7, 2), (8, 4), (3, 4), (1000, 3)]:
        b = row_bounds(m, n)
        assert b[0] == 0 and b[-1] == m and all(0 <= b[i + 1] - b[i] <= -(-m // n) for i in range(n))


def test_fuse_decision(monkeypatch):
    assert fuse_decision("x", 4096, env={})[0] is True
    small, why = fuse_decision("x", 16, env={})
    assert small is False and "GC3_FUSED_MIN_ROWS" in why
    assert fuse_decision("x", 16, env={"GC3_FUSED": "1"})[0] is True
    assert fuse_decision("x", 4096, env={"GC3_FUSED": "0"})[0] is False
    assert fuse_decision("x", 4096, fused=False, env={"GC3_FUSED": "1"})[0] is False
    assert fuse_decision("x", 64, env={"GC3_FUSED_MIN_ROWS": "32"})[0] is True
    with pytest.raises(InputError, match="GC3_FUSED="):
        fuse_decision("x", 1, env={"GC3_FUSED": "yes"})
    with pytest.raises(InputError, match="GC3_FUSED_MIN_ROWS"):
        fuse_decision("x", 1, env={"GC3_FUSED_MIN_ROWS": "-1"})


def test_signal_settings():
    assert gemm_signal.release_backend({"GC3_FUSED_RELEASE": "kernel"}) == "kernel"
    expected = "driver" if cudadriver.driver() is not None else "kernel"
    assert gemm_signal.release_backend({}) == expected
    assert gemm_signal.wait_backend({}) == "kernel"
    with pytest.raises(InputError, match="GC3_FUSED_RELEASE"):
        gemm_signal.release_backend({"GC3_FUSED_RELEASE": "fast"})
    assert gemm_signal.flag_wait_timeout_s({"GC3_FUSED_TIMEOUT": "2.5"}) == 2.5
    assert gemm_signal.flag_wait_timeout_s({}) == gemm_signal.DEFAULT_TIMEOUT_S
    with pytest.raises(InputError, match="GC3_FUSED_TIMEOUT"):
        gemm_signal.flag_wait_timeout_s({"GC3_FUSED_TIMEOUT": "never"})


# --- the operators on the stand-in ---------------------------------------------------
CASES = [(n, dtype, fused) for n in (1, 2, 3, 4) for dtype in ("bfloat16", "float32") for fused in (True, False)]


@pytest.mark.parametrize("n, dtype, fused", CASES)
def test_gemm_reduce_scatter(cp, n, dtype, fused):
    rng = np.random.default_rng(n)
    M, K, N = 6 * n, 5, 7
    g = group(n)
    for call in range(5):   # past two calls per buffer copy: the 'consumed' waits are exercised
        A, Av = matrices(cp, rng, [(M, K)] * n, dtype)
        B, Bv = matrices(cp, rng, [(K, N)] * n, dtype)
        got = gemm_reduce_scatter(A, B, g, fused=fused)
        want = sum(a @ b for a, b in zip(Av, Bv))
        for r in range(n):
            same(got[r], want[r * M // n:(r + 1) * M // n])
    g.synchronize()


@pytest.mark.parametrize("n, dtype, fused", CASES)
def test_gemm_all_reduce_any_m(cp, n, dtype, fused):
    rng = np.random.default_rng(10 + n)
    g = group(n)
    for M in (2 * n + 1, 3, 3, 2 * n + 1, 8):   # uneven row blocks, and a shape used again after another
        A, Av = matrices(cp, rng, [(M, 4)] * n, dtype)
        B, Bv = matrices(cp, rng, [(4, 5)] * n, dtype)
        outs = [cp.empty((M, 5), A[0].dtype) for _ in range(n)]   # poisoned
        got = gemm_all_reduce(A, B, g, out=outs, fused=fused)
        assert all(x is o for x, o in zip(got, outs))
        for r in range(n):
            same(got[r], sum(a @ b for a, b in zip(Av, Bv)))


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fused", [True, False])
def test_partials_in_the_input_type_move_half_the_bytes_and_sum_alike(cp, monkeypatch, n, dtype, fused):
    """GC3_FUSED_PARTIALS=input: the partial products cross in the 16-bit type (buffers of half
    the size, slots and offsets in its element size) and the sums are still right."""
    monkeypatch.setenv("GC3_FUSED_PARTIALS", "input")
    rng = np.random.default_rng(30 + n)
    g = group(n)
    M, K, N = 4 * n, 5, 6
    for call in range(4):
        A, Av = matrices(cp, rng, [(M, K)] * n, dtype)
        B, Bv = matrices(cp, rng, [(K, N)] * n, dtype)
        want = sum(a @ b for a, b in zip(Av, Bv))
        got = gemm_reduce_scatter(A, B, g, fused=fused)
        for r in range(n):
            same(got[r], want[r * M // n:(r + 1) * M // n])
        for r, x in enumerate(gemm_all_reduce(A, B, g, fused=fused)):
            same(x, want)
    store = "uint16" if dtype == "bfloat16" else dtype
    assert {k[-1] for k in g._shapes if k[0] in ("gemm_reduce_scatter", "gemm_all_reduce")} == {2}
    monkeypatch.setenv("GC3_FUSED_PARTIALS", "fp32")
    gemm_reduce_scatter(A, B, g, fused=fused)
    assert ("gemm_reduce_scatter", M, N, store, 4) in g._shapes
    g.synchronize()


@pytest.mark.parametrize("n, dtype, fused", CASES)
def test_all_gather_gemm(cp, n, dtype, fused):
    rng = np.random.default_rng(20 + n)
    m, K = 3, 6
    g = group(n)
    for call in range(4):
        A, Av = matrices(cp, rng, [(m, K)] * n, dtype)
        B, Bv = matrices(cp, rng, [(K, 2 + r) for r in range(n)], dtype)
        got = all_gather_gemm(A, B, g, fused=fused)
        full = np.concatenate(Av)
        for r in range(n):
            same(got[r], full @ Bv[r])
    # a list of B sharing the gathered A, and the gathered A returned
    B2, B2v = matrices(cp, rng, [(K, 3)] * n, dtype)
    ga, got = all_gather_gemm(A, [[B[r], B2[r]] for r in range(n)], g, return_a=True, fused=fused)
    for r in range(n):
        same(ga[r], full)
        same(got[r][0], full @ Bv[r])
        same(got[r][1], full @ B2v[r])


@pytest.mark.parametrize("n, dtype, fused", CASES)
def test_gemm_all_to_all(cp, n, dtype, fused):
    rng = np.random.default_rng(30 + n)
    M, K, N = 4 * n, 3, 5
    g = group(n)
    skewed = [M - (n - 1)] + [1] * (n - 1)
    per_rank = [list(np.roll(skewed, r)) for r in range(n)]
    # same_splits: every rank passes the one vector, and says so (no exchange of vectors).
    for splits, same_splits in (([M // n] * n, False), (skewed, False), (per_rank, False),
                                ([0] * (n - 1) + [M], False), (skewed, False), ([M // n] * n, True), (skewed, True)):
        A, Av = matrices(cp, rng, [(M, K)] * n, dtype)
        B, Bv = matrices(cp, rng, [(K, N)] * n, dtype)
        got = gemm_all_to_all(A, B, splits, g, fused=fused, same_splits=same_splits)
        S = splits if isinstance(splits[0], list) else [splits] * n
        for d in range(n):
            blocks = []
            for s in range(n):
                off = sum(S[s][:d])
                blocks.append((Av[s] @ Bv[s])[off:off + S[s][d]])
            same(got[d], np.concatenate(blocks))


def test_an_empty_inner_dimension_gives_zeros(cp):
    """K = 0 (what the benchmark uses to time the exchange alone): cuBLAS
    refuses it, so the product is zeroed instead."""
    g = group(2)
    A = [cp._alloc((4, 0), np.float32) for _ in range(2)]
    B = [cp._alloc((0, 3), np.float32) for _ in range(2)]
    for got in (gemm_reduce_scatter(A, B, g), gemm_all_reduce(A, B, g), gemm_all_to_all(A, B, [1, 3], g)):
        assert all(np.array_equal(x, np.zeros_like(x)) for x in got)


def test_fused_sends_each_chunk_as_soon_as_it_is_computed(cp):
    """The issue order of the fused path: chunk d's copy comes right after
    chunk d's GEMM, before the next GEMM (the copy engine starts on it while
    the next chunk computes); the sequential path runs one GEMM first."""
    log = []
    real_gemm, real_copy = cp._gemm, cp._memcpy
    cp.cuda.cublas.gemmEx = lambda *a: (log.append("gemm"), real_gemm(*a))
    cp.cuda.runtime.memcpyAsync = lambda *a: (log.append("copy"), real_copy(*a))
    rng = np.random.default_rng(0)
    A, _ = matrices(cp, rng, [(8, 4)] * 4, "bfloat16")
    B, _ = matrices(cp, rng, [(4, 4)] * 4, "bfloat16")
    g = group(4)
    gemm_reduce_scatter(A, B, g, fused=True)
    rank0 = log[:7]   # rank 0's produce phase: 3 peer chunks then its own
    assert rank0 == ["gemm", "copy", "gemm", "copy", "gemm", "copy", "gemm"], log
    log.clear()
    gemm_reduce_scatter(A, B, g, fused=False)
    assert log[:5] == ["gemm", "copy", "copy", "copy", "copy"], log


@pytest.mark.parametrize("mode", ["immediate", "one_connection"])
def test_the_trace_stamps_every_chunk_and_tells_fused_from_sequential(cp, mode):
    """GC3_FUSED_TRACE: a GEMM-end stamp per chunk, a start and an end per
    transfer, read back per call; on the fused path each rank's first transfer
    starts before its last GEMM chunk ends, on the sequential path it does not
    (the criterion the GPU test applies to %globaltimer)."""
    cp.mode = mode
    n = 4
    rng = np.random.default_rng(1)
    A, _ = matrices(cp, rng, [(8, 4)] * n, "bfloat16")
    B, _ = matrices(cp, rng, [(4, 4)] * n, "bfloat16")
    g = group(n, trace=True)
    for fused in (True, False, True):
        gemm_reduce_scatter(A, B, g, fused=fused)
        cp.drain()
        t = g.trace
        for r in range(n):
            assert len(t.times("gemm end", r)) == (n if fused else 1)
            # the fused path computes its own chunk in place; the sequential one copies it too
            dests = sorted(set(range(n)) - ({r} if fused else set()))
            assert sorted(s.peer for s in t.stamps() if s.rank == r and s.what == "transfer start") == dests
            assert len(t.times("transfer end", r)) == len(dests)
        overlaps = [min(t.times("transfer start", r)) < max(t.times("gemm end", r)) for r in range(n)]
        assert overlaps == [fused] * n, t.format()
    assert "rank 0 gemm end" in t.format()


def test_the_trace_is_off_unless_asked_and_refuses_an_unsynchronized_read(cp, monkeypatch):
    assert group(2).trace is None
    monkeypatch.setenv("GC3_FUSED_TRACE", "1")
    g = group(2)
    assert g.trace is not None
    monkeypatch.setenv("GC3_FUSED_TRACE", "yes")
    with pytest.raises(InputError, match="GC3_FUSED_TRACE='yes'"):
        group(2)
    cp.mode = "streams"   # queued, not executed: the stamps are still 0
    rng = np.random.default_rng(2)
    A, _ = matrices(cp, rng, [(4, 4)] * 2, "float32")
    gemm_reduce_scatter(A, A, g, fused=True)
    with pytest.raises(GC3Error, match="never reached"):
        g.trace.times("gemm end")
    cp.drain(np.random.default_rng(0))
    assert len(g.trace.times("gemm end")) == 4


def test_bad_inputs_are_named(cp):
    rng = np.random.default_rng(1)
    g = group(2)
    A, _ = matrices(cp, rng, [(5, 4)] * 2, "bfloat16")
    B, _ = matrices(cp, rng, [(4, 3)] * 2, "bfloat16")
    with pytest.raises(GC3Error, match="M=5 rows cannot be scattered evenly over 2 ranks"):
        gemm_reduce_scatter(A, B, g)
    with pytest.raises(GC3Error, match="list of 2 entries"):
        gemm_all_reduce(A[0], B[0], g)
    with pytest.raises(GC3Error, match="rank 1: A .* do not match"):
        gemm_all_reduce([A[0], A[1]], [B[0], B[0].T.copy().view(DevArray)], g)
    with pytest.raises(GC3Error, match="CuPy array"):
        gemm_all_reduce([A[0], np.zeros((5, 4))], B, g)
    with pytest.raises(GC3Error, match="dtype int64 not supported"):
        gemm_all_reduce([cp._alloc((5, 4), np.int64)] * 2, B, g)
    with pytest.raises(GC3Error, match="2-D C-contiguous"):
        gemm_all_reduce([A[0][:, :2], A[1][:, :2]], B, g)
    with pytest.raises(GC3Error, match=r"splits \[4, 4\] add up to 8 rows, but A has 5"):
        gemm_all_to_all(A, B, [4, 4], g)
    with pytest.raises(GC3Error, match=r"splits\[1\]=-1"):
        gemm_all_to_all(A, B, [6, -1], g)
    with pytest.raises(GC3Error, match=r"splits\[0\]=2.5"):
        gemm_all_to_all(A, B, [2.5, 2.5], g)
    with pytest.raises(GC3Error, match="splits has 3 entries, expected one per rank"):
        gemm_all_to_all(A, B, [1, 2, 2], g)
    with pytest.raises(GC3Error, match="out: expected shape"):
        gemm_all_reduce(A, B, g, out=[cp.empty((5, 4), np.uint16)] * 2)
    with pytest.raises(GC3Error, match="VirtualGemmGroup or IpcGemmGroup"):
        gemm_all_reduce(A, B, object())


def test_a_failed_wait_is_reported_by_name_at_the_next_call(cp):
    """What the device-side deadline leaves behind (the ident of the wait that
    gave up) becomes RuntimeTimeoutError naming flag, chunk and rank."""
    rng = np.random.default_rng(2)
    g = group(2)
    A, _ = matrices(cp, rng, [(4, 4)] * 2, "float32")
    B, _ = matrices(cp, rng, [(4, 4)] * 2, "float32")
    gemm_reduce_scatter(A, B, g)
    w = g.watchdog
    ident = w._next   # the last wait issued: pretend the device gave up on it
    w._failed[0] = ident
    with pytest.raises(RuntimeTimeoutError, match=r"GC3_FUSED_TIMEOUT.*rank 1 waits for partial chunk 1 from rank 1"):
        g.synchronize()
    with pytest.raises(RuntimeTimeoutError, match="waits for partial chunk"):
        gemm_reduce_scatter(A, B, g)


def test_a_wait_issued_before_its_release_is_caught(cp, monkeypatch):
    """The stand-in can fail: issuing each rank's phases one rank after the
    other (not phase by phase) queues a wait before its release."""
    def one_rank_at_a_time(phases):
        for steps in phases.values():
            for step in steps:
                step()

    monkeypatch.setattr(gemm, "_run", one_rank_at_a_time)
    rng = np.random.default_rng(3)
    A, _ = matrices(cp, rng, [(4, 4)] * 2, "float32")
    B, _ = matrices(cp, rng, [(4, 4)] * 2, "float32")
    with pytest.raises(NotSetYet):
        gemm_reduce_scatter(A, B, group(2))


# --- queued execution: races between streams, one hardware queue ----------------------
def _queued_calls(cp, n, fused, rng, ops=("rs", "ar", "ag", "a2a")):
    """Six back-to-back calls of each operator in `ops` issued before
    anything runs (so a rank's call k+2 may meet a peer still reading call
    k); returns (results, expected) to compare after draining."""
    g = group(n)
    M, K, N = 2 * n, 3, 4
    got, want = [], []
    # One stream per rank, as separate processes have, changing from call to
    # call with a period other than the buffers' 2 (so only the 'consumed'
    # flags keep a rank from refilling a buffer its peer has not read yet).
    sets = [[cp.cuda.Stream(non_blocking=True) for _ in range(n)] for _ in range(3)]
    mixed = fused == "mixed"
    for call in range(6):
        own = sets[call % 3]
        if mixed:   # fused and sequential calls share a shape's buffers and flags
            fused = call % 3 != 1
        A, Av = matrices(cp, rng, [(M, K)] * n, "float32")
        B, Bv = matrices(cp, rng, [(K, N)] * n, "float32")
        total = sum(a @ b for a, b in zip(Av, Bv))
        if "rs" in ops:
            got += gemm_reduce_scatter(A, B, g, fused=fused, stream=own)
            want += [total[r * 2:(r + 1) * 2] for r in range(n)]
        if "ar" in ops:
            got += gemm_all_reduce(A, B, g, fused=fused, stream=own)
            want += [total] * n
        if "ag" in ops:
            Bag, Bagv = matrices(cp, rng, [(K, N)] * n, "float32")
            shards = [cp._alloc((2, K), np.float32) for _ in A]   # kept by cp until the queue has run
            for x, a in zip(shards, A):
                x[...] = a[:2]
            agA, ag = all_gather_gemm(shards, Bag, g, return_a=True, fused=fused, stream=own)
            full = np.concatenate([a[:2] for a in Av])
            got += ag + agA
            want += [full @ b for b in Bagv] + [full] * n
        if "a2a" in ops:
            splits = [M - n + 1] + [1] * (n - 1) if call % 2 else [2] * n
            got += gemm_all_to_all(A, B, splits, g, fused=fused, stream=own)
            off = [sum(splits[:d]) for d in range(n + 1)]
            want += [np.concatenate([(Av[s] @ Bv[s])[off[d]:off[d + 1]] for s in range(n)]) for d in range(n)]
    return got, want


@pytest.mark.parametrize("mode", ["streams", "one_connection"])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("fused", [True, False, "mixed"])
def test_back_to_back_calls_with_streams_interleaved(cp, mode, n, fused):
    for seed in range(2 if mode == "streams" else 1):
        cp.mode = mode
        rng = np.random.default_rng(seed)
        got, want = _queued_calls(cp, n, fused, rng)
        cp.drain(rng)
        for x, y in zip(got, want):
            same(x, y)


def test_the_interleaving_finds_a_missing_consumed_wait(cp, monkeypatch):
    """Take out the wait for the peer's 'consumed' flag: some interleaving
    then overwrites a buffer a peer has not read yet."""
    real = gemm._Rank.push

    def careless_push(self, stream, lane, d, src, dst, nbytes, chunk):
        e, self.e = self.e, 1   # epochs <= 2 skip the wait
        try:
            real(self, stream, lane, d, src, dst, nbytes, chunk)
        finally:
            self.e = e
        # the arrival flag must still carry the real epoch
        self.w.release(stream.ptr, self.st.flag(d, lane, gemm.ARRIVE, self.r), self.e)

    monkeypatch.setattr(gemm._Rank, "push", careless_push)
    cp.mode = "streams"
    for op in ("rs", "ar", "ag", "a2a"):
        wrong = 0
        for seed in range(8):
            rng = np.random.default_rng(seed)
            got, want = _queued_calls(cp, 3, True, rng, ops=(op,))
            cp.drain(rng)
            wrong += sum(not np.allclose(value(x), y) for x, y in zip(got, want))
        assert wrong > 0, op


def test_the_gpu_check_program_runs_on_the_stand_in(cp, monkeypatch, capsys):
    """tests/gpu_programs/fused_gemm_check.py (what the GPU tests run), here
    on the stand-in: its bookkeeping and references agree with the operators,
    and a spoiled result makes it fail."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "gpu_programs" / "fused_gemm_check.py"
    spec = importlib.util.spec_from_file_location("fused_gemm_check_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    small = ["--rounds", "2", "--m", "24", "--k", "8", "--n", "12", "--max-delay-ms", "0"]
    for n, extra in ((2, []), (3, ["--fused", "1"]), (4, ["--fused", "0"])):
        monkeypatch.setattr(sys, "argv", ["x", "--virtual", str(n)] + small + extra)
        assert mod.main() == 0, capsys.readouterr().out
        assert ", 0 wrong" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["x", "--virtual", "2", "--corrupt"] + small)
    assert mod.main() == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_the_benchmark_runs_on_the_stand_in(cp, monkeypatch, capsys):
    """runtime_cuda.benchmarks.fused_gemm's code paths (compute side, flag costs,
    operators fused / sequential / exchange alone, sampled check) on small
    shapes; the times are the stand-in's, meaningless."""
    from runtime_cuda.benchmarks import fused_gemm as bench

    small = [dict(op=op, M=32, K=16, N=8, splits=sp) for op, sp in
             [(op, "equal") for op in bench.OPS] + [("gemm_all_to_all", "skewed")]]
    monkeypatch.setattr(bench, "shapes", lambda n, quick: small)
    assert bench.main(["--virtual", "2", "--iters", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("check=ok") == len(small), out
    assert bench.main(["--compute-only", "--ranks", "4", "--iters", "1", "--warmup", "0"]) == 0
    assert "chunks of" in capsys.readouterr().out
