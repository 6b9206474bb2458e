"""One rank of torch programs written as a demanding PyTorch user would, run on
a gc3 group: init_process_group(device_id=...), DeviceMesh (1-D and 2-D, its
dimension groups from new_group), subgroups of a subset of ranks and of all
ranks in another order, list collectives (all_gather, all_to_all, gather,
scatter, reduce_scatter), object collectives, every ReduceOp on every dtype
NCCL has, odd tensors (non-contiguous, 0 elements, storage offsets), a side
stream, async work reused after wait() and its future, batch_isend_irecv.
Each result is compared exactly with a reference computed here from seeded
integer-valued inputs; where NCCL's process group refuses a call (bitwise ops,
non-contiguous tensors, monitored_barrier) the same refusal is expected.

    python torch_user_programs.py RANK WORLD STORE_PATH [--device cpu|cuda] [--hook]

--hook: ask for backend="nccl" and rely on GC3_TORCH=1 (run through the startup
hook).  --device cpu runs the same program on gloo (the CPU half of the gc3
group), which checks the references themselves.  Every check runs even after
one fails; prints "PASS name" / "FAIL name: why" and "ALL OK" only if none failed.
"""
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

rank, world, store_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
on = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
hook = "--hook" in sys.argv
dev = torch.device(on, 0) if on == "cuda" else torch.device("cpu")
if on == "cuda":
    torch.cuda.set_device(dev)
if hook:
    backend = "nccl"         # GC3_TORCH=1 and the startup hook make it gc3
else:
    import runtime_cuda.torch_dist as gc3_torch
    gc3_torch.register()
    backend = "cpu:gloo,cuda:gc3"
dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                        timeout=timedelta(seconds=120), device_id=dev if on == "cuda" else None)
pg = dist.group.WORLD
assert type(pg).__name__ == "Gc3ProcessGroup", type(pg)
R = range(world)
no_nccl = on == "cuda" and os.environ.get("GC3_TORCH_FALLBACK", "1") == "0"
failures = []


def run(name, fn):
    """One check; a failure is reported and the program goes on (all ranks still
    make the same calls: a check raises only after its collectives)."""
    before = len(failures)
    try:
        fn()
        if len(failures) == before:
            print(f"PASS {name} rank={rank}", flush=True)
    except Exception as exc:  # noqa: BLE001 -- reported, and fails the run at the end
        failures.append(name)
        print(f"FAIL {name} rank={rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}", flush=True)


def same(name, got, want):
    """Records a mismatch without raising: every rank then goes on making the
    same calls, whichever ranks saw wrong values."""
    got, want = got.cpu(), want.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        failures.append(name)
        print(f"FAIL {name} rank={rank}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:8].tolist()}, "
              f"want {want.dtype} {tuple(want.shape)} {want.flatten()[:8].tolist()}", flush=True)


def ints(r, n, lo=-3, hi=4, dtype=torch.float32, seed=0):
    """Rank r's seeded integer-valued input (the same on every rank that asks)."""
    g = torch.Generator().manual_seed(1000 * seed + r)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def refuses(name, call, *errors):
    try:
        call()
    except errors:
        return
    raise AssertionError(f"{name}: expected {[e.__name__ for e in errors]} (as NCCL's process group)")


# --- the group's face ----------------------------------------------------------------
def backend_names():
    assert dist.get_backend() == dist.get_backend(pg), (dist.get_backend(), dist.get_backend(pg))
    assert "gc3" in dist.get_backend(pg), dist.get_backend(pg)
    if on == "cuda":
        assert pg._get_backend(dev).name() == "gc3"


run("get_backend", backend_names)
dist.barrier()     # the first CUDA call builds the communicator: everyone is here


# --- reduce ops x dtypes ------------------------------------------------------------
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]


def reduce_ops(dtype):
    n = 300
    lo = 0 if dtype == torch.uint8 else -3
    xs = [ints(r, n, lo, 4, torch.int64, seed=1) for r in R]
    ps = [ints(r, n, 1, 3, torch.int64, seed=2) for r in R]     # products stay small: 2**4
    cases = [(dist.ReduceOp.SUM, xs, sum(xs)), (dist.ReduceOp.MIN, xs, torch.stack(xs).min(0).values),
             (dist.ReduceOp.MAX, xs, torch.stack(xs).max(0).values),
             (dist.ReduceOp.PRODUCT, ps, torch.stack(ps).prod(0))]
    if dtype.is_floating_point and on == "cuda":   # gloo has neither AVG nor PREMUL_SUM
        twice = [x * 2 for x in xs]                              # AVG of even sums is exact
        cases += [(dist.ReduceOp.AVG, twice, sum(twice) / world),
                  (dist._make_nccl_premul_sum(2.0), xs, 2 * sum(xs))]
    if not dtype.is_floating_point and on == "cuda":     # NCCL's integer avg: the sum divided toward zero
        cases.append((dist.ReduceOp.AVG, xs, torch.div(sum(xs), world, rounding_mode="trunc")))
    for op, inputs, want in cases:
        x = inputs[rank].to(dtype).to(dev, copy=True)
        dist.all_reduce(x, op=op)
        same(f"all_reduce {op} {dtype}", x, want.to(dtype))
    if not dtype.is_floating_point and on == "cuda":   # gloo has bitwise ops, NCCL not
        for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            refuses(f"all_reduce {op}", lambda: dist.all_reduce(xs[rank].to(dtype).to(dev, copy=True), op=op),
                    ValueError, RuntimeError)


