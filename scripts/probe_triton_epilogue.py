"""Does a GEMM that stores its tiles straight into the peers beat matmul-then-NCCL? (dev tooling)

    torchrun --nproc-per-node G scripts/probe_triton_epilogue.py OP:M:K:N ...

OP is gemm_rs, gemm_ar or gemm_a2a; M, K, N are the full layer's, as `gc3 bench --fused`
takes them (bench_fused.Case).  The GEMM is scripts/probe_triton_gemm.py's persistent
Triton kernel; each output tile whose rows belong to rank d is stored by TMA into rank d's
buffer (PyTorch's symmetric memory maps the peers), starting with the next rank's rows so
that every link is busy from the first tile.  Then one device barrier, and:
  - gemm_a2a: nothing more (the tiles landed in the peers' outputs);
  - gemm_rs: each rank sums the G partials of its rows in rank order, in fp32;
  - gemm_ar: the same sum, stored into every rank's output, and a second barrier.
Buffers alternate between two parities, so a call never writes what a peer may still
be reading from the call before.  Eager calls, CUDA-event medians, max over ranks, in
the same job as seq-nccl (matmul then NCCL) and PyTorch's fused op where it has one.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from runtime_cuda.torch_dist import bench_fused as bf

BM, BN, BK, STAGES, WARPS = 128, 256, 64, 3, 8


@triton.jit
def _gemm_scatter(a_desc, b_desc, table, M, N, K, rows_per, first_block,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                  NUM_SMS: tl.constexpr, WS: tl.constexpr, FLAT: tl.constexpr):
    start = tl.program_id(0)
    pm = tl.cdiv(M, BM)
    pn = tl.cdiv(N, BN)
    kt = tl.cdiv(K, BK)
    for t in tl.range(start, pm * pn, NUM_SMS, flatten=FLAT, warp_specialize=WS):
        group = GROUP_M * pn
        first = (t // group) * GROUP_M
        gsz = tl.minimum(pm - first, GROUP_M)
        pid_m = (first + (t % group) % gsz + first_block) % pm
        pid_n = (t % group) // gsz
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), tl.float32)
        for ki in range(kt):
            a = a_desc.load([off_m, ki * BK])
            b = b_desc.load([ki * BK, off_n])
            acc = tl.dot(a, b, acc)
        # The rows' owner: its buffer (a peer's, mapped here) gets the tile by TMA.
        d = off_m // rows_per
        base = tl.load(table + d).to(tl.pointer_type(tl.bfloat16))
        dst = tl.make_tensor_descriptor(base, shape=[rows_per, N], strides=[N, 1], block_shape=[BM, BN])
        dst.store([off_m - d * rows_per, off_n], acc.to(tl.bfloat16))


@triton.jit
def _sum_slots(src, n, out, outs, G: tl.constexpr, PUSH: tl.constexpr, BLOCK: tl.constexpr):
    """sum over slots s of src[s] (fp32, slot order), into out or, PUSH, into every outs[p]."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    acc = tl.load(src + i, mask=m).to(tl.float32)
    for s in tl.static_range(1, G):
        acc += tl.load(src + s * n + i, mask=m).to(tl.float32)
    y = acc.to(tl.bfloat16)
    if PUSH:
        for p in tl.static_range(G):
            dst = tl.load(outs + p).to(tl.pointer_type(tl.bfloat16))
            tl.store(dst + i, y, mask=m)
    else:
        tl.store(out + i, y, mask=m)


