"""The GEMM operators' fused path where the GEMM itself moves the data
(GC3_FUSED_EXCHANGE=tile-store, the default where it serves a call).

One persistent Triton kernel a call (TMA loads, one output tile of BM x BN per step).  A
finished tile whose rows belong to another rank is stored straight into that rank's
buffer, mapped here through CUDA IPC, and flagged there tile by tile.  The transfer then
rides on the GEMM's own epilogue: nothing else competes for the SMs or for HBM while the
GEMM runs, which is what made every stream-level overlap lose on these GPUs
(docs/history.md).  A rank starts with the next rank's rows, so every link carries traffic
from the first tiles, and ends with its own, by when the peers' partials of those have
landed.  An own tile, per operator:
  - GEMM + reduce-scatter: summed with the G - 1 partials in rank order in fp32 and rounded
    once, into the caller's fresh output;
  - GEMM + all-reduce: the same sum, also stored into every peer's mapped copy of the result
    (a store across the link is fire-and-forget; a read waits out the round trip) and
    flagged there;
  - GEMM + all-to-all: stored as it is.
Then (all-reduce, all-to-all) each program copies flagged blocks the peers stored into the
caller's output: a peer cannot store into a tensor it has no address for.  In an eager call the
peers' tiles may instead stay in a local outbox, for the copy engines to carry (_CopyPlan),
where the measured catalog or GC3_FUSED_PEER_TILES says so: a GEMM's stores into a peer cost
it about the link's time for the data.  Where a rank has 64
rows among an even number of ranks, a tile holds two ranks' rows (kernel _spanning): every half,
the own one too, goes to its owner's slot, and the sums and copies follow the tiles.
All-gather + GEMM runs the other way round (kernel gather_gemm): a few programs push the
rank's shard into every peer's gather buffer, one peer at a time in an order that makes each
round a permutation of the ranks, while the others start on the rank's own rows; output tiles
come from one counter, own rows first, then the next rank's, each waiting only for its row
block to have landed.  The copy takes SMs, not copy engines: it then needs no host call, is
one launch with the GEMM and is captured with it.
Outputs come from torch's caching allocator.  Nothing syncs the host, and every call's
state is on the device, so a call is capturable in a CUDA graph (after its shape's first
eager call, which maps the buffers):
  - every program counts the calls it has run in a word of its own (as the small allreduce
    kernels' blocks do): the count gives the call's number, which is what a flag holds, and
    its parity.  The mapped buffers alternate between two copies.  A rank stores into
    parity p again two calls later, and it cannot have finished the call between them
    before every peer stored something of that call for it, which each did after finishing
    its reads of p (kernels on one stream run one after another);
  - a wait gives up after GC3_FUSED_TIMEOUT seconds and names itself in the group's failure
    word, which the next call (or `check`) raises as RuntimeTimeoutError.
The buffers are the copy-engine pipeline's (runtime_cuda.fused.IpcGemmGroup over the
communicator's rendezvous), registered on a shape's first call on every rank together.
What it takes: Triton, a GPU with TMA (compute capability 9.0 and up), 16-bit inputs,
contiguous 16-byte aligned A [M, K] and B [K, N] with K and N multiples of 8, and M / G a
multiple of MIN_BM (all-gather: the shard's rows, and one B); anything else runs overlap.py's
pipeline, and `refusal` says why.
"""
from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from gc3 import settings
from gc3.errors import InputError

from . import overlap
from .handover import fused_call, ipc_group

# The GEMM's tiles: 128 x 256 outputs, K in steps of 64, three stages of TMA loads in flight,
# measured against cuBLAS on H100 (scripts/probe_triton_gemm.py: 0.92-1.03x at the fused grid).
BM, BN, BK, STAGES, WARPS, GROUP_M = 128, 256, 64, 3, 8, 8
# The halves tile_shape falls back to: one warpgroup's MMA is 64 rows high.
MIN_BM, MIN_BN = 64, 128
MAX_RANKS = 8
# GC3_FUSED_PEER_TILES=copy-engine: a peer's chunks at most, in whole groups of GROUP_M row
# blocks.  A chunk is copied only once all its tiles are done, so more of them end the copies
# sooner after the GEMM; each is a wait and two copies more a call (a graph's nodes, or without
# graphs three driver calls of about 7 us each on 2x H200).
COPY_CHUNKS = 4
# All-gather + GEMM: the columns of A one copy step moves (a block of BM x COPY_COLUMNS).
COPY_COLUMNS = 128
# Shapes whose tables a group keeps (their mapped buffers stay with the group).
TABLE_SHAPES = 32

OPS = ("gemm_rs", "gemm_ar", "gemm_a2a", "ag_gemm")


@functools.lru_cache(maxsize=None)
def _triton_missing() -> str:
    try:
        from triton.tools import tensor_descriptor
    except Exception as exc:  # not installed, or broken
        return f"Triton is not importable ({type(exc).__name__}: {exc})"
    return "" if hasattr(tensor_descriptor, "TensorDescriptor") else "a Triton without tensor descriptors"


def refusal(pg, op: str, A: torch.Tensor, B: torch.Tensor) -> str:
    """Why the tile-store path cannot serve this call ('' when it can); A is the shard of
    all-gather + GEMM."""
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
    if op == "ag_gemm" and M % MIN_BM:
        return f"a shard of {M} rows, not a multiple of {MIN_BM}"
    if op != "ag_gemm" and M % (G * MIN_BM):
        return f"{M} rows are not {G} blocks of a multiple of {MIN_BM} rows"
    if not (A.is_contiguous() and B.is_contiguous()):
        return "strided operands"
    if B.dtype != A.dtype:
        return f"A is {A.dtype} and B {B.dtype}"
    if A.data_ptr() % 16 or B.data_ptr() % 16:
        return "an operand not 16-byte aligned (TMA loads)"
    return ""


