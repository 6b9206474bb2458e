"""Tensor-parallel + data-parallel training of a small MLP, on NCCL or on gc3.

The world is a (dp x tp) grid.  Each MLP block is Megatron-style: the first
linear layer split by columns, the second by rows, so the forward pass needs
one all_reduce over the tp group per block (and its backward one more); the
gradients are then averaged over the dp group.  Every rank of a dp replica
draws the same batch.  Prints the loss per step and the mean and median step time.

    torchrun --nproc-per-node 2 examples/train_tp_dp.py --backend nccl --tp 2
    torchrun --nproc-per-node 2 examples/train_tp_dp.py --backend gc3  --tp 2
    # 2 processes sharing ONE GPU (NCCL refuses that; gc3 only):
    torchrun --nproc-per-node 2 examples/train_tp_dp.py --backend gc3 --tp 2 --one-gpu

Compare the two loss curves: they agree within bf16 tolerance.  `--cpu` runs
the same on gloo: `--tp 2` on 2 processes prints the losses of `--tp 1` on one
(the split computes the same model).  On gc3, set
GC3_CONFIG to a catalog with an algorithm for each call (`gc3 tune --model-only
--quick --ranks N -o DIR/catalog.json`); where ranks share a GPU whatever gc3
has no algorithm for raises instead of going to NCCL.  GC3_TIMEOUT_S (seconds a
gc3 kernel waits for its peers; 5 by default) wants raising where ranks start
far apart.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["nccl", "gc3"], default="gc3")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (divides the world size)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--one-gpu", action="store_true", help="every rank on GPU 0 (gc3 only)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--cpu", action="store_true", help="CPU tensors on gloo (checks the TP/DP math without a GPU)")
    return p.parse_args()


def main():
    args = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the world size {world}")
    if args.one_gpu and args.backend == "nccl":
        raise SystemExit("--one-gpu needs --backend gc3: NCCL refuses two ranks on one GPU")
    if args.cpu:
        device, args.backend = torch.device("cpu"), "gloo"
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", 0 if args.one_gpu else local)
        torch.cuda.set_device(device)
        if args.backend == "gc3":
            import runtime_cuda.torch_dist as gc3_torch
            gc3_torch.register()
            dist.init_process_group("cpu:gloo,cuda:gc3")
        else:
            dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = getattr(torch, args.dtype)

    tp_rank, dp_rank = rank % args.tp, rank // args.tp
    tp_groups = [dist.new_group([d * args.tp + t for t in range(args.tp)]) for d in range(world // args.tp)]
    dp_groups = [dist.new_group([d * args.tp + t for d in range(world // args.tp)]) for t in range(args.tp)]
    tp, dp = tp_groups[dp_rank], dp_groups[tp_rank]

    # The full weights come from one seed on every rank; each keeps its shard,
    # so the run computes the same model whatever the split.
    torch.manual_seed(0)
    w, hidden = args.width, 4 * args.width
    shard = hidden // args.tp
    params = []
    for _ in range(args.blocks):
        up = torch.randn(hidden, w) / w ** 0.5
        down = torch.randn(w, hidden) / hidden ** 0.5
        params.append(up[tp_rank * shard:(tp_rank + 1) * shard].to(device, dtype).requires_grad_())
        params.append(down[:, tp_rank * shard:(tp_rank + 1) * shard].to(device, dtype).requires_grad_())
    head = (torch.randn(w, w) / w ** 0.5).to(device, dtype).requires_grad_()
    opt = torch.optim.SGD(params + [head], lr=0.05)

    class TPAllReduce(torch.autograd.Function):
        """Sum of the row-parallel partial outputs forward; gradient passes through."""
        @staticmethod
        def forward(ctx, x):
            x = x.contiguous()
            dist.all_reduce(x, group=tp)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class TPCopy(torch.autograd.Function):
        """Identity forward; the column-parallel input's gradient summed over tp."""
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous()
            dist.all_reduce(g, group=tp)
            return g

    def forward(x):
        for up, down in zip(params[0::2], params[1::2]):
            h = F.gelu(TPCopy.apply(x) @ up.t())
            x = x + TPAllReduce.apply(h @ down.t())
        return x @ head.t()

    losses, times = [], []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        x = torch.randn(args.batch, w, generator=g).to(device, dtype)
        target = torch.randn(args.batch, w, generator=g).to(device, dtype)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.mse_loss(forward(x).float(), target.float())
        loss.backward()
        mean = loss.detach().clone()
        if world > args.tp:   # a dp group of one rank has nothing to average
            for p in params + [head]:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp)
            dist.all_reduce(mean, op=dist.ReduceOp.AVG, group=dp)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(mean.item())
        if rank == 0:
            print(f"step {step:3d} loss {losses[-1]:.6f} time {times[-1] * 1e3:.2f} ms", flush=True)
    if rank == 0:
        warm = times[2:] or times
        # The median too: a shared machine's stray slow step moves a short run's mean by itself.
        print(f"backend={args.backend} world={world} tp={args.tp} dp={world // args.tp} "
              f"mean step {sum(warm) / len(warm) * 1e3:.2f} ms, median {statistics.median(warm) * 1e3:.2f} ms "
              f"(after 2 warm-up steps)")
        print("losses " + " ".join(f"{v:.6f}" for v in losses), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