class Fused:
    def __init__(self, case: bf.Case, A, B, rank: int, G: int, group_name: str, ws: bool):
        self.op, self.rank, self.G, self.ws = case.op, rank, G, ws
        M, N = A.shape[0], B.shape[1]
        self.M, self.N, self.K = M, N, A.shape[1]
        rows = M // G
        self.rows = rows
        assert rows % BM == 0, f"M/G = {rows} must be a multiple of {BM}"
        dev = A.device
        # parity x slot x rows x N: a2a lands in the peers' outputs, rs/ar in their slots.
        per = rows * N * G
        self.buf = symm_mem.empty(2 * per, dtype=torch.bfloat16, device=dev)
        self.h = symm_mem.rendezvous(self.buf, group_name)
        self.peer = [self.h.get_buffer(p, (2, G, rows, N), torch.bfloat16) for p in range(G)]
        if case.op == "gemm_ar":
            self.obuf = symm_mem.empty(2 * M * N, dtype=torch.bfloat16, device=dev)
            self.oh = symm_mem.rendezvous(self.obuf, group_name)
            outs = [self.oh.get_buffer(p, (2, M, N), torch.bfloat16) for p in range(G)]
            self.out_tables = [torch.tensor([outs[p][par, rank * rows:(rank + 1) * rows].data_ptr() for p in range(G)],
                                            dtype=torch.int64, device=dev) for par in range(2)]
            self.outs_local = [outs[rank][par] for par in range(2)]
        self.a = TensorDescriptor.from_tensor(A, [BM, BK])
        self.b = TensorDescriptor.from_tensor(B, [BK, BN])
        self.tables = [torch.tensor([self.peer[p][par, rank].data_ptr() for p in range(G)], dtype=torch.int64,
                                    device=dev) for par in range(2)]
        self.grid = (min(SMS, (M // BM) * triton.cdiv(N, BN)),)
        self.first_block = ((rank + 1) % G) * (rows // BM)
        self.parity = 0

    def __call__(self):
        par = self.parity
        self.parity ^= 1
        G, rows, N = self.G, self.rows, self.N
        _gemm_scatter[self.grid](self.a, self.b, self.tables[par], self.M, N, self.K, rows, self.first_block, BM=BM,
                                 BN=BN, BK=BK, GROUP_M=8, NUM_SMS=SMS, WS=self.ws[0], FLAT=self.ws[1],
                                 num_stages=STAGES, num_warps=WARPS)
        self.h.barrier(channel=0)
        mine = self.peer[self.rank][par]
        if self.op == "gemm_a2a":
            return mine.view(G * rows, N)
        n = rows * N
        grid = (triton.cdiv(n, 4096),)
        if self.op == "gemm_rs":
            out = torch.empty((rows, N), dtype=torch.bfloat16, device=mine.device)
            _sum_slots[grid](mine, n, out, out, G=G, PUSH=False, BLOCK=4096)
            return out
        _sum_slots[grid](mine, n, mine, self.out_tables[par], G=G, PUSH=True, BLOCK=4096)
        self.oh.barrier(channel=0)
        return self.outs_local[par]


def local_gemm(A, B, ws):
    """The same kernel storing into one local C (ws: (warp-specialized, flattened loops))."""
    M, K = A.shape
    N = B.shape[1]
    C = torch.empty((M, N), dtype=A.dtype, device=A.device)
    a = TensorDescriptor.from_tensor(A, [BM, BK])
    b = TensorDescriptor.from_tensor(B, [BK, BN])
    table = torch.tensor([C.data_ptr()], dtype=torch.int64, device=A.device)
    grid = (min(SMS, triton.cdiv(M, BM) * triton.cdiv(N, BN)),)

    def run():
        _gemm_scatter[grid](a, b, table, M, N, K, M, 0, BM=BM, BN=BN, BK=BK, GROUP_M=8, NUM_SMS=SMS, WS=ws[0],
                            FLAT=ws[1], num_stages=STAGES, num_warps=WARPS)
        return C
    return run


SMS = 0


def main():
    global SMS
    # Scratch for the descriptors the GEMM makes on the device (one per tile it stores).
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    job = bf.start()
    SMS = torch.cuda.get_device_properties(job.device).multi_processor_count
    timer = bf.Timer(job, 10, 3)
    G = job.size
    for spec in sys.argv[1:]:
        op, M, K, N = spec.split(":")[0], *map(int, spec.split(":")[1:])
        case = bf.Case(op, M, K, N, G, job.device)
        A, B = case.operands(job.rank)
        seq = bf.seq_call(case, A, B, job.nccl)
        t = {"seq": timer.device(seq), "cublas": timer.device(lambda: A @ B),
             "comm": timer.device(bf.comm_call(case, A, B, job.nccl))}
        best = None
        for ws in ((False, True), (True, True), (False, False), (True, False)):
            try:
                tt = timer.device(local_gemm(A, B, ws))
            except Exception as e:  # a variant this Triton cannot compile
                if job.rank == 0:
                    print(f"  variant ws={ws[0]} flat={ws[1]}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                torch.cuda.synchronize()
                continue
            t[f"triton_ws{int(ws[0])}f{int(ws[1])}"] = tt
            if best is None or tt < best[0]:
                best = (tt, ws)
        if best is None:
            continue
        symm_mem.enable_symm_mem_for_group(job.nccl.group_name)
        fused = Fused(case, A, B, job.rank, G, job.nccl.group_name, best[1])
        t["fused"] = timer.device(fused)
        symm = bf.symm_call(case, A, B, job.nccl)
        t["symm"] = timer.device(symm) if symm else None
        # The check: error against fp32 rows no larger than seq-nccl's (bench_fused's rule).
        got, ref_out = fused(), seq()
        torch.cuda.synchronize()
        idx = torch.linspace(0, got.shape[0] - 1, min(got.shape[0], 64), device=job.device).long()
        ref = case.reference_rows(job.rank, idx)
        e_f, e_s = bf._error(got[idx], ref), bf._error(ref_out[idx], ref)
        bad = torch.tensor([int(e_f > max(1.25 * e_s, e_s + 2 ** -8))], device=job.device)
        dist.all_reduce(bad, group=job.nccl)
        if job.rank == 0:
            cells = " ".join(f"{k}={'n/a' if v is None else format(v, '.1f')}" for k, v in t.items())
            print(f"{op} G={G} M={M} K={K} N={N} {cells} seq/fused={t['seq'] / t['fused']:.3f} "
                  f"err_fused={e_f:.2e} err_seq={e_s:.2e} check={'BAD' if int(bad.item()) else 'ok'}", flush=True)
        del fused
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