for dt in FLOATS + INTS:
    run(f"reduce ops {dt}", lambda dt=dt: reduce_ops(dt))

# torch >= 2.3 has uint32/uint64 as limited dtypes: tensors without most arithmetic
# (and gloo has no reductions for them), so the references stay int64 and the
# results are compared as int64.
UINTS = [getattr(torch, name) for name in ("uint32", "uint64") if hasattr(torch, name)]


def reduce_ops_unsigned(dtype):
    n = 300
    xs = [ints(r, n, 0, 4, torch.int64, seed=1) for r in R]
    ps = [ints(r, n, 1, 3, torch.int64, seed=2) for r in R]
    cases = [(dist.ReduceOp.SUM, xs, sum(xs)), (dist.ReduceOp.MIN, xs, torch.stack(xs).min(0).values),
             (dist.ReduceOp.MAX, xs, torch.stack(xs).max(0).values),
             (dist.ReduceOp.PRODUCT, ps, torch.stack(ps).prod(0))]
    for op, inputs, want in cases:
        x = inputs[rank].to(dtype).to(dev, copy=True)
        dist.all_reduce(x, op=op)
        same(f"all_reduce {op} {dtype}", x.cpu().to(torch.int64), want)


if on == "cuda":
    for dt in UINTS:
        run(f"reduce ops {dt}", lambda dt=dt: reduce_ops_unsigned(dt))


def bools():
    flags = [ints(r, 64, 0, 2, torch.int64, seed=3).bool() for r in R]
    x = flags[rank].to(dev, copy=True)
    dist.all_reduce(x)                                          # NCCL: sum of bools is or
    same("bool sum", x, torch.stack(flags).any(0))
    x = flags[rank].to(dev, copy=True)
    dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
    same("bool product", x, torch.stack(flags).all(0))
    out = torch.empty(world * 64, dtype=torch.bool, device=dev)
    dist.all_gather_into_tensor(out, flags[rank].to(dev, copy=True))
    same("bool all_gather", out, torch.cat(flags))


run("bool tensors", bools)


def complex64():
    zs = [torch.complex(ints(r, 40, seed=4), ints(r, 40, seed=5)) for r in R]
    z = zs[rank].to(dev, copy=True)
    dist.all_reduce(z)
    same("complex64 sum", z, sum(zs))
    out = [torch.empty(40, dtype=torch.complex64, device=dev) for _ in R]
    dist.all_gather(out, zs[rank].to(dev, copy=True))
    same("complex64 all_gather", torch.stack(out), torch.stack(zs))
    b = zs[rank].to(dev, copy=True)
    dist.broadcast(b, src=world - 1)
    same("complex64 broadcast", b, zs[world - 1])


run("complex64", complex64)