def tile_shape(M: int, N: int, G: int, sms: int, asked: Optional[Tuple[int, int]] = None,
               spanning: bool = True) -> Tuple[int, int]:
    """(BM, BN) of a call's output tiles, M counting every rank's rows: BM x BN, or BM halved
    where a rank's rows are not whole tiles of BM.  Where a rank has MIN_BM rows among an even
    number of ranks, a tile of 2 * MIN_BM rows spans two ranks (kernel _spanning): tiles of one
    rank's 64 rows read B once per 64 rows, which bound those calls by memory traffic.  Where
    the call's tiles would fill at most half the GPU's multiprocessors (a GEMM of few rows: one
    wave of long K loops on a few SMs while the rest idle), the next smaller tile is taken,
    rows before columns: the count doubles and still fits one wave, so each tile's K loop does
    half the work and none waits for a second wave.  `asked` (GC3_FUSED_TILE) replaces the
    choice; InputError where the shape cannot take it.  `spanning` False (all-gather + GEMM,
    whose tiles are one source's rows): no tile spans ranks."""
    rows = M // G
    spans = spanning and rows == MIN_BM and G % 2 == 0
    if asked is not None:
        bm, bn = asked
        if rows % bm and not (spans and bm == 2 * rows):
            raise InputError(f"GC3_FUSED_TILE={bm}x{bn}: {rows} rows a rank are not whole tiles of {bm} rows"
                             + (" (a tile spans two ranks only in GEMM + reduce-scatter, all-reduce and"
                                " all-to-all, where each rank has 64 rows and the ranks are even)" if bm > rows else ""))
        return bm, bn
    shapes = [(2 * MIN_BM, BN), (2 * MIN_BM, MIN_BN)] if spans else []
    if rows % BM == 0:
        shapes.append((BM, BN))
    shapes += [(MIN_BM, BN), (MIN_BM, MIN_BN)]
    for bm, bn in shapes:
        if 2 * _tiles(M, N, bm, bn) > sms:
            return bm, bn
    return shapes[-1]


