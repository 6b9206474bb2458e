"""The GEMM operators' fused path where the GEMM itself moves the data
(GC3_FUSED_EXCHANGE=tile-store, the default where it serves a call).

A persistent Triton GEMM (TMA loads, one output tile of BM x BN per step) stores each
finished tile by TMA straight into the buffer of the rank that needs its rows, mapped
here through CUDA IPC.  The transfer then rides on the GEMM's own epilogue: no second
kernel competes for the SMs or for HBM while the GEMM runs, which is what made every
stream-level overlap lose on these GPUs (docs/history.md).  A rank starts with the next
rank's rows, so every link carries traffic from the first tiles, and ends with its own.
Then, per operator:
  - GEMM + all-to-all: one device barrier, then the received blocks are copied into the
    caller's fresh output;
  - GEMM + reduce-scatter: one barrier, then each rank sums the G partials of its rows
    in rank order in fp32 and rounds once (the same bits whichever rank computes it);
  - GEMM + all-reduce: the same sum, stored into every rank's mapped copy of the result (a
    store across the link is fire-and-forget; a read waits out the round trip), a second
    barrier, and the copy of the whole result into the caller's fresh output.
Two launches a call (three for all-reduce), each a persistent grid of a size fixed per
shape.  Outputs come from torch's caching allocator.  Nothing syncs the host, and every
call's state is on the device, so a call is capturable in a CUDA graph (after its shape's
first eager call, which maps the buffers):
  - every program of every kernel counts the calls it has run in a word of its own (as
    the small allreduce kernels' blocks do): no two programs race on a counter, and the
    count gives the call's number and parity.  The mapped buffers alternate between two
    copies, and a rank writes parity p again only two calls later, after a barrier every
    peer reached once it had finished reading p (the argument of
    kernels/small_allreduce.cu's parity regions);
  - the barrier runs at the start of the kernel after the GEMM (whose stores the kernel
    boundary has completed): its program 0 stores the call's number into every peer's
    flag for this rank, waits until each of this rank's flags has reached it, and then
    lets the kernel's other programs go.  A wait gives up after GC3_FUSED_TIMEOUT seconds
    and names itself in the group's failure word, which the next call (or `check`)
    raises as RuntimeTimeoutError.
The buffers are the copy-engine pipeline's (runtime_cuda.fused.IpcGemmGroup over the
communicator's rendezvous), registered on a shape's first call on every rank together.
What it takes: Triton, a GPU with TMA (compute capability 9.0 and up), 16-bit inputs,
contiguous A [M, K] and B [K, N] with K and N multiples of 8, and M / G a multiple of BM;
anything else runs overlap.py's pipeline, and `refusal` says why.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Callable, Dict, Tuple

import torch

from .handover import fused_call, ipc_group

# The GEMM's tiles: 128 x 256 outputs, K in steps of 64, three stages of TMA loads in flight,
# measured against cuBLAS on H100 (scripts/probe_triton_gemm.py: 0.96-1.07x at the fused grid).
BM, BN, BK, STAGES, WARPS, GROUP_M = 128, 256, 64, 3, 8, 8
# Elements one step of the sum and copy kernels moves, and their programs per multiprocessor.
BLOCK, PER_SM = 4096, 2
MAX_RANKS = 8
# Shapes whose tables a group keeps (their mapped buffers stay with the group).
TABLE_SHAPES = 32

OPS = ("gemm_rs", "gemm_ar", "gemm_a2a")
# Keywords of a Triton launch that are options, not the kernel's parameters.
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@functools.lru_cache(maxsize=None)
def _triton_missing() -> str:
    try:
        from triton.tools import tensor_descriptor
    except Exception as exc:  # not installed, or broken
        return f"Triton is not importable ({type(exc).__name__}: {exc})"
    return "" if hasattr(tensor_descriptor, "TensorDescriptor") else "a Triton without tensor descriptors"


def refusal(pg, op: str, A: torch.Tensor, B: torch.Tensor) -> str:
    """Why the tile-store path cannot serve this call ('' when it can)."""
    why = _triton_missing()
    if why:
        return why
    G = pg.size()
    if G > MAX_RANKS:
        return f"{G} ranks (the tile-store GEMM addresses at most {MAX_RANKS})"
    if _capability(A.device) < 9:
        return "a GPU without TMA (compute capability below 9.0)"
    if A.dtype not in (torch.bfloat16, torch.float16):
        return f"{A.dtype} (the tile-store GEMM takes bfloat16 or float16)"
    M, K = A.shape
    N = B.shape[1]
    if K % 8 or N % 8:
        return f"K {K} and N {N} must be multiples of 8 (16-byte rows for TMA)"
    if M % (G * BM):
        return f"{M} rows are not {G} blocks of a multiple of {BM} rows"
    if not (A.is_contiguous() and B.is_contiguous()):
        return "strided operands"
    return ""


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


@functools.lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# --- the kernels -----------------------------------------------------------------------
# Each finds its peers' addresses in one int64 table per shape (_Shape says where) and its
# call's number in its program's counter.
def _kernels():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import globaltimer

    @triton.jit
    def _at(table, i, DT: tl.constexpr):
        return tl.load(table + i).to(tl.pointer_type(DT))

    @triton.jit
    def gemm_tiles(a_desc, b_desc, table, cnt, M, N, K, rows, first_block, DT: tl.constexpr, G: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   NUM_SMS: tl.constexpr):
        """A [M, K] @ B [K, N]; the tile of rows r goes to rank d = r // rows (table[par * G + d]:
        this rank's slot there), at row r % rows."""
        me = tl.program_id(0)
        c = tl.load(cnt + me)
        par = c & 1
        pm = tl.cdiv(M, BM)
        pn = tl.cdiv(N, BN)
        kt = tl.cdiv(K, BK)
        for t in tl.range(me, pm * pn, NUM_SMS, flatten=True):
            # GROUP_M row blocks in a row share the columns of B they read while those are in L2.
            group = GROUP_M * pn
            first = (t // group) * GROUP_M
            size = tl.minimum(pm - first, GROUP_M)
            pid_m = (first + (t % group) % size + first_block) % pm
            pid_n = (t % group) // size
            off_m = pid_m * BM
            off_n = pid_n * BN
            acc = tl.zeros((BM, BN), tl.float32)
            for ki in range(kt):
                acc = tl.dot(a_desc.load([off_m, ki * BK]), b_desc.load([ki * BK, off_n]), acc)
            d = off_m // rows
            dst = tl.make_tensor_descriptor(_at(table, par * G + d, DT), shape=[rows, N], strides=[N, 1],
                                            block_shape=[BM, BN])
            dst.store([off_m - d * rows, off_n], acc.to(DT))
        tl.store(cnt + me, c + 1)

    @triton.jit
    def _late(ptr, target, start, timeout_ns):
        """Poll *ptr until it reaches target (a wrapping difference: the counts may pass 2^31);
        1 if GC3_FUSED_TIMEOUT passed first.  Plain volatile loads: an atomic per poll from
        every waiter would queue behind the others on the same word."""
        late = 0
        v = tl.load(ptr, volatile=True)
        while ((v - target) < 0) & (late == 0):
            v = tl.load(ptr, volatile=True)
            if globaltimer() - start > timeout_ns:
                late = 1
        return late

    @triton.jit
    def _arrive(table, cnt, timeout_ns, ident, G: tl.constexpr, PEERS: tl.constexpr, MINE: tl.constexpr):
        """The barrier at a kernel's start (see the module's comment); returns the call's number.
        Program 0 alone talks to the peers and reads the failure word (host memory: a read
        from every program would queue on the bus); the others wait for its word after the
        kernel's counters, cnt[num_programs]."""
        me = tl.program_id(0)
        go = cnt + tl.num_programs(0)
        c = tl.load(cnt + me)
        target = c + 1
        start = globaltimer()
        if me == 0:
            failed = _at(table, 2 * G, tl.int32)
            if tl.load(failed, volatile=True) == 0:
                for p in tl.static_range(G):
                    tl.atomic_xchg(_at(table, PEERS + p, tl.int32), target, sem="release", scope="sys")
                mine = _at(table, MINE, tl.int32)
                late = 0
                for s in tl.static_range(G):
                    late = late | _late(mine + s, target, start, timeout_ns)
                    tl.atomic_add(mine + s, 0, sem="acquire", scope="sys")
                if late != 0:
                    tl.store(failed, ident)
            tl.atomic_xchg(go, target, sem="release", scope="gpu")
        else:
            _late(go, target, start, 2 * timeout_ns)
            tl.atomic_add(go, 0, sem="acquire", scope="gpu")
        return c

    @triton.jit
    def sum_slots(table, cnt, out, n, timeout_ns, ident, DT: tl.constexpr, G: tl.constexpr, PEERS: tl.constexpr,
                  MINE: tl.constexpr, STAGE: tl.constexpr, PUSH: tl.constexpr, BLOCK: tl.constexpr):
        """After the barrier: out (or, PUSH >= 0, every rank's copy of this rank's block:
        table[PUSH + par * G + p]) = the G partials in this rank's slots, summed in rank order
        in fp32."""
        c = _arrive(table, cnt, timeout_ns, ident, G, PEERS, MINE)
        par = c & 1
        src = _at(table, STAGE + par, DT)
        for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
            i = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            acc = tl.load(src + i, mask=m).to(tl.float32)
            for s in tl.static_range(1, G):
                acc += tl.load(src + s * n + i, mask=m).to(tl.float32)
            if PUSH >= 0:
                for p in tl.static_range(G):
                    tl.store(_at(table, PUSH + par * G + p, DT) + i, acc.to(DT), mask=m)
            else:
                tl.store(out + i, acc.to(DT), mask=m)
        tl.store(cnt + tl.program_id(0), c + 1)

    @triton.jit
    def gather(table, cnt, out, n, timeout_ns, ident, DT: tl.constexpr, G: tl.constexpr, PEERS: tl.constexpr,
               MINE: tl.constexpr, SRC: tl.constexpr, BLOCK: tl.constexpr):
        """After the barrier: block s of out (n elements each) = table[SRC + par * G + s]'s n."""
        c = _arrive(table, cnt, timeout_ns, ident, G, PEERS, MINE)
        par = c & 1
        steps = tl.cdiv(n, BLOCK)
        for b in range(tl.program_id(0), G * steps, tl.num_programs(0)):
            s = b // steps
            i = (b - s * steps).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(out + s.to(tl.int64) * n + i, tl.load(_at(table, SRC + par * G + s, DT) + i, mask=m), mask=m)
        tl.store(cnt + tl.program_id(0), c + 1)

    return {"gemm_tiles": gemm_tiles, "sum_slots": sum_slots, "gather": gather}


@functools.lru_cache(maxsize=None)
def kernels() -> Dict[str, object]:
    return _kernels()


def _ensure_allocator() -> None:
    """The GEMM makes its tiles' descriptors on the device, in scratch Triton asks the process
    for; torch's caching allocator serves it, unless the caller set an allocator of its own."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        _allocation.set_allocator(_scratch)


def _scratch(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _dt(dtype: torch.dtype):
    import triton.language as tl
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


# --- one shape's buffers -------------------------------------------------------------------
class _Shape:
    """The mapped buffers, the address table and the launches of one (op, M, K, N, dtype).

    table (int64): [0, 2G) rank d's slot for this rank's rows, by parity (p * G + d); 2G the
    group's failure word; PEER_A / PEER_B: slot `rank` of each peer's flags of the first /
    second barrier; MINE_A / MINE_B: this rank's own; STAGE: this rank's slots by parity;
    SRC: what `gather` copies out, block s (this rank's slot s, or for GEMM+AR block s of its
    copy of the result), by parity; PUSH (GEMM+AR): block `rank` of rank p's copy of the
    result, by parity.  cnt (int32, this rank only): each program's count of calls, the
    GEMM's, then the first and the second kernel's after it (each with its program 0's word
    to the others)."""

    def __init__(self, group, pg, op: str, M: int, K: int, N: int, dtype: torch.dtype):
        from runtime_cuda.fused.groups import ARRIVE

        G, me = pg.size(), pg.rank()
        self.G, self.M, self.K, self.N, self.rows, self.op = G, M, K, N, M // G, op
        item = torch.empty((), dtype=dtype).element_size()
        self.n = self.rows * N
        slot = self.n * item
        sizes = {"stage": G * slot}
        if op == "gemm_ar":
            sizes["result"] = G * slot
        st = group.shape(("tile-store", op, M, N, str(dtype)), sizes)
        self.PEER_A, self.PEER_B = 2 * G + 1, 3 * G + 1
        self.MINE_A, self.MINE_B = 4 * G + 1, 4 * G + 2
        self.STAGE, self.SRC, self.PUSH = 4 * G + 3, 4 * G + 5, 6 * G + 5
        t = [0] * (8 * G + 5)
        for p in range(2):
            for d in range(G):
                t[p * G + d] = st.buf("stage", d, p) + me * slot
            t[self.STAGE + p] = st.buf("stage", me, p)
            for s in range(G):
                t[self.SRC + p * G + s] = st.buf("result" if op == "gemm_ar" else "stage", me, p) + s * slot
                if op == "gemm_ar":
                    t[self.PUSH + p * G + s] = st.buf("result", s, p) + me * slot
        t[2 * G] = group.watchdog.failed_ptr
        for p in range(G):
            t[self.PEER_A + p] = st.flag(p, 0, ARRIVE, me)
            t[self.PEER_B + p] = st.flag(p, 1, ARRIVE, me)
        t[self.MINE_A] = st.flag(me, 0, ARRIVE, 0)
        t[self.MINE_B] = st.flag(me, 1, ARRIVE, 0)
        dev = pg._device
        self.table = torch.tensor(t, dtype=torch.int64, device=dev)
        self.first_block = ((me + 1) % G) * (self.rows // BM)
        sms = _sms(dev)
        self.gemm_grid = min(sms, (M // BM) * -(-N // BN))
        self.sum_grid = min(PER_SM * sms, -(-self.n // BLOCK))
        self.gather_grid = min(PER_SM * sms, G * -(-self.n // BLOCK))
        # The kernels after the GEMM hold one more word: their program 0's word to the others.
        words = [self.gemm_grid, 1 + (self.sum_grid if op != "gemm_a2a" else self.gather_grid)]
        if op == "gemm_ar":
            words.append(1 + self.gather_grid)
        self.cnt = torch.zeros(sum(words), dtype=torch.int32, device=dev)
        self.cnts = [self.cnt[sum(words[:i]):sum(words[:i + 1])] for i in range(len(words))]
        self.DT = _dt(dtype)
        self.sms = sms
        self.timeout_ns = int(group.watchdog.timeout * 1e9)
        names = {"A": f"the tile-store barrier A of {op} {M}x{K}x{N}", "B": f"the tile-store barrier B of {op} {M}x{K}x{N}"}
        self.idents = {k: group.watchdog.name(v) for k, v in names.items()}
        self._launches: Dict[str, Callable] = {}

    def launch(self, name: str, grid: int, *args, **constexprs) -> None:
        """kernels()[name] on (grid,) with these arguments.  The first launch goes through
        Triton's JIT, which specializes the kernel on the arguments (every one of them has
        the same value, or for tensors the same alignment, at every call of a shape); later
        ones call the compiled kernel straight, which saves most of Triton's host time."""
        run = self._launches.get(name)
        if run is None:
            compiled = kernels()[name][(grid,)](*args, **constexprs)
            values = tuple(v for k, v in constexprs.items() if k not in _LAUNCH_OPTIONS)

            def run(*args):
                stream = torch.cuda.current_stream().cuda_stream
                full = args + values
                compiled.run(grid, 1, 1, stream, compiled.function, compiled.packed_metadata,
                             compiled.launch_metadata((grid, 1, 1), stream, *full), None, None, *full)
            self._launches[name] = run
            return
        run(*args)