# --- list collectives -----------------------------------------------------------------
def lists():
    k = 33
    outs = [torch.empty(3, k, device=dev) for _ in R]
    mine = ints(rank, 3 * k, seed=6).view(3, k).to(dev, copy=True)
    dist.all_gather(outs, mine)
    for q in R:
        same(f"all_gather [{q}]", outs[q], ints(q, 3 * k, seed=6).view(3, k))
    # all_to_all with a different size per pair (NCCL's process group allows it,
    # gloo not): rank r sends r + 2p + 1 elements to p.
    size = (lambda src, dst: src + 2 * dst + 1) if on == "cuda" else (lambda src, dst: 5)
    sends = [ints(rank * world + p, size(rank, p), seed=7).to(dev, copy=True) for p in R]
    recvs = [torch.empty(size(q, rank), device=dev) for q in R]
    if on == "cuda":
        dist.all_to_all(recvs, sends)
    else:   # gloo has no list all_to_all (torch 2.11): the same exchange as one all_to_all_single
        flat = torch.empty(sum(r.numel() for r in recvs))
        dist.all_to_all_single(flat, torch.cat(sends), [r.numel() for r in recvs], [s.numel() for s in sends])
        recvs = list(flat.split([r.numel() for r in recvs]))
    for q in R:
        same(f"all_to_all from {q}", recvs[q], ints(q * world + rank, size(q, rank), seed=7))
    # reduce_scatter, list input: chunk p of every rank's list is summed onto rank p.
    chunks = [[ints(r * world + p, 17, seed=8) for p in R] for r in R]
    out = torch.empty(17, device=dev)
    if on == "cuda":
        dist.reduce_scatter(out, [c.to(dev, copy=True) for c in chunks[rank]])
    else:   # some gloo builds have no reduce_scatter: the same sum as an all_reduce, this rank's part kept
        whole = torch.cat(chunks[rank])
        dist.all_reduce(whole)
        out = whole[17 * rank:17 * (rank + 1)]
    same("reduce_scatter list", out, sum(chunks[r][rank] for r in R))
    for root in sorted({0, world - 1}):
        got = [torch.empty(5, device=dev) for _ in R] if rank == root else None
        dist.gather(ints(rank, 5, seed=9).to(dev, copy=True), got, dst=root)
        if rank == root:
            same(f"gather root {root}", torch.stack(got), torch.stack([ints(r, 5, seed=9) for r in R]))
        got = torch.empty(6, device=dev)
        parts = [ints(10 * root + p, 6, seed=10).to(dev, copy=True) for p in R]
        dist.scatter(got, parts if rank == root else None, src=root)
        same(f"scatter root {root}", got, ints(10 * root + rank, 6, seed=10))


run("list collectives", lists)


def objects():
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "text": "x" * (rank * 7 + 1)})
    assert gathered == [{"rank": r, "text": "x" * (r * 7 + 1)} for r in R], gathered
    objs = [("from", rank), list(range(rank + 3))] if rank == world - 1 else [None, None]
    dist.broadcast_object_list(objs, src=world - 1)
    assert objs == [("from", world - 1), list(range(world + 2))], objs
    got = [None]
    dist.scatter_object_list(got, [{"to": p, "pad": "y" * p} for p in R] if rank == 0 else None, src=0)
    assert got == [{"to": rank, "pad": "y" * rank}], got
    back = [None] * world if rank == 0 else None
    dist.gather_object(("gathered", rank), back, dst=0)
    if rank == 0:
        assert back == [("gathered", r) for r in R], back


run("object collectives", objects)
run("monitored_barrier refused as with NCCL", lambda: refuses(
    "monitored_barrier", lambda: dist.monitored_barrier(timeout=timedelta(seconds=30)), ValueError, RuntimeError))


# --- odd tensors, streams, async -------------------------------------------------------
def odd_tensors():
    t = ints(rank, 64, seed=11).view(8, 8).to(dev, copy=True).t()         # a transposed view
    if on == "cuda":
        refuses("all_reduce of a transposed view", lambda: dist.all_reduce(t), ValueError, RuntimeError)
    for name, call in [("all_reduce", lambda: dist.all_reduce(torch.empty(0, device=dev))),
                       ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
                           torch.empty(0, device=dev), torch.empty(0, device=dev))),
                       ("all_to_all_single", lambda: dist.all_to_all_single(
                           torch.empty(0, device=dev), torch.empty(0, device=dev))),
                       ("broadcast", lambda: dist.broadcast(torch.empty(0, 3, device=dev), src=0))]:
        call()                                                   # 0 elements: nothing moves, nothing fails
    big = [ints(r, 100, seed=12) for r in R]
    whole = big[rank].to(dev, copy=True)
    dist.all_reduce(whole[37:71])                                # a view with a storage offset
    want = big[rank].clone()
    want[37:71] = sum(b[37:71] for b in big)
    same("all_reduce of a slice", whole, want)
    out = torch.zeros(world * 20 + 9, device=dev)
    dist.all_gather_into_tensor(out[9:], whole[50:70].clone())
    same("all_gather into a slice: the part before it", out[:9], torch.zeros(9))
    reduced = [b.clone() for b in big]
    for b in reduced:
        b[37:71] = sum(c[37:71] for c in big)
    same("all_gather into a slice", out[9:], torch.cat([b[50:70] for b in reduced]))


run("odd tensors", odd_tensors)


