"""Per-call cost of torch.distributed.all_reduce on a CUDA tensor, gc3 backend beside NCCL.

    torchrun --nproc-per-node 2 scripts/bench_torch_calls.py [--size 16KiB] [--dtype bfloat16] [--profile]

Each backend gets its own process group in the same processes (gc3 over
"cpu:gloo,cuda:gc3", NCCL as a new_group with backend "nccl"), on the same
tensor.  For each: the median over rounds of (a) the host time to issue one
call in a loop of --calls back-to-back calls, and (b) the device time per call
of that loop (events around it), after a check that the sum is right.
--profile: cProfile of rank 0's gc3 calls, the 20 most costly functions by own
time, to show where the host time goes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    from gc3.units import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="16KiB", help="bytes per rank, e.g. 16KiB")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--calls", type=int, default=50, help="back-to-back calls per round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    try:
        args.nbytes = parse_size(args.size)
    except Exception as exc:
        ap.error(f"--size: {exc}")
    if args.nbytes <= 0 or args.calls < 1 or args.rounds < 1:
        ap.error("--size, --calls and --rounds must be positive")
    return args


def rounds(call, calls: int, n: int):
    """(median host us per call, median device us per call) over n rounds."""
    import torch

    host, dev = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        host.append((time.perf_counter() - t0) * 1e6 / calls)
        stop.record()
        stop.synchronize()
        dev.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(host), statistics.median(dev)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    import runtime_cuda.torch_dist as gc3_torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gc3_torch.register()
    dist.init_process_group("cpu:gloo,cuda:gc3")
    groups = {"gc3": dist.group.WORLD, "nccl": dist.new_group(list(range(world)), backend="nccl")}
    dtype = getattr(torch, args.dtype)
    n = max(1, args.nbytes // torch.empty((), dtype=dtype).element_size())
    x = torch.empty(n, dtype=dtype, device="cuda")
    rows = []
    for name, group in groups.items():
        x.fill_(rank + 1)
        dist.all_reduce(x, group=group)
        want = world * (world + 1) / 2
        ok = bool((x == want).all().item())
        call = lambda g=group: dist.all_reduce(x, group=g)   # noqa: E731  (values grow; only time is read)
        rounds(call, args.calls, 2)
        host, dev = rounds(call, args.calls, args.rounds)
        rows.append((name, host, dev, ok))
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls * 20):
            dist.all_reduce(x, group=groups["gc3"])
        prof.disable()
        torch.cuda.synchronize()
        if rank == 0:
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    if rank == 0:
        print(f"# all_reduce {args.nbytes} B {args.dtype} x {args.calls} back to back, median of {args.rounds} "
              f"rounds, {world} ranks, {torch.cuda.get_device_name()}")
        print(f"{'backend':<8}{'host us/call':>14}{'device us/call':>16}  check")
        for name, host, dev, ok in rows:
            print(f"{name:<8}{host:>14.1f}{dev:>16.1f}  {'ok' if ok else 'WRONG'}")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
