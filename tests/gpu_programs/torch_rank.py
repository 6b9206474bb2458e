"""This process's rank of a "cpu:gloo,cuda:gc3" group over a file store, for the
torch rank programs here:

    rank, world, dev, pg = torch_rank.join(sys.argv)   # argv: prog RANK WORLD STORE_PATH ... [--device cpu|cuda]

`--device cpu` gives the CPU half of the group (gloo), where there is no GPU;
otherwise GPU 0 (ranks of a test share it), or with `--spread` GPU rank % count.
"""
from datetime import timedelta

import torch
import torch.distributed as dist

import runtime_cuda.torch_dist as gc3_torch


def join(argv):
    rank, world, store_path = int(argv[1]), int(argv[2]), argv[3]
    on = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    spread = "--spread" in argv and on == "cuda"
    dev = torch.device(on, rank % torch.cuda.device_count() if spread else 0) if on == "cuda" else torch.device("cpu")
    if on == "cuda":
        torch.cuda.set_device(dev)
    gc3_torch.register()
    dist.init_process_group("cpu:gloo,cuda:gc3", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    return rank, world, dev, dist.group.WORLD


def same_on_all_ranks(name: str, t: torch.Tensor) -> None:
    """Raises where the ranks of the default group hold different bits in t (a signature of
    its bytes, gathered)."""
    bits = t.contiguous().view(torch.uint8).reshape(-1).to(torch.int64)
    sig = torch.stack([bits.sum(), (bits * torch.arange(1, bits.numel() + 1, device=t.device).remainder(65521)).sum()])
    sigs = [torch.zeros_like(sig) for _ in range(dist.get_world_size())]
    dist.all_gather(sigs, sig)
    if any(not torch.equal(s, sigs[0]) for s in sigs):
        raise AssertionError(f"rank {dist.get_rank()}: {name}: ranks hold different bits: {[s.tolist() for s in sigs]}")


def finish(rank: int) -> None:
    """The program passed: say so, then leave without the interpreter's teardown, where
    torch's gloo threads sometimes abort a process that is already done ("terminate called
    without an active exception", exit -6); the barrier first keeps any rank from closing its
    sockets while a peer still uses them."""
    import os
    import sys

    dist.barrier()
    dist.destroy_process_group()
    print(f"ALL OK rank={rank}", flush=True)
    sys.stderr.flush()
    os._exit(0)


def passed(name: str) -> None:
    print(f"PASS {name} rank={dist.get_rank()}", flush=True)


def inputs(dev, seed: int, r: int, shape, dtype=torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    """Rank r's tensor of `seed`, the same on every rank that asks (a generator per (seed, r))."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed * 1000 + r)
    return (torch.randn(shape, generator=g, device=dev) * scale).to(dtype)


def close(name: str, got: torch.Tensor, ref: torch.Tensor, seq: torch.Tensor) -> None:
    """got's error against the fp32 reference is no larger than the sequential path's (+ one bf16
    rounding of the largest element); says PASS."""
    scale = ref.abs().max().clamp_min(1e-30)
    e_got = float((got.float() - ref).abs().max() / scale)
    e_seq = float((seq.float() - ref).abs().max() / scale)
    if not e_got <= max(1.25 * e_seq, e_seq + 2 ** -8):
        raise AssertionError(f"rank {dist.get_rank()}: {name}: error {e_got:.3e} against fp32, "
                             f"sequential path {e_seq:.3e}")
    passed(name)