def streams_and_async():
    xs = [ints(r, 4097, seed=13) for r in R]
    if on == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x = xs[rank].to(dev, copy=True) * 3                             # made and reduced on the side stream
            dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(side)
        same("all_reduce on a side stream", x, sum(xs) * 3)
    x = xs[rank].to(dev, copy=True)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    same("async all_reduce", x, sum(xs))
    work = dist.all_reduce(x, async_op=True)                    # the same tensor again, after wait()
    fut = work.get_future()
    value = fut.wait()
    same("async all_reduce reused", x, sum(xs) * world)
    if isinstance(value, list):
        same("the future's value", value[0], sum(xs) * world)
    x.add_(1)                                                   # the tensor is the caller's again
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    same("after the future", x, sum(xs) * world + 1)
    if on == "cuda":
        # Issued on one stream, waited for on another: the reader there must see the sum.
        # 64 MiB, so a reader not ordered after the call would read it half done.
        big = [ints(r, 1 << 24, seed=17) for r in R]
        side, other = torch.cuda.Stream(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = big[rank].to(dev, copy=True)
            work = dist.all_reduce(y, async_op=True)
        with torch.cuda.stream(other):
            work.wait()
            seen = y.clone()
        side.wait_stream(other)                                  # y is read there before it changes again
        with torch.cuda.stream(side):
            work = dist.all_reduce(y, async_op=True)
        with torch.cuda.stream(other):
            again = work.get_future().then(lambda f: f.value()[0].clone()).wait()
        torch.cuda.current_stream().wait_stream(other)
        torch.cuda.current_stream().wait_stream(side)
        same("async all_reduce waited on another stream", seen, sum(big))
        same("its future's callback on another stream", again, sum(big) * world)


run("streams and async", streams_and_async)


def point_to_point():
    if world < 2:
        return
    mine = ints(rank, 12, seed=14).to(dev, copy=True)
    got = torch.empty(12, device=dev)
    ops = [dist.P2POp(dist.isend, mine, (rank + 1) % world), dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    if no_nccl:
        # gc3 has no point-to-point programs and no NCCL stands behind it here
        refuses("batch_isend_irecv without NCCL", lambda: [w.wait() for w in dist.batch_isend_irecv(ops)],
                Exception)
        return
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same("batch_isend_irecv ring", got, ints((rank - 1) % world, 12, seed=14))


if on == "cpu" or no_nccl:     # with NCCL behind gc3, one stream's unpaired send and recv would not pair up
    run("batch_isend_irecv", point_to_point)


# --- subgroups and meshes -----------------------------------------------------------------
def subgroups():
    first = list(range(min(2, world)))
    sub = dist.new_group(first)                                  # every rank calls new_group
    if rank in first:
        x = ints(rank, 500, seed=15).to(dev, copy=True)
        dist.all_reduce(x, group=sub)
        same("subset all_reduce", x, sum(ints(r, 500, seed=15) for r in first))
        assert dist.get_group_rank(sub, rank) == first.index(rank)
    rev = dist.new_group(list(reversed(R)))
    # torch numbers a new group's ranks in the sorted order of the global ranks it was given
    members = dist.get_process_group_ranks(rev)
    assert members == list(R) and dist.get_group_rank(rev, rank) == rank, (members, dist.get_group_rank(rev, rank))
    out = torch.empty(world * 7, device=dev)
    dist.all_gather_into_tensor(out, ints(rank, 7, seed=16).to(dev, copy=True), group=rev)
    same("reordered group all_gather", out, torch.cat([ints(g, 7, seed=16) for g in members]))
    x = ints(rank, 64, seed=17).to(dev, copy=True)
    dist.broadcast(x, group_src=world - 1, group=rev)
    same("reordered group broadcast", x, ints(members[world - 1], 64, seed=17))


run("subgroups", subgroups)


def meshes():
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(on, (world,))
    g = mesh.get_group()
    x = ints(rank, 256, seed=18).to(dev, copy=True)
    dist.all_reduce(x, group=g)
    same("1-D mesh all_reduce", x, sum(ints(r, 256, seed=18) for r in R))
    dp = 2 if world % 2 == 0 and world > 2 else 1
    mesh2 = init_device_mesh(on, (dp, world // dp), mesh_dim_names=("dp", "tp"))
    grid = torch.arange(world).view(dp, world // dp)
    here = (grid == rank).nonzero()[0].tolist()
    for name, peers in (("tp", grid[here[0]].tolist()), ("dp", grid[:, here[1]].tolist())):
        grp = mesh2.get_group(name)
        assert sorted(dist.get_process_group_ranks(grp)) == sorted(peers), (name, peers)
        x = ints(rank, 128, seed=19).to(dev, copy=True)
        dist.all_reduce(x, group=grp)
        same(f"2-D mesh {name} all_reduce", x, sum(ints(r, 128, seed=19) for r in peers))
        out = torch.empty(len(peers) * 8, device=dev)
        dist.all_gather_into_tensor(out, ints(rank, 8, seed=20).to(dev, copy=True), group=grp)
        same(f"2-D mesh {name} all_gather", out, torch.cat([ints(r, 8, seed=20) for r in sorted(peers)]))


run("device meshes", meshes)

dist.barrier()
served = dict(pg.served) if hasattr(pg, "served") else {}
if failures:
    print(f"FAILED rank={rank}: {failures}", flush=True)
    sys.exit(1)
print(f"ALL OK rank={rank} served={served}", flush=True)
dist.destroy_process_group()