def chunk_blocks(row_blocks: int) -> int:
    """Row blocks of one copy-engine chunk of a rank's `row_blocks` (COPY_CHUNKS)."""
    groups = -(-row_blocks // GROUP_M)
    return GROUP_M * -(-groups // COPY_CHUNKS)


def span(M: int, G: int, bm: int) -> int:
    """How many ranks' rows one tile of `bm` rows holds (1 or 2)."""
    return max(1, bm // (M // G))


def _tiles(rows: int, N: int, bm: int, bn: int) -> int:
    """Output tiles of `rows` rows of an N-column result."""
    return (rows // bm) * -(-N // bn)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


@functools.lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# --- the kernel ------------------------------------------------------------------------
# It finds its peers' addresses in one int64 table per shape (_Shape says where) and its
# call's number in its program's counter.
def _kernels():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import globaltimer

    @triton.jit
    def _at(table, i, DT: tl.constexpr):
        return tl.load(table + i).to(tl.pointer_type(DT))

    @triton.jit
    def _rows(base, rows, N, BM: tl.constexpr, BW: tl.constexpr):
        """A TMA descriptor of a row-major [rows, N] buffer, in blocks of BM x BW."""
        return tl.make_tensor_descriptor(base, shape=[rows, N], strides=[N, 1], block_shape=[BM, BW])

    @triton.jit
    def _asm(code: tl.constexpr, x):
        """`code` (PTX with side effects), then x."""
        return tl.inline_asm_elementwise(code + "\n\tmov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False,
                                         pack=1)

    @triton.jit
    def _stored(x):
        """Every TMA store this thread issued has completed, not only read its shared memory (the
        wait Triton emits), and is ordered before what the thread does next; returns x."""
        return _asm("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;", x)

    @triton.jit
    def _signal(flag, target, go):
        """*flag = target (where go) once every thread's stores before it have landed."""
        v = _stored(target)
        tl.debug_barrier()
        tl.atomic_xchg(flag, v, mask=go, sem="release", scope="sys")

    @triton.jit
    def _landed(shadow, count, target, go):
        """*shadow = target and *count += 1 (where go) once every thread's stores before it have
        landed: the flag a copy engine carries to the peer after the tile, and the chunk's count
        that copy waits for."""
        v = _stored(target)
        tl.debug_barrier()
        tl.store(shadow, v, mask=go)
        tl.atomic_add(count, 1, mask=go, sem="release", scope="sys")

    @triton.jit
    def _wait(flag, target, dead, failed, ident, timeout_ns):
        """Until *flag reaches target (a wrapping difference: the counts may pass 2^31), then
        acquire it for the whole program and order the TMA loads after it.  Polled with plain
        volatile loads: an atomic per poll would queue behind the other pollers.  A wait that
        gives up names itself in the group's failure word (host memory: polling it from every
        waiter cost a millisecond a call) and sets *dead, after which every wait of this
        rank's kernel gives up at once instead of waiting out its own timeout."""
        v = tl.load(flag, volatile=True)
        if (v - target) < 0:
            start = globaltimer()
            late = tl.load(dead, volatile=True)
            while ((v - target) < 0) & (late == 0):
                v = tl.load(flag, volatile=True)
                late = tl.load(dead, volatile=True)
                if globaltimer() - start > timeout_ns:
                    tl.store(failed, ident)
                    tl.atomic_xchg(dead, 1, sem="relaxed", scope="gpu")
                    late = 1
        tl.atomic_add(flag, 0, sem="acquire", scope="sys")
        tl.debug_barrier()
        _asm("fence.proxy.async.global;", target)

    @triton.jit
    def _place(t, pm, pn, GROUP_M: tl.constexpr):
        """Tile t of a pm x pn grid: GROUP_M row blocks in a row share the columns of B they
        read while those are in L2."""
        group = GROUP_M * pn
        first = (t // group) * GROUP_M
        size = tl.minimum(pm - first, GROUP_M)
        return first + (t % group) % size, (t % group) // size

    @triton.jit
    def _tile(a_desc, b_desc, off_m, off_n, kt, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        acc = tl.zeros((BM, BN), tl.float32)
        for ki in range(kt):
            acc = tl.dot(a_desc.load([off_m, ki * BK]), b_desc.load([ki * BK, off_n]), acc)
        return acc

    @triton.jit
    def _pair(a_desc, b_desc, off_m, off_n, kt, R: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """Rows [off_m, + 2R) in two accumulators of R rows that share each step's B: the halves
        go to two ranks, and splitting one accumulator by rows would move it through shared
        memory (its halves live in different warps)."""
        acc0 = tl.zeros((R, BN), tl.float32)
        acc1 = tl.zeros((R, BN), tl.float32)
        for ki in range(kt):
            b = b_desc.load([ki * BK, off_n])
            acc0 = tl.dot(a_desc.load([off_m, ki * BK]), b, acc0)
            acc1 = tl.dot(a_desc.load([off_m + R, ki * BK]), b, acc1)
        return acc0, acc1

    @triton.jit
    def _own_rows(A, b_desc, out, table, M, N, K, rows, first_block, rank, timeout_ns, ident, me, grid, par,
                  target, failed, dead, DT: tl.constexpr, G: tl.constexpr, OP: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, CHUNK: tl.constexpr):
        """gemm_exchange where a tile's rows are one rank's.  CHUNK > 0: a peer's tile is stored
        here, in the outbox, and counted in its chunk of CHUNK row blocks; a copy engine carries
        each counted chunk, then its flags, to the peer (_CopyPlan)."""
        a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        HALF: tl.constexpr = BN // 2
        QUARTER: tl.constexpr = BN // 4
        # The descriptors every tile uses, made once: the caller's output, by halves (a block as
        # it is) and by quarters (a sum), and this rank's slots (or, GEMM+AR, its result).
        out_h = _rows(out, rows if OP == 0 else M, N, BM, HALF)
        out_q = _rows(out, rows if OP == 0 else M, N, BM, QUARTER)
        own = _rows(_at(table, 2 * G + par, DT), G * rows, N, BM, QUARTER)
        got = _rows(_at(table, 2 * G + (2 if OP == 1 else 0) + par, DT), G * rows, N, BM, HALF)
        pm = tl.cdiv(M, BM)
        pn = tl.cdiv(N, BN)
        kt = tl.cdiv(K, BK)
        rb = rows // BM
        T = rb * pn
        flags = _at(table, 4 * G + 4 + rank, tl.int32)
        # The peers' rows, the next rank's first.  A tile's flag goes up after the next tile's
        # K loop, by when its stores have long landed: waiting for them at once stalled the
        # program for their trip across the link.  (Flattening the tile loop into the K loop,
        # which lets Triton overlap a tile's epilogue with the next one's first loads, made the
        # GEMM 2.5x slower here: the flag's wait and fence stop its pipeline.)
        peer_tiles = (G - 1) * T
        pending = flags
        bump = flags
        chunks = tl.cdiv(rb, tl.maximum(CHUNK, 1))
        for t in tl.range(me, peer_tiles, grid):
            pid_l, pid_n = _place(t, (G - 1) * rb, pn, GROUP_M)
            pid_m = (first_block + pid_l) % pm
            acc = _tile(a_desc, b_desc, pid_m * BM, pid_n * BN, kt, BM, BN, BK)
            d = pid_m // rb
            lb = pid_m - d * rb
            if CHUNK:
                _landed(pending, bump, target, t != me)
                box = _at(table, 5 * G + 5, DT) + d.to(tl.int64) * rows * N
                _rows(box, rows, N, BM, BN).store([lb * BM, pid_n * BN], acc.to(DT))
                pending = _at(table, 5 * G + 6, tl.int32) + (d * T + lb * pn + pid_n)
                bump = _at(table, 5 * G + 7, tl.int32) + (d * chunks + lb // CHUNK)
            else:
                _signal(pending, target, t != me)
                _rows(_at(table, par * G + d, DT), rows, N, BM, BN).store([lb * BM, pid_n * BN], acc.to(DT))
                pending = _at(table, 4 * G + 4 + d, tl.int32) + (rank * T + lb * pn + pid_n)
        if CHUNK:
            _landed(pending, bump, target, me < peer_tiles)
        else:
            _signal(pending, target, me < peer_tiles)
        # This rank's rows, continuing the programs' round robin.
        for t in tl.range((me + grid - peer_tiles % grid) % grid, T, grid):
            lb, pid_n = _place(t, rb, pn, GROUP_M)
            lm = lb * BM
            off_n = pid_n * BN
            acc = _tile(a_desc, b_desc, rank * rows + lm, off_n, kt, BM, BN, BK)
            # In two halves of BN / 2 columns, so that the epilogue's registers stay those of one.
            h = tl.split(tl.permute(tl.reshape(acc, (BM, 2, HALF)), (0, 2, 1)))
            if OP == 2:
                for half in tl.static_range(2):
                    out_h.store([rank * rows + lm, off_n + half * HALF], h[half].to(DT))
            else:
                idx = lb * pn + pid_n
                for s in tl.static_range(G):
                    if s != rank:
                        _wait(flags + (s * T + idx), target, dead, failed, ident, timeout_ns)
                # In rank order, in fp32, rounded once: the same bits whichever rank sums.  By
                # quarters of the tile: the sum's registers beside the accumulator's.
                r0 = lm if OP == 0 else rank * rows + lm
                for half in tl.static_range(2):
                    q2 = tl.split(tl.permute(tl.reshape(h[half], (BM, 2, QUARTER)), (0, 2, 1)))
                    for quarter in tl.static_range(2):
                        col = off_n + half * HALF + quarter * QUARTER
                        x = tl.zeros((BM, QUARTER), tl.float32)
                        for s in tl.static_range(G):
                            if s == rank:
                                x += q2[quarter]
                            else:
                                x += own.load([s * rows + lm, col]).to(tl.float32)
                        y = x.to(DT)
                        out_q.store([r0, col], y)
                        if OP == 1:
                            for q in tl.static_range(G):
                                if q != rank:
                                    dst = _at(table, 2 * G + 4 + par * G + q, DT)
                                    _rows(dst, rows, N, BM, QUARTER).store([lm, col], y)
                if OP == 1:
                    for q in tl.static_range(G):
                        if q != rank:
                            _signal(_at(table, 4 * G + 4 + q, tl.int32) + ((G + rank) * T + idx), target, idx >= 0)
        if OP != 0:
            # The peers' blocks, the ones that should have landed first first.
            kind = 1 if OP == 1 else 0
            for w in range(me, (G - 1) * T, grid):
                j = w // T
                idx = w - j * T
                s = (rank + G - 1 - j) % G
                _wait(flags + ((kind * G + s) * T + idx), target, dead, failed, ident, timeout_ns)
                lm = (idx // pn) * BM
                off_n = (idx % pn) * BN
                for half in tl.static_range(2):
                    col = off_n + half * HALF
                    out_h.store([s * rows + lm, col], got.load([s * rows + lm, col]))

    @triton.jit
    def _spanning(A, b_desc, out, table, M, N, K, rows, rank, timeout_ns, ident, me, grid, par, target,
                  failed, dead, DT: tl.constexpr, G: tl.constexpr, OP: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        """gemm_exchange where a tile's BM rows are two ranks' (R = BM / 2 rows each; G even): at
        few rows a rank, tiles of one rank's rows read B once per R rows, which bound such calls
        by L2 and HBM traffic.  Each half goes into its owner's slot for this rank, the own half
        too (flagged there alike), so (0, 1) an own block's sum waits for G slots and adds them in
        rank order (each partial rounded once, as the matmul's output is), and (2) the blocks are
        copied out of the G slots.  A program sums its blocks after all its tiles: with tiles
        this wide a call's tiles are about one wave, so no later K loop would hide the sums."""
        R: tl.constexpr = BM // 2
        a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[R, BK])
        pn = tl.cdiv(N, BN)
        kt = tl.cdiv(K, BK)
        pairs = G // 2
        T = pn
        flags = _at(table, 4 * G + 4 + rank, tl.int32)
        # The next pair's rows first, this rank's last; the pairs of one column block side by
        # side, so B's columns are read from HBM once.  A half's flag goes up after the next
        # tile's K loop, as the other form's do.
        total = pairs * T
        pend0 = flags
        pend1 = flags
        for t in tl.range(me, total, grid):
            pid_p, pid_n = _place(t, pairs, pn, GROUP_M)
            p = (rank // 2 + 1 + pid_p) % pairs
            acc0, acc1 = _pair(a_desc, b_desc, p * BM, pid_n * BN, kt, R, BN, BK)
            _signal(pend0, target, t != me)
            _signal(pend1, target, t != me)
            d = 2 * p
            _rows(_at(table, par * G + d, DT), rows, N, R, BN).store([0, pid_n * BN], acc0.to(DT))
            _rows(_at(table, par * G + d + 1, DT), rows, N, R, BN).store([0, pid_n * BN], acc1.to(DT))
            pend0 = _at(table, 4 * G + 4 + d, tl.int32) + (rank * T + pid_n)
            pend1 = _at(table, 4 * G + 4 + d + 1, tl.int32) + (rank * T + pid_n)
        _signal(pend0, target, me < total)
        _signal(pend1, target, me < total)
        _spanning_sum(out, table, M, N, rows, rank, timeout_ns, ident, me, grid, par, target, failed, dead, flags, T,
                      total, DT, G, OP, R, BN)

    @triton.jit
    def _spanning_sum(out, table, M, N, rows, rank, timeout_ns, ident, me, grid, par, target, failed, dead, flags, T,
                      total, DT: tl.constexpr, G: tl.constexpr, OP: tl.constexpr, R: tl.constexpr,
                      BN: tl.constexpr):
        """_spanning's sum (0, 1) and copy (1, 2).  No accumulator is live here, so a block is
        summed and copied whole: a descriptor a peer a block, not one a quarter (each is made on
        the device).  Plain loads and stores instead of TMA measured the same (4x H200)."""
        if OP != 2:
            slots = _rows(_at(table, 2 * G + par, DT), G * rows, N, R, BN)
            out_b = _rows(out, rows if OP == 0 else M, N, R, BN)
            r0 = 0 if OP == 0 else rank * rows
            for idx in tl.range((me + grid - total % grid) % grid, T, grid):
                for s in tl.static_range(G):
                    _wait(flags + (s * T + idx), target, dead, failed, ident, timeout_ns)
                col = idx * BN
                x = tl.zeros((R, BN), tl.float32)
                for s in tl.static_range(G):
                    x += slots.load([s * rows, col]).to(tl.float32)
                y = x.to(DT)
                out_b.store([r0, col], y)
                if OP == 1:
                    for q in tl.static_range(G):
                        if q != rank:
                            _rows(_at(table, 2 * G + 4 + par * G + q, DT), rows, N, R, BN).store([0, col], y)
                    for q in tl.static_range(G):
                        if q != rank:
                            _signal(_at(table, 4 * G + 4 + q, tl.int32) + ((G + rank) * T + idx), target, idx >= 0)
        if OP != 0:
            # The blocks that should have landed first first; all-to-all's own block too.
            kind = 1 if OP == 1 else 0
            sources = G - 1 if OP == 1 else G
            got = _rows(_at(table, 2 * G + (2 if OP == 1 else 0) + par, DT), G * rows, N, R, BN)
            out_w = _rows(out, M, N, R, BN)
            for w in range(me, sources * T, grid):
                j = w // T
                idx = w - j * T
                s = (rank + G - 1 - j) % G
                _wait(flags + ((kind * G + s) * T + idx), target, dead, failed, ident, timeout_ns)
                out_w.store([s * rows, idx * BN], got.load([s * rows, idx * BN]))

    @triton.jit
    def gemm_exchange(A, B, out, table, cnt, M, N, K, rows, first_block, rank, timeout_ns, ident,
                      DT: tl.constexpr, G: tl.constexpr, OP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, GROUP_M: tl.constexpr, SPAN: tl.constexpr, CHUNK: tl.constexpr):
        """A [M, K] @ B [K, N], one call of OP (0 reduce-scatter, 1 all-reduce, 2 all-to-all).
        The tile of rows r belongs to rank d = r // rows.  First the peers' tiles, each stored
        into this rank's slot at its owner and flagged there; then the own ones, each summed
        with the G - 1 partials flagged in this rank's slots (0, 1) and pushed to every rank's
        copy of the result (1), or stored as it is (2).  Then (1, 2) the blocks the peers
        flagged are copied into out.  SPAN 2 (a rank has BM / 2 rows): see _spanning.  Table
        entries: _Shape's comment."""
        me = tl.program_id(0)
        grid = tl.num_programs(0)
        c = tl.load(cnt + me)
        par = c & 1
        target = c + 1
        failed = _at(table, 5 * G + 4, tl.int32)
        dead = cnt + grid
        b_desc = tl.make_tensor_descriptor(B, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        if SPAN == 2:
            _spanning(A, b_desc, out, table, M, N, K, rows, rank, timeout_ns, ident, me, grid, par, target,
                      failed, dead, DT, G, OP, BM, BN, BK, GROUP_M)
        else:
            _own_rows(A, b_desc, out, table, M, N, K, rows, first_block, rank, timeout_ns, ident, me, grid, par,
                      target, failed, dead, DT, G, OP, BM, BN, BK, GROUP_M, CHUNK)
        tl.store(cnt + me, c + 1)

    @triton.jit
    def _copy(src, src_row, dst, dst_row, col, K, BM: tl.constexpr, CW: tl.constexpr):
        """Rows [src_row, + BM) of the row-major [., K] src, columns [col, + CW), to the same
        columns of rows [dst_row, + BM) of dst.  Plain loads and stores: every thread has its
        share of the block in flight at once, and a store across the link is posted (a TMA
        step would stage it through shared memory and wait for it there)."""
        c = col + tl.arange(0, CW)[None, :]
        at = tl.arange(0, BM)[:, None] * K + c
        inside = c < K
        x = tl.load(src + src_row.to(tl.int64) * K + at, mask=inside)
        tl.store(dst + dst_row.to(tl.int64) * K + at, x, mask=inside)

    @triton.jit
    def _pushed(flag, n, go):
        """*flag += n (where go) once every thread's stores before it are visible to the whole
        system."""
        v = _asm("fence.acq_rel.sys;", n)
        tl.debug_barrier()
        tl.atomic_add(flag, v, mask=go, sem="release", scope="sys")

    @triton.jit
    def gather_gemm(A, B, out, A_out, stamps, table, cnt, M, N, K, rows, rank, copiers, timeout_ns, ident,
                    DT: tl.constexpr, G: tl.constexpr, RETURN_A: tl.constexpr, TRACE: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CW: tl.constexpr,
                    GROUP_M: tl.constexpr):
        """all_gather(A) [M, K] @ B [K, N], A this rank's [rows, K]; RETURN_A: the gathered rows
        into A_out too.  Programs below `copiers` first push A, BM rows by CW columns a block,
        into every peer's gather buffer (the rank that computes on them soonest first: a
        permutation of the ranks in each round, so no link carries two rounds at once), adding
        each landed run of blocks to that row block's count at the peer.  Then every program
        takes output tiles from one counter, own rows first, then the next rank's: a tile of
        peer rows waits for their row block's count to reach the call's.  TRACE: each copier's
        push and each tile's K loop and store as [start, end] pairs of %globaltimer in stamps
        (int64 [copiers + tiles][2]).  Table entries: _Shape's comment."""
        me = tl.program_id(0)
        grid = tl.num_programs(0)
        c = tl.load(cnt + me)
        par = c & 1
        failed = _at(table, 3 * G, tl.int32)
        dead = cnt + grid
        grab = cnt + grid + 1
        rb = rows // BM
        kb = tl.cdiv(K, CW)
        landed = kb * (c + 1)
        flags = _at(table, 2 * G + rank, tl.int32)
        gathered = _at(table, par * G + rank, DT)
        if me < copiers:
            if TRACE:
                tl.store(stamps + 2 * me, globaltimer())
            blocks = rb * kb
            lo = me * blocks // copiers
            hi = (me + 1) * blocks // copiers
            for k in range(1 - RETURN_A, G):
                q = (rank + G - k) % G
                dst = tl.where(k == 0, A_out, _at(table, par * G + q, DT))
                counts = _at(table, 2 * G + q, tl.int32) + rank * rb
                f = lo
                while f < hi:
                    i = f // kb
                    stop = tl.minimum(hi, (i + 1) * kb)
                    for g in tl.range(f, stop, num_stages=1):
                        _copy(A, i * BM, dst, rank * rows + i * BM, (g - i * kb) * CW, K, BM, CW)
                    _pushed(counts + i, stop - f, k != 0)
                    f = stop
            if TRACE:
                tl.store(stamps + 2 * me + 1, globaltimer())
            if RETURN_A:
                # The peers' rows into the caller's copy of A, as they land.
                for j in range(1, G):
                    s = (rank + j) % G
                    f = lo
                    while f < hi:
                        i = f // kb
                        stop = tl.minimum(hi, (i + 1) * kb)
                        _wait(flags + s * rb + i, landed, dead, failed, ident, timeout_ns)
                        r0 = s * rows + i * BM
                        for g in tl.range(f, stop, num_stages=1):
                            _copy(gathered, r0, A_out, r0, (g - i * kb) * CW, K, BM, CW)
                        f = stop
        b_desc = tl.make_tensor_descriptor(B, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        out_d = _rows(out, M, N, BM, BN)
        pn = tl.cdiv(N, BN)
        kt = tl.cdiv(K, BK)
        T = rb * pn
        total = G * T
        # Every program takes one tile past the last: total + grid a call, so the count at a
        # call's start is known from the call's number (wrapping alike on both sides).
        base = c * (total + grid)
        t = tl.atomic_add(grab, 1, sem="relaxed", scope="gpu") - base
        while t < total:
            j = t // T
            lb, pid_n = _place(t - j * T, rb, pn, GROUP_M)
            s = (rank + j) % G
            r0 = s * rows + lb * BM
            if j != 0:
                _wait(flags + s * rb + lb, landed, dead, failed, ident, timeout_ns)
            if TRACE:
                tl.store(stamps + 2 * (copiers + t), globaltimer())
            # One K loop for both sources (a loop a branch would double the stages' shared
            # memory): the own rows are read where the caller has them.
            a_desc = tl.make_tensor_descriptor(tl.where(j == 0, A, gathered), shape=[M, K], strides=[K, 1],
                                               block_shape=[BM, BK])
            acc = _tile(a_desc, b_desc, tl.where(j == 0, lb * BM, r0), pid_n * BN, kt, BM, BN, BK)
            out_d.store([r0, pid_n * BN], acc.to(DT))
            if TRACE:
                tl.store(stamps + 2 * (copiers + t) + 1, globaltimer())
            t = tl.atomic_add(grab, 1, sem="relaxed", scope="gpu") - base
        tl.store(cnt + me, c + 1)

    return {"gemm_exchange": gemm_exchange, "gather_gemm": gather_gemm}


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
    """The mapped buffers, the address table and the launch of one (op, M, K, N, dtype); M counts
    the rows of every rank (all-gather: G times the shard's).

    GEMM + reduce-scatter, all-reduce, all-to-all (kernel gemm_exchange), table (int64):
    [0, 2G) rank d's slot for this rank's rows, by parity (p * G + d); 2G + p: this rank's slots
    (slot s: the rows rank s computed for it); 2G + 2 + p: its copy of the result (GEMM+AR);
    2G + 4 + p * G + q: block `rank` of rank q's copy; 4G + 4 + d: rank d's tile flags; 5G + 4:
    the group's failure word.  A rank's tile flags are int32 [2][G][T] (T tiles in a rank's
    rows): [0][s][i], tile i of rank s's partial or block has landed in slot s; [1][s][i], rank
    s's sum of tile i has landed in this rank's copy of the result.  A flag holds the number of
    the call that stored it, so nothing clears it.  The call counters (one int32 a program, then
    the word a wait that gave up sets) live with the group's buffers of (op, M, N, dtype), which
    every K of that shape shares, flags included.

    All-gather + GEMM (kernel gather_gemm), table: [0, 2G) rank d's gather buffer [M, K] by
    parity (p * G + d); 2G + d: rank d's row-block counts, int32 [G][M / G / BM] ([s][i]: the
    blocks of row block i of rank s landed here, summed over calls); 3G: the failure word.  The
    buffers are (M, K, N, dtype)'s: the tile counter after the call counters counts every
    output tile of every call."""

    def __init__(self, group, pg, op: str, M: int, K: int, N: int, dtype: torch.dtype, ce: bool = False):
        G, me = pg.size(), pg.rank()
        self.G, self.M, self.K, self.N, self.rows, self.op, self.rank = G, M, K, N, M // G, op, me
        dev = self.device = pg._device
        self.bm, self.bn = tile_shape(M, N, G, _sms(dev), settings.get("GC3_FUSED_TILE"), op != "ag_gemm")
        self.span = span(M, G, self.bm)
        item = torch.empty((), dtype=dtype).element_size()
        if op == "ag_gemm":
            st, t, words = self._gather(group, M, K, N, dtype, item)
        else:
            st, t, words = self._exchange(group, M, N, dtype, item, ce)
        self.state = st
        self.table = st.kept.get("table")
        if self.table is None:
            self.table = st.kept["table"] = torch.tensor(t, dtype=torch.int64, device=dev)
        if st.counts is None:
            st.counts = torch.zeros(words, dtype=torch.int32, device=dev)
        self.cnt = st.counts
        self.DT = _dt(dtype)
        self.timeout_ns = int(group.watchdog.timeout * 1e9)
        self.ident = group.watchdog.name(f"the tile-store wait of {op} {M}x{K}x{N}")
        # The compiled kernel's launch, per value of the constexprs a call passes.
        self._runs: Dict[Tuple, Callable] = {}
        # One plan for the shape's buffers (every K of it), kept with them: a shape evicted from
        # the group's table and made again finds its streams and graphs.
        self.copies = None
        if ce:
            self.copies = st.kept.get(("copy plan", self.bm, self.bn))
            if self.copies is None:
                self.copies = st.kept[("copy plan", self.bm, self.bn)] = _CopyPlan(self, item)

    def _exchange(self, group, M: int, N: int, dtype: torch.dtype, item: int, ce: bool):
        G, me, op = self.G, self.rank, self.op
        slot = self.rows * N * item
        tiles = _tiles(self.rows, N, self.bm // self.span, self.bn)
        sizes = {"stage": G * slot, "flags": 4 * 2 * G * tiles}
        if op == "gemm_ar":
            sizes["result"] = G * slot
        # Copy-engine calls count their calls on the host too (the copies wait for counts the
        # host computes), so they keep buffers, flags and counters of their own.
        st = group.shape(("tile-store", op, M, N, str(dtype)) + (("copy-engine",) if ce else ()), sizes)
        t = [0] * (5 * G + 8)
        for p in range(2):
            for d in range(G):
                t[p * G + d] = st.buf("stage", d, p) + me * slot
                if op == "gemm_ar":
                    t[2 * G + 4 + p * G + d] = st.buf("result", d, p) + me * slot
            t[2 * G + p] = st.buf("stage", me, p)
            if op == "gemm_ar":
                t[2 * G + 2 + p] = st.buf("result", me, p)
        for d in range(G):
            t[4 * G + 4 + d] = st.buf("flags", d, 0)
        t[5 * G + 4] = group.watchdog.failed_ptr
        # Copy-engine chunks: row blocks a chunk, and a peer's chunks.
        self.chunk = chunk_blocks(self.rows // self.bm) if ce else 0
        self.chunks = -(-(self.rows // self.bm) // self.chunk) if ce else 0
        if ce:
            # The outbox (the peers' tiles, [G][rows][N]), their flags as the peers will hold
            # them ([G][T]) and the tiles counted a chunk ([G][chunks]): this rank's alone.
            chunks = self.chunks
            made = st.kept.get("outbox")
            if made is None:
                made = st.kept["outbox"] = (torch.empty(G * self.rows * N, dtype=dtype, device=self.device),
                                            torch.zeros(G * tiles, dtype=torch.int32, device=self.device),
                                            torch.zeros(G * chunks, dtype=torch.int32, device=self.device))
            t[5 * G + 5:5 * G + 8] = [x.data_ptr() for x in made]
        self.grid = min(_sms(self.device), _tiles(M, N, self.bm, self.bn))
        self.kernel = "gemm_exchange"
        self.scalars = (self.M, self.N, self.K, self.rows, ((me + 1) % G) * (self.rows // self.bm), me)
        self.constexprs = dict(G=G, OP=OPS.index(op), BM=self.bm, BN=self.bn, BK=BK, GROUP_M=GROUP_M, SPAN=self.span,
                               CHUNK=self.chunk)
        # One more word: set once a wait of this shape gave up (the group is then failed).
        return st, t, self.grid + 1

    def _gather(self, group, M: int, K: int, N: int, dtype: torch.dtype, item: int):
        G, me = self.G, self.rank
        blocks = self.rows // self.bm
        st = group.shape(("tile-store", "ag_gemm", M, K, N, str(dtype)),
                         {"gather": M * K * item, "flags": 4 * G * blocks})
        t = [0] * (3 * G + 1)
        for d in range(G):
            for p in range(2):
                t[p * G + d] = st.buf("gather", d, p)
            t[2 * G + d] = st.buf("flags", d, 0)
        t[3 * G] = group.watchdog.failed_ptr
        self.grid = _sms(self.device)
        asked = settings.get("GC3_FUSED_GATHER_COPIERS")
        copiers = min(4 * G + 8 if asked is None else asked, blocks * -(-K // COPY_COLUMNS), self.grid - 1)
        self.tiles = _tiles(self.rows, N, self.bm, self.bn)
        self.kernel = "gather_gemm"
        self.copiers = max(copiers, 1)
        self.scalars = (self.M, self.N, self.K, self.rows, me, self.copiers)
        self.constexprs = dict(G=G, BM=self.bm, BN=self.bn, BK=BK, CW=COPY_COLUMNS, GROUP_M=GROUP_M)
        # The word a wait that gave up sets, then the tile counter.
        return st, t, self.grid + 2

    def launch(self, *tensors: torch.Tensor, **constexprs) -> None:
        """The call's kernel on (A, B, out) (all-gather: A, B, out, A_out, stamps) and the shape's scalars.
        The first launch (per value of `constexprs`) goes through Triton's JIT, which
        specializes the kernel on the arguments (every one of them has the same value, or for
        tensors the same 16-byte alignment, at every call of a shape); later ones call the
        compiled kernel straight, which saves most of Triton's host time."""
        key = tuple(constexprs.items())
        run = self._runs.get(key)
        if run is not None:
            run(*tensors)
            return
        fixed = (self.table, self.cnt) + self.scalars + (self.timeout_ns, self.ident)
        _ensure_allocator()
        every = dict(DT=self.DT, **self.constexprs, **constexprs)
        compiled = kernels()[self.kernel][(self.grid,)](*tensors, *fixed, **every, num_stages=STAGES,
                                                         num_warps=WARPS)
        scratch = ("scratch", self.kernel, self.grid) + tuple(every.items())     # a size per compiled variant
        # The shape's own arguments follow the call's tensors, and never change: they go with
        # the constexprs into the launch.
        self._runs[key] = _direct(compiled, self.grid, fixed + tuple(every.values()), self.device, self.state.kept,
                                  scratch)


class _CopyPlan:
    """The copy engines' part of a call whose peer tiles stay in the outbox
    (GC3_FUSED_PEER_TILES=copy-engine): a stream a peer, on which each chunk of a peer's rows
    (chunk_blocks), once the kernel has counted all its tiles, is copied into this rank's slot at
    the peer, then its tiles' flags after it (copies on one stream land in order), which is all
    the peer's sum or copy waits for.  A link's stores then come from a copy engine instead of
    the GEMM's SMs, which stall on them (docs/history.md).

    The waits are queued after the kernel: a wait queued first could hold the kernel back where
    the streams share a hardware queue; the streams are the plan's own for the same reason.  A
    wait is for the chunk's count to reach its tiles, and the count is then put back to 0, so
    every call queues the same work but for the slots' parity; the call's number, which the host
    counts (ShapeState.epoch), picks it, so such a call cannot be captured.  That work is a CUDA
    graph per parity, captured on the first call: one driver call replays a call's waits and
    copies for every peer (queued one by one, they cost about 7 us of host time each on 2x
    H200).  Where the driver cannot capture them they are queued one by one.  A stream memory
    wait cannot time out; these are always met, since the kernel counts every peer tile before
    it waits for anything (its own waits time out as the store path's do)."""

    def __init__(self, sh: "_Shape", item: int):
        st, G, me, rows, N, ch = sh.state, sh.G, sh.rank, sh.rows, sh.N, sh.chunk
        outbox, shadow, counts = st.kept["outbox"]
        rb = rows // sh.bm
        pn = -(-N // sh.bn)
        T = rb * pn
        chunks = sh.chunks
        slot = rows * N * item
        self.state, self.device = st, sh.device
        # (peer, its chunks' steps in the order the kernel counts them), the peers in the
        # kernel's order; a step: (count's address, tiles a call, the slot's address by parity,
        # the outbox's, bytes, the peer's flags' address, the shadow's, bytes).
        self.peers = []
        for j in range(1, G):
            d = (me + j) % G
            steps = []
            for c in range(chunks):
                lo, hi = c * ch, min(rb, (c + 1) * ch)
                at = lo * sh.bm * N * item
                steps.append((counts.data_ptr() + 4 * (d * chunks + c), (hi - lo) * pn,
                              [st.buf("stage", d, p) + me * slot + at for p in range(2)],
                              outbox.data_ptr() + d * slot + at, (hi - lo) * sh.bm * N * item,
                              st.buf("flags", d, 0) + 4 * (me * T + lo * pn),
                              shadow.data_ptr() + 4 * (d * T + lo * pn), 4 * (hi - lo) * pn))
            self.peers.append((d, steps))
        # Made on the first call: the stream the graphs go on, an event, a stream a peer with
        # its steps' addresses in the driver's form, and a graph a parity (None: queued).
        self.origin = self.event = None
        self.queues: List[Tuple] = []
        self.graphs: List = []

    def _make(self) -> None:
        from runtime_cuda.core import cudadriver

        self.caller = _current_stream(self.device)
        with torch.cuda.device(self.device):
            self.origin, self.event = cudadriver.new_stream(), cudadriver.new_event()
            for _, steps in self.peers:
                made = []
                for count, per, data, src, nbytes, flags, shadow, fbytes in steps:
                    count, src, flags, shadow, *data = cudadriver.pointers(count, src, flags, shadow, *data)
                    made.append((count, per, data, src, nbytes, flags, shadow, fbytes))
                self.queues.append((cudadriver.new_stream(), made))
            try:
                self.graphs = [cudadriver.graph(self.origin, functools.partial(self._queue, par))
                               for par in range(2)]
            except RuntimeError as exc:
                _log().info("gc3 torch: the copy engines' work could not be captured as a CUDA graph (%s); "
                            "it is queued call by call", exc)
                self.graphs = [None, None]
        # Given back with the plan (its group's buffers go then too), not at interpreter exit.
        made = [self.origin, self.event] + [stream for stream, _ in self.queues] + [g for g in self.graphs if g]
        weakref.finalize(self, cudadriver.destroy, *made).atexit = False

    def _queue(self, par: int) -> None:
        """A call's waits and copies for slots of parity `par`, each peer's on its stream, every
        stream forked from the origin stream before any is joined back, so that every link
        carries its chunks at once (forked and joined in turn, a peer's copies waited for the
        previous peer's)."""
        from runtime_cuda.core import cudadriver

        for stream, _ in self.queues:
            cudadriver.join(stream, self.event, self.origin)
        for stream, steps in self.queues:
            for count, per, data, src, nbytes, flags, shadow, fbytes in steps:
                cudadriver.wait_value32(stream, count, per)
                cudadriver.write_value32(stream, count, 0)
                cudadriver.copy(stream, data[par], src, nbytes)
                cudadriver.copy(stream, flags, shadow, fbytes)
        for stream, _ in self.queues:
            cudadriver.join(self.origin, self.event, stream)

    def run(self, launch: Callable[[], None]) -> None:
        """`launch` (the kernel, on torch's current stream), then the copies; the current stream
        then waits for them."""
        from runtime_cuda.core import cudadriver

        if self.origin is None:
            self._make()
        st = self.state
        launch()
        st.epoch += 1
        par = (st.epoch - 1) & 1
        if self.graphs[par] is None:
            self._queue(par)
        else:
            cudadriver.graph_launch(self.graphs[par], self.origin)
        cudadriver.join(self.caller(), self.event, self.origin)


def _direct(compiled, grid: int, values: Tuple, device: torch.device, kept: Dict, name: Tuple) -> Callable:
    """The launch of a compiled kernel with the arguments of a call (then `values`, the
    arguments every call passes the same, constexprs last), on torch's current stream, through Triton's own C launcher but none of its
    per-call Python: the scratch the kernel makes its descriptors in is allocated once, kept in
    `kept` under `name` with the shape's buffers (calls of one shape run in stream order, as
    their flags already require, and a captured launch addresses it), and the stream comes from
    torch's raw getter.  Profiler hooks are not called.  A Triton whose launcher differs from
    the one this was written against (3.6) goes through `compiled.run`."""
    launcher = compiled.run
    launch = getattr(launcher, "launch", None)
    size = getattr(launcher, "global_scratch_size", None)
    if launch is None or size is None or getattr(launcher, "profile_scratch_size", 0) \
            or getattr(launcher, "num_ctas", 1) != 1 or getattr(launcher, "global_scratch_align", 1) > 256:
        def run(*args):
            stream = torch.cuda.current_stream().cuda_stream
            full = args + values
            compiled.run(grid, 1, 1, stream, compiled.function, compiled.packed_metadata,
                         compiled.launch_metadata((grid, 1, 1), stream, *full), None, None, *full)
        return run
    # torch's caching allocator aligns every block to 512 bytes.
    scratch = kept.get(name)
    if scratch is None and size:
        scratch = kept[name] = torch.empty(grid * size, dtype=torch.int8, device=device)
    head = (grid, 1, 1)
    tail = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, scratch, None,
            compiled.packed_metadata, None, None, None)
    stream = _current_stream(device)

    def run(*args):
        launch(*head, stream(), *tail, *args, *values)
    return run


def _current_stream(device: torch.device) -> Callable[[], int]:
    """torch's current stream on `device`, as a raw handle, through torch's raw getter:
    torch.cuda.current_stream builds an object, several us a call."""
    return functools.partial(torch._C._cuda_getCurrentRawStream, torch.cuda._get_device_index(device, optional=True))


def _key(op: str, A: torch.Tensor, B: torch.Tensor, G: int) -> Tuple:
    """(op, M, K, N, dtype): M counts every rank's rows (all-gather: A is the shard)."""
    return (op, A.shape[0] * (G if op == "ag_gemm" else 1), A.shape[1], B.shape[1], A.dtype)


def _shape(pg, op: str, A: torch.Tensor, B: torch.Tensor, what: str, ce: bool = False) -> _Shape:
    """The shape's state, made on its first call (on every rank together); `ce`: the copy
    engines carry the peers' tiles (_CopyPlan)."""
    key = _key(op, A, B, pg.size()) + (ce,)
    cache = pg.__dict__.setdefault("_gc3_tile_store", OrderedDict())
    got = cache.get(key)
    if got is None:
        if ce:
            M, N, G = key[1], key[3], pg.size()
            if span(M, G, tile_shape(M, N, G, _sms(pg._device), settings.get("GC3_FUSED_TILE"))[0]) != 1:
                # A tile of two ranks' rows stores both halves as it is.
                _log().info("gc3 torch %s: GC3_FUSED_PEER_TILES=copy-engine, but %s's tiles hold two ranks' "
                            "rows; the GEMM stores them", what, op)
                got = cache[key] = _shape(pg, op, A, B, what)
                return got
            # A captured call of the shape stores its tiles itself: its buffers are mapped now.
            _shape(pg, op, A, B, what)
        with fused_call(pg, [A, B], what):
            got = cache[key] = _Shape(ipc_group(pg), pg, *key)
        if len(cache) > TABLE_SHAPES:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return got


def ready(pg, op: str, A: torch.Tensor, B: torch.Tensor) -> bool:
    """Whether this shape's buffers are mapped already (a capture cannot map them)."""
    return _key(op, A, B, pg.size()) + (False,) in pg.__dict__.get("_gc3_tile_store", {})


def check(pg) -> None:
    """Raise gc3.errors.RuntimeTimeoutError if a wait of this group gave up."""
    group = pg.__dict__.get("_gc3_copy_engine")
    if group is not None:
        group.watchdog.check()


def _call(pg, op: str, A: torch.Tensor, B: torch.Tensor, what: str, peer_tiles: str) -> torch.Tensor:
    check(pg)
    sh = _shape(pg, op, A, B, what, _copy_engines(peer_tiles))
    out = A.new_empty((sh.rows if op == "gemm_rs" else sh.M, sh.N))
    if sh.copies is None:
        sh.launch(A, B, out)
    else:
        sh.copies.run(lambda: sh.launch(A, B, out))
    return out


def _copy_engines(measured: str = "store") -> bool:
    """Whether this call's peer tiles go by copy engine: asked for (GC3_FUSED_PEER_TILES, where
    unset the `measured` choice for the shape), an eager call, and the driver's stream memory
    operations at hand."""
    from runtime_cuda.core import cudadriver

    if (settings.get("GC3_FUSED_PEER_TILES") or measured) != "copy-engine" or torch.cuda.is_current_stream_capturing():
        return False
    if cudadriver.driver() is None:
        _no_driver()
        return False
    return True


@functools.lru_cache(maxsize=None)
def _no_driver() -> None:
    _log().warning("gc3 torch: GC3_FUSED_PEER_TILES=copy-engine needs cuda-bindings with a CUDA driver, which did "
                   "not import here; the GEMM stores the peers' tiles")


def _log():
    from runtime_cuda.nccl.log import get_logger
    return get_logger()


def matmul_reduce_scatter(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str,
                          peer_tiles: str = "store") -> torch.Tensor:
    """rows r of sum_s A_s @ B_s (sum over ranks), [M/G, N]; A [M, K_r], B [K_r, N] contiguous."""
    return _call(pg, "gemm_rs", A, B, what, peer_tiles)


def matmul_all_reduce(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str,
                      peer_tiles: str = "store") -> torch.Tensor:
    """sum_s A_s @ B_s on every rank, [M, N]."""
    return _call(pg, "gemm_ar", A, B, what, peer_tiles)


def matmul_all_to_all(pg, A: torch.Tensor, B: torch.Tensor, chunks: int, what: str,
                      peer_tiles: str = "store") -> torch.Tensor:
    """all_to_all_single(A @ B): row block q of the result came from rank q (equal blocks)."""
    return _call(pg, "gemm_a2a", A, B, what, peer_tiles)


class Trace:
    """One traced all-gather + GEMM call's stamps (GC3_FUSED_TRACE=1): each copier's push and
    each output tile's K loop and store, in nanoseconds of the GPU's %globaltimer."""

    def __init__(self, stamps: torch.Tensor, copiers: int):
        self.stamps, self.copiers = stamps, copiers

    def intervals(self) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
        """(the pushes, the tiles) as (start, end) pairs; synchronizes with the call."""
        pairs = [tuple(p) for p in self.stamps.view(-1, 2).tolist()]
        return pairs[:self.copiers], pairs[self.copiers:]

    def overlap(self) -> float:
        """The share of the pushes' time during which some tile was being computed."""
        return overlap.covered(*self.intervals())


def all_gather_matmul(pg, A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], chunks: int, return_A: bool,
                      what: str) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """A = all_gather(A_shard) (rank-major rows), [A @ B]; A_shard [m, K], one B [K, N].  Under
    GC3_FUSED_TRACE=1 the call's stamps become overlap.last_trace (what the benchmark and the
    tests read of either pipeline)."""
    check(pg)
    B, = Bs
    sh = _shape(pg, "ag_gemm", A_shard, B, what)
    out = A_shard.new_empty((sh.M, sh.N))
    A = A_shard.new_empty((sh.M, sh.K)) if return_A else None
    trace = settings.get("GC3_FUSED_TRACE")
    stamps = torch.zeros((sh.copiers + sh.G * sh.tiles, 2), dtype=torch.int64, device=out.device) if trace else out
    sh.launch(A_shard, B, out, A_shard if A is None else A, stamps, RETURN_A=int(return_A), TRACE=int(trace))
    if trace:
        overlap.last_trace = Trace(stamps, sh.copiers)
    return A, [out]


RUNS = {"matmul_reduce_scatter": "gemm_rs", "matmul_all_reduce": "gemm_ar", "matmul_all_to_all": "gemm_a2a",
        "all_gather_matmul": "ag_gemm"}