def _shape(pg, op: str, A: torch.Tensor, B: torch.Tensor, what: str) -> _Shape:
    """The shape's state, made on its first call (on every rank together)."""
    key = (op, A.shape[0], A.shape[1], B.shape[1], A.dtype)
    cache = pg.__dict__.setdefault("_gc3_tile_store", OrderedDict())
    got = cache.get(key)
    if got is None:
        with fused_call(pg, [A, B], what):
            got = cache[key] = _Shape(ipc_group(pg), pg, op, A.shape[0], A.shape[1], B.shape[1], A.dtype)
        if len(cache) > TABLE_SHAPES:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return got


def ready(pg, op: str, A: torch.Tensor, B: torch.Tensor) -> bool:
    """Whether this shape's buffers are mapped already (a capture cannot map them)."""
    return (op, A.shape[0], A.shape[1], B.shape[1], A.dtype) in pg.__dict__.get("_gc3_tile_store", {})


def check(pg) -> None:
    """Raise gc3.errors.RuntimeTimeoutError if a barrier of this group gave up waiting."""
    group = pg.__dict__.get("_gc3_copy_engine")
    if group is not None:
        group.watchdog.check()


def _gemm(pg, op: str, A: torch.Tensor, B: torch.Tensor, what: str) -> _Shape:
    """A call's GEMM, its tiles stored into their ranks; returns the shape's state."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    check(pg)
    sh = _shape(pg, op, A, B, what)
    _ensure_allocator()
    sh.launch("gemm_tiles", sh.gemm_grid, TensorDescriptor.from_tensor(A, [BM, BK]),
              TensorDescriptor.from_tensor(B, [BK, BN]), sh.table, sh.cnts[0], sh.M, sh.N, sh.K, sh.rows,
              sh.first_block, DT=sh.DT, G=sh.G, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, NUM_SMS=sh.sms,
              num_stages=STAGES, num_warps=WARPS)
    return sh


def _after(sh: _Shape, phase: str) -> Tuple:
    """The barrier arguments of a kernel after the GEMM (phase A) or after the sum (B)."""
    a = phase == "A"
    return sh.timeout_ns, sh.idents[phase], sh.PEER_A if a else sh.PEER_B, sh.MINE_A if a else sh.MINE_B


def matmul_reduce_scatter(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """rows r of sum_s A_s @ B_s (sum over ranks), [M/G, N]; A [M, K_r], B [K_r, N] contiguous."""
    sh = _gemm(pg, "gemm_rs", A, B, what)
    out = A.new_empty((sh.rows, sh.N))
    timeout, ident, peers, mine = _after(sh, "A")
    sh.launch("sum_slots", sh.sum_grid, sh.table, sh.cnts[1], out, sh.n, timeout, ident, DT=sh.DT, G=sh.G,
              PEERS=peers, MINE=mine, STAGE=sh.STAGE, PUSH=-1, BLOCK=BLOCK)
    return out


def matmul_all_reduce(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """sum_s A_s @ B_s on every rank, [M, N]."""
    sh = _gemm(pg, "gemm_ar", A, B, what)
    timeout, ident, peers, mine = _after(sh, "A")
    sh.launch("sum_slots", sh.sum_grid, sh.table, sh.cnts[1], sh.table, sh.n, timeout, ident, DT=sh.DT, G=sh.G,
              PEERS=peers, MINE=mine, STAGE=sh.STAGE, PUSH=sh.PUSH, BLOCK=BLOCK)
    out = A.new_empty((sh.M, sh.N))
    timeout, ident, peers, mine = _after(sh, "B")
    sh.launch("gather", sh.gather_grid, sh.table, sh.cnts[2], out, sh.n, timeout, ident, DT=sh.DT, G=sh.G,
              PEERS=peers, MINE=mine, SRC=sh.SRC, BLOCK=BLOCK)
    return out


def matmul_all_to_all(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str) -> torch.Tensor:
    """all_to_all_single(A @ B): row block q of the result came from rank q (equal blocks)."""
    sh = _gemm(pg, "gemm_a2a", A, B, what)
    out = A.new_empty((sh.M, sh.N))
    timeout, ident, peers, mine = _after(sh, "A")
    sh.launch("gather", sh.gather_grid, sh.table, sh.cnts[1], out, sh.n, timeout, ident, DT=sh.DT, G=sh.G,
              PEERS=peers, MINE=mine, SRC=sh.SRC, BLOCK=BLOCK)
    return out


RUNS = {"matmul_reduce_scatter": "gemm_rs", "matmul_all_reduce": "gemm_ar", "matmul_all_to_all": "gemm_a2a"}
