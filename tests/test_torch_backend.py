"""The torch.distributed backend's CPU-side parts: the backend-string rewrite
GC3_TORCH=1 applies, the NCCL-fallback decision, the c10d Store rendezvous,
registration, and CPU tensors going to gloo inside a gc3 group.  Where torch
is absent the torch tests skip with that reason; the rest need no torch."""
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from runtime_cuda.nccl.rendezvous import StoreExchange
from runtime_cuda.torch_dist import names
from thread_ranks import run_ranks as run_thread_ranks

ROOT = Path(__file__).resolve().parents[1]
try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


@pytest.mark.parametrize("given, expected", [
    (None, "cpu:gloo,cuda:gc3"),
    ("nccl", "cpu:gloo,cuda:gc3"),
    ("NCCL", "cpu:gloo,cuda:gc3"),
    ("gloo", "gloo"),
    ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:gc3"),
    ("cuda:nccl,cpu:gloo", "cuda:gc3,cpu:gloo"),
    ("cpu:gloo,cuda:gc3", "cpu:gloo,cuda:gc3"),
    ("cuda:nccl", "cuda:gc3"),
])
def test_gc3_torch_takes_nccls_place_only(given, expected):
    assert names.swap_nccl(given) == expected


@pytest.mark.parametrize("bad", ["cpu:gloo,cuda", "cpu:gloo,:nccl", "cuda:nccl,cuda:gloo"])
def test_a_bad_backend_string_names_the_entry(bad):
    with pytest.raises(ValueError, match="backend string"):
        names.parse(bad)


def test_the_environment_switches():
    assert names.enabled({"GC3_TORCH": "1"}) and not names.enabled({}) and not names.enabled({"GC3_TORCH": "0"})
    assert names.fallback_disabled({"GC3_TORCH_FALLBACK": "0"}) and not names.fallback_disabled({})


def test_nccl_stands_behind_gc3_only_with_one_gpu_per_rank():
    apart = [("h", "0000:01:00.0"), ("h", "0000:02:00.0"), ("g", "0000:01:00.0")]
    assert names.no_nccl_reason(apart, {}) == ""
    shared = apart + [("h", "0000:02:00.0")]
    assert "ranks 1 and 3 share GPU 0000:02:00.0" in names.no_nccl_reason(shared, {})
    assert "GC3_TORCH_FALLBACK=0" in names.no_nccl_reason(apart, {"GC3_TORCH_FALLBACK": "0"})


class DictStore:
    """The two Store calls the exchange uses, with a blocking get, as c10d's."""

    def __init__(self):
        self._data, self._cv = {}, threading.Condition()

    def set(self, key, value):
        with self._cv:
            self._data[key] = value.encode() if isinstance(value, str) else bytes(value)
            self._cv.notify_all()

    def get(self, key):
        with self._cv:
            assert self._cv.wait_for(lambda: key in self._data, timeout=30), f"no rank wrote {key}"
            return self._data[key]


def exchange_on_threads(store_for, n):
    out, errors = [None] * n, []

    def rank(r):
        try:
            x = StoreExchange(store_for(r), r, n, prefix="t")
            got = [x.allgather({"rank": r, "blob": bytes(range(r + 1))}), x.bcast(f"root{r}", root=n - 1),
                   x.all_agree(r != 1, "rank 1 says no")]
            x.barrier()
            got.append(x.allgather(r * 10))
            out[r] = got
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    run_thread_ranks(n, rank, 60)
    assert not errors, errors
    for r in range(n):
        gathered, root, agree, last = out[r]
        assert gathered == [{"rank": q, "blob": bytes(range(q + 1))} for q in range(n)]
        assert root == f"root{n - 1}"
        assert agree == ["" if q != 1 else "rank 1 says no" for q in range(n)]
        assert last == [q * 10 for q in range(n)]
        assert StoreExchange(None, r, n).Get_size() == n


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_store_exchange_gathers_in_rank_order(n):
    store = DictStore()
    exchange_on_threads(lambda r: store, n)


@needs_torch
@pytest.mark.parametrize("kind", ["hash", "file"])
def test_the_store_exchange_over_torch_stores(kind, tmp_path):
    if kind == "hash":
        store = dist.HashStore()
        store.set_timeout(timedelta(seconds=30))
        exchange_on_threads(lambda r: store, 3)
    else:
        path = str(tmp_path / "store")
        exchange_on_threads(lambda r: dist.FileStore(path, 3), 3)


TORCH_PROGRAM = r"""
import sys, torch, torch.distributed as dist
from datetime import timedelta
rank, n, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if "--hook" not in sys.argv:
    import runtime_cuda.torch_dist as t
    t.register()
    backend = "cpu:gloo,cuda:gc3"
else:
    backend = "nccl"         # GC3_TORCH=1 and the startup hook make it gc3
store = dist.FileStore(path, n)
dist.init_process_group(backend, store=store, rank=rank, world_size=n, timeout=timedelta(seconds=60))
pg = dist.group.WORLD
assert type(pg).__name__ == "Gc3ProcessGroup", type(pg)
assert pg._get_backend(torch.device("cpu")).name() == "gloo"
x = torch.arange(6, dtype=torch.float32) + rank
dist.all_reduce(x)
expect = n * torch.arange(6, dtype=torch.float32) + sum(range(n))
assert torch.equal(x, expect), (x, expect)
outs = [torch.empty(2) for _ in range(n)]
dist.all_gather(outs, torch.full((2,), float(rank)))
assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(n)]
dist.barrier()
print("ok", rank, dist.get_backend(), flush=True)
dist.destroy_process_group()
# No rank exits (closing its gloo sockets) while another still tears its group down:
# under load, a peer's gloo thread that sees the socket close mid-teardown aborts the process.
store.set(f"done{rank}", "1")
store.wait([f"done{r}" for r in range(n)])
# Everything is checked and printed: leave without the interpreter's teardown, where torch 2.13's
# gloo threads sometimes abort the process ("terminate called without an active exception").
sys.stdout.flush()
import os
os._exit(0)
"""


HOOKED = ["-c", "import runtime_cuda.startup, runpy, sys; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')"]


def spawn_ranks(program, n, tmp_path, env, *flags, timeout=240, says=None):
    """`python *program RANK N STORE *flags` for every rank; each must exit 0 and, with
    `says`, print says.format(rank=R).  Returns the ranks' outputs."""
    procs = [subprocess.Popen([sys.executable, *program, str(r), str(n), str(tmp_path / "store"), *flags],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"a rank hung (past {timeout} s); output so far:\n{[p.communicate()[0][-3000:] for p in procs]}")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and (says is None or says.format(rank=r) in out), \
            f"rank {r} (exit {p.returncode}):\n{out[-6000:]}"
    return outs


def run_ranks(n, tmp_path, *flags, env=None):
    prog = tmp_path / "prog.py"
    prog.write_text(TORCH_PROGRAM)
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    pre = HOOKED if "--hook" in flags else []
    return spawn_ranks([*pre, str(prog)], n, tmp_path, full, *flags, timeout=120)


@needs_torch
@pytest.mark.parametrize("n", [1, 2])
def test_cpu_tensors_of_a_gc3_group_go_to_gloo(n, tmp_path):
    outs = run_ranks(n, tmp_path)
    assert all(f"ok {r} cpu:gloo,cuda:gc3" in outs[r] for r in range(n)), outs


@needs_torch
def test_gc3_torch_turns_nccl_into_gc3_without_changing_the_script(tmp_path):
    outs = run_ranks(2, tmp_path, "--hook", env={"GC3_TORCH": "1"})
    assert all("cpu:gloo,cuda:gc3" in o for o in outs), outs


@needs_torch
def test_registration_is_idempotent():
    from runtime_cuda import torch_dist
    torch_dist.register()
    torch_dist.register()
    assert "gc3" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map.get("cuda") in ("gc3", "nccl")


def test_the_startup_hook_does_not_import_torch():
    env = dict(os.environ, GC3_TORCH="1", PYTHONPATH=str(ROOT))
    code = ("import sys, runtime_cuda.startup; "
            "from runtime_cuda.torch_dist import hook; "
            "print('torch' in sys.modules, any(isinstance(f, hook._Finder) for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], (out.stdout, out.stderr)


PROGRAM = ROOT / "tests" / "gpu_programs" / "torch_backend.py"


def tuned_catalog(n, folder, *more):
    """A catalog with an algorithm for every collective at n ranks (and at each rank
    count in `more`, for subgroups) -- the cost model's pick, seconds to make -- so
    no call needs the NCCL these ranks cannot have."""
    import json
    entries = []
    for k in (n,) + more:
        path = folder / f"catalog{k}" / "catalog.json"
        path.parent.mkdir(exist_ok=True)
        # `python -m runtime_cuda`: gc3's CLI with the runtime's commands, installed or not.
        out = subprocess.run([sys.executable, "-m", "runtime_cuda", "tune", "--model-only", "--quick", "--ranks",
                              str(k), "-o", str(path)], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert out.returncode == 0, out.stdout + out.stderr
        for entry in json.loads(path.read_text())["algorithms"]:
            # Kernel entries (one-shot/two-shot allreduce) name no file.
            entries.append(dict(entry, file=str(path.parent / entry["file"])) if "file" in entry else entry)
    merged = folder / "catalog.json"
    merged.write_text(json.dumps({"version": 1, "algorithms": entries}))
    return merged


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_through_torch_on_ranks_sharing_one_gpu(n, tmp_path):
    """n processes on one GPU, NCCL fallback off: each collective exact, async,
    graph capture, torch.compile, DDP and FSDP2 (tests/gpu_programs/torch_backend.py)."""
    # GC3_TIMEOUT_S: a gc3 kernel waits for its peers on the GPU; here a peer may
    # still be compiling (torch.compile) or building DDP for several seconds.
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH_FALLBACK="0", NCCL_NVLS_ENABLE="0", GC3_TIMEOUT_S="90",
               GC3_CONFIG=str(tuned_catalog(n, tmp_path)), GC3_CACHE_DIR=str(tmp_path / "cache"))
    outs = spawn_ranks([str(PROGRAM)], n, tmp_path, env, says="DESTROYED rank={rank}")
    for needed in ("all_to_all_single uneven", "cuda graph replay 2", "torch.compile", "DDP step", "FSDP2 step",
                   "send without NCCL raises"):
        assert needed in outs[0], f"{needed!r} did not run on rank 0:\n{outs[0][-3000:]}"
    import ast
    served = ast.literal_eval(outs[0].split("served=")[1].splitlines()[0])
    assert "NCCL" not in served and sum(served.values()) >= 40, f"gc3 served too little: {served}"


def test_the_gpu_program_checks_its_references_on_gloo(tmp_path):
    """The GPU program's references, run where there is no GPU: the same checks on
    the CPU half of a gc3 group (gloo), two ranks."""
    if torch is None:
        pytest.skip("torch not installed")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, str(PROGRAM), str(r), "2", str(tmp_path / "store"), "--device", "cpu"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"ALL OK rank={r}" in out and f"DESTROYED rank={r}" in out, out[-4000:]
    assert outs[0].count("PASS") >= 30, outs[0]


class HostComm:
    """The communicator's submit() over host memory for ranks on threads: what the
    process group's CUDA path hands gc3 (pointers, NCCL counts, codes, roots),
    computed with numpy, so the glue around it (list outputs, AVG/PREMUL_SUM,
    uneven all-to-all packing) is checked exactly on the CPU."""

    def __init__(self, n, shared, multiple=1):
        self.n, self.shared = n, shared   # shared: {"slots": [...], "barrier": threading.Barrier}
        self.multiple, self.counts = multiple, []

    @staticmethod
    def view(ptr, count, code):
        import ctypes

        import numpy as np

        from runtime_cuda.nccl.constants import DTYPE_NAMES, numpy_dtype
        dt = numpy_dtype(DTYPE_NAMES[code])
        return np.frombuffer((ctypes.c_char * (count * dt.itemsize)).from_address(ptr), dtype=dt)

    def submit(self, coll, send, recv, count, code, op, stream, root=0):
        import numpy as np

        from runtime_cuda.nccl.constants import OP_NAMES
        n, rank = self.n, self.rank
        from runtime_cuda.nccl.fallback import NoFallback
        if coll in ("broadcast", "reduce") and root != 0:
            # as with a catalog of root-0 programs and no NCCL behind gc3
            raise NoFallback(f"no {coll} program for root {root}")
        if count % self.multiple:
            # as a gc3 layout that needs whole chunks
            raise NoFallback(f"count {count} is not a multiple of {self.multiple}")
        self.counts.append((coll, count))
        ins = {"allreduce": count, "allgather": count, "reducescatter": count * n, "alltoall": count * n,
               "broadcast": count, "reduce": count}[coll]
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[rank] = self.view(send, ins, code).copy()
        barrier.wait()
        parts = list(slots)
        barrier.wait()
        from gc3.ir.epilogue import avg_divide
        red = {"sum": np.add.reduce, "max": np.maximum.reduce, "avg": lambda a: avg_divide(np.add.reduce(a), n)}
        total = None if op is None else red[OP_NAMES[op]](np.stack(parts))
        out = {"allreduce": lambda: total, "allgather": lambda: np.concatenate(parts),
               "reducescatter": lambda: total[rank * count:(rank + 1) * count],
               "alltoall": lambda: np.concatenate([p[rank * count:(rank + 1) * count] for p in parts]),
               "broadcast": lambda: parts[root], "reduce": lambda: total if rank == root else None}[coll]()
        if out is not None:
            self.view(recv, out.size, code)[:] = out
        return "host"


def run_threads(n, body, multiple=1, host=None):
    from runtime_cuda.torch_dist.process_group import Gc3ProcessGroup
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=60))
    shared = {"slots": [None] * n, "barrier": threading.Barrier(n, timeout=60)}
    results, errors = [None] * n, []

    def rank(r):
        try:
            pg = Gc3ProcessGroup(dist.PrefixStore("pg/", store), r, n, timedelta(seconds=60))
            comm = (host or HostComm)(n, shared, multiple)
            comm.rank = r
            # the CUDA path's checks on these host tensors, then the host communicator
            pg._cuda = lambda tensors, what, copied=(), pg=pg: (
                pg._check_layout(list(tensors) + list(copied), what, copied), comm)[1]
            pg._stream = lambda: 0
            pg._capturing = lambda: False
            pg._splits = StoreExchange(dist.PrefixStore("splits/", store), r, n)
            results[r] = body(pg, r), comm.counts
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)
            shared["barrier"].abort()

    run_thread_ranks(n, rank, 120)
    assert not errors, errors
    return results


def AllgatherOptions():
    from torch._C._distributed_c10d import AllgatherOptions as options
    return options()


def val(r, k):
    return torch.arange(k, dtype=torch.float32) + 100 * r


@needs_torch
@pytest.mark.parametrize("n, multiple", [(2, 1), (3, 1), (2, 4), (3, 4)])
def test_the_cuda_path_glue_is_exact_on_host_memory(n, multiple):
    """multiple=4: counts gc3 cannot lay out are padded (to 256) and still exact."""
    R = range(n)

    def body(pg, r):
        x = val(r, 6)
        pg.allreduce([x], dist.AllreduceOptions())
        assert torch.equal(x, sum(val(q, 6) for q in R))
        x = val(r, 6)
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.AVG
        pg.allreduce([x], o)
        assert torch.allclose(x, sum(val(q, 6) for q in R) / n)
        x = val(r, 6)
        o.reduceOp = dist.ReduceOp.MAX
        pg.allreduce([x], o)
        assert torch.equal(x, val(n - 1, 6))
        outs = [torch.empty(2, 2) for _ in R]
        pg.allgather([outs], [val(r, 4).view(2, 2)], AllgatherOptions())
        assert all(torch.equal(outs[q].flatten(), val(q, 4)) for q in R)
        big = torch.empty(4 * n)
        pg._allgather_base(big, val(r, 4), AllgatherOptions())
        assert torch.equal(big, torch.cat([val(q, 4) for q in R]))
        out = torch.empty(3)
        pg.reduce_scatter([out], [list(val(r, 3 * n).chunk(n))], dist.ReduceScatterOptions())
        assert torch.equal(out, sum(val(q, 3 * n) for q in R)[3 * r:3 * r + 3])
        o = dist.ReduceScatterOptions()
        o.reduceOp = dist.ReduceOp.AVG
        pg._reduce_scatter_base(out, val(r, 3 * n), o)
        assert torch.allclose(out, sum(val(q, 3 * n) for q in R)[3 * r:3 * r + 3] / n)
        out = torch.empty(2 * n)
        pg.alltoall_base(out, val(r, 2 * n), [], [], dist.AllToAllOptions())
        assert torch.equal(out, torch.cat([val(q, 2 * n)[2 * r:2 * r + 2] for q in R]))
        sends = [r + p + 1 for p in R]
        recvs = [q + r + 1 for q in R]
        send = torch.cat([torch.full((k, 2), float(10 * r + p)) for p, k in enumerate(sends)])
        recv = torch.empty(sum(recvs), 2)
        pg.alltoall_base(recv, send, recvs, sends, dist.AllToAllOptions())
        assert torch.equal(recv, torch.cat([torch.full((k, 2), float(10 * q + r)) for q, k in enumerate(recvs)]))
        outs = [torch.empty(2 * n), torch.empty(3 * n)]
        pg.allgather_into_tensor_coalesced(outs, [val(r, 2), val(r, 3)], AllgatherOptions())
        assert torch.equal(outs[1], torch.cat([val(q, 3) for q in R]))
        outs = [torch.empty(2), torch.empty(1)]
        pg.reduce_scatter_tensor_coalesced(outs, [val(r, 2 * n), val(r, n)], dist.ReduceScatterOptions())
        assert torch.equal(outs[0], sum(val(q, 2 * n) for q in R)[2 * r:2 * r + 2])
        assert torch.equal(outs[1], sum(val(q, n) for q in R)[r:r + 1])
        xs = [val(r, 3), val(r, 2)]
        pg.allreduce_coalesced(xs, dist.AllreduceCoalescedOptions())
        assert torch.equal(xs[1], sum(val(q, 2) for q in R))
        x = val(r, 5)
        b = dist.BroadcastOptions()
        b.rootRank = n - 1
        pg.broadcast([x], b)
        assert torch.equal(x, val(n - 1, 5))
        x = val(r, 5)
        b.rootRank = 0
        pg.broadcast([x], b)
        assert torch.equal(x, val(0, 5))
        for root in (0, n - 1):
            x = val(r, 5)
            ro = dist.ReduceOptions()
            ro.rootRank = root
            ro.reduceOp = dist.ReduceOp.MAX
            pg.reduce([x], ro)
            assert torch.equal(x, val(n - 1, 5) if r == root else val(r, 5)), (root, x)
        return "ok"

    results = run_threads(n, body, multiple)
    assert [r for r, _ in results] == ["ok"] * n
    counts = [c for _, c in results[0][1]]
    assert (256 in counts) == (multiple == 4) and all(c % multiple == 0 for c in counts), counts


@needs_torch
def test_avg_is_nccls_avg_and_premul_sum_keeps_a_non_roots_input():
    """AVG reaches gc3 as NCCL's avg op (integers truncate toward zero, as torch's
    NCCL backend gives them); a reduce's PREMUL_SUM scales a copy, so a non-root's
    tensor is left as it was, as with NCCL."""
    n = 3

    def body(pg, r):
        x = torch.tensor([-7, 7, 5, -100, 2 ** 30], dtype=torch.int32) * (r + 1)
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.AVG
        pg.allreduce([x], o)
        # sums -42, 42, 30, -600, 6 * 2**30 (wrapped to -2**31 + 2**31 ... as int32), each / 3 toward zero
        total = (torch.tensor([-7, 7, 5, -100, 2 ** 30], dtype=torch.int64) * 6).to(torch.int32)
        assert torch.equal(x, torch.div(total, 3, rounding_mode="trunc")), x
        b = torch.tensor([True, False])
        with pytest.raises(ValueError, match="AVG on bool"):
            pg.allreduce([b], o)
        ro = dist.ReduceOptions()
        ro.rootRank = 1
        ro.reduceOp = dist._make_nccl_premul_sum(0.5)
        x = val(r, 4)
        pg.reduce([x], ro)
        assert torch.equal(x, sum(val(q, 4) for q in range(n)) * 0.5 if r == 1 else val(r, 4)), (r, x)
        return "ok"

    assert [r for r, _ in run_threads(n, body)] == ["ok"] * n


@needs_torch
def test_list_outputs_and_inputs_may_be_strided_views_as_with_nccl():
    """torch's NCCL backend stages list outputs (all_gather, gather, all_to_all) and list
    inputs (reduce_scatter, scatter, all_to_all) through a flat buffer, so they may be
    views such as the columns of a matrix; single-tensor calls still need contiguous ones."""
    n = 2
    R = range(n)

    def body(pg, r):
        cols = torch.zeros(4, n)
        pg.allgather([[cols[:, q] for q in R]], [val(r, 4)], AllgatherOptions())
        assert torch.equal(cols, torch.stack([val(q, 4) for q in R], dim=1)), cols
        src = torch.stack([val(r, 3 * n)[3 * q:3 * q + 3] for q in R], dim=1)      # column q: block q
        out = torch.empty(3)
        pg.reduce_scatter([out], [[src[:, q] for q in R]], dist.ReduceScatterOptions())
        assert torch.equal(out, sum(val(q, 3 * n) for q in R)[3 * r:3 * r + 3])
        got = torch.zeros(2, n)
        pg.alltoall([got[:, q] for q in R], [val(r, 2 * n)[2 * q:2 * q + 2] for q in R], dist.AllToAllOptions())
        assert torch.equal(got, torch.stack([val(q, 2 * n)[2 * r:2 * r + 2] for q in R], dim=1))
        with pytest.raises(ValueError, match="contiguous"):
            pg.allreduce([torch.zeros(4, 2)[:, 0]], dist.AllreduceOptions())
        return "ok"

    assert [r for r, _ in run_threads(n, body)] == ["ok"] * n


@needs_torch
def test_ops_gc3_cannot_serve_are_named():
    def body(pg, r):
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.BAND
        with pytest.raises(ValueError, match="reduce op .* is not served"):
            pg.allreduce([val(r, 2)], o)
        with pytest.raises(ValueError, match="needs 2 x 4"):
            pg._allgather_base(torch.empty(7), val(r, 4), AllgatherOptions())
        with pytest.raises(ValueError, match="do not cover"):
            pg.alltoall_base(torch.empty(4), val(r, 4), [1, 1], [3, 3], dist.AllToAllOptions())
        return "ok"

    assert [r for r, _ in run_threads(2, body)] == ["ok"] * 2


@needs_torch
def test_the_tp_dp_example_splits_the_model_without_changing_it(tmp_path):
    """examples/train_tp_dp.py on gloo: tensor-parallel over 2 processes prints the
    loss curve of the unsplit model in one process (float32)."""
    def losses(nproc, tp, port):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
               str(port), str(ROOT / "examples" / "train_tp_dp.py"), "--cpu", "--tp", str(tp), "--steps", "4",
               "--dtype", "float32", "--width", "64"]
        out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        line = next(l for l in out.stdout.splitlines() if l.startswith("losses "))
        return [float(v) for v in line.split()[1:]]

    one, split = losses(1, 1, 29611), losses(2, 2, 29613)
    assert len(one) == 4 and one == pytest.approx(split, rel=1e-5), (one, split)


@needs_torch
@pytest.mark.parametrize("n, multiple", [(2, 1), (3, 4)])
def test_list_all_to_all_gather_scatter_and_bool_glue_is_exact(n, multiple):
    """dist.all_to_all (lists, sizes per peer), gather, scatter (through the
    collectives gc3 has) and bool reductions (uint8: sum is or, product is and)."""
    R = range(n)

    def body(pg, r):
        ins = [val(r, p + 1) + 10 * p for p in R]           # rank r sends p + 1 elements to rank p
        outs = [torch.empty(r + 1) for _ in R]              # and gets r + 1 from each
        pg.alltoall(outs, ins, dist.AllToAllOptions())
        for q in R:
            assert torch.equal(outs[q], val(q, r + 1) + 10 * r), (q, outs[q])
        for root in (0, n - 1):
            o = dist.GatherOptions()
            o.rootRank = root
            outs = [torch.empty(2, 2) for _ in R] if r == root else []
            pg.gather([outs] if r == root else [], [val(r, 4).view(2, 2)], o)
            if r == root:
                assert all(torch.equal(outs[q].flatten(), val(q, 4)) for q in R)
            o = dist.ScatterOptions()
            o.rootRank = root
            got = torch.empty(3)
            pg.scatter([got], [[val(root, 3) + p for p in R]] if r == root else [], o)
            assert torch.equal(got, val(root, 3) + r), (root, got)
        flags = torch.tensor([r == 0, True, False, r % 2 == 1])
        x = flags.clone()
        pg.allreduce([x], dist.AllreduceOptions())
        assert x.tolist() == [True, True, False, n > 1]
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.PRODUCT
        x = flags.clone()
        pg.allreduce([x], o)
        assert x.tolist() == [n == 1, True, False, False]
        return "ok"

    class BoolHost(HostComm):
        # numpy's max over uint8 is what a gc3 max does; its "prod" must not be reached for bools
        def submit(self, coll, send, recv, count, code, op, stream, root=0):
            from runtime_cuda.nccl.constants import OP_NAMES
            assert op is None or OP_NAMES[op] in ("sum", "max", "min"), OP_NAMES[op]
            if op is not None and OP_NAMES[op] == "min":
                import numpy as np

                from runtime_cuda.nccl.constants import OP_CODES
                x = self.view(send, count, code)
                x[:] = np.int64(1) - x        # min(a, b) = 1 - max(1 - a, 1 - b) on {0, 1}
                super().submit(coll, send, recv, count, code, OP_CODES["max"], stream, root)
                y = self.view(recv, count, code)
                y[:] = np.int64(1) - y
                return "host"
            return super().submit(coll, send, recv, count, code, op, stream, root)

    assert [r for r, _ in run_threads(n, body, multiple, BoolHost)] == ["ok"] * n


@needs_torch
def test_the_cuda_backend_a_gc3_group_reports():
    """init_process_group(device_id=...) and DeviceMesh ask the group for its CUDA
    backend: they get gc3's stand-in (no splitting, so subgroups come from
    new_group), and the CPU one is still gloo."""
    from runtime_cuda.torch_dist.process_group import Gc3ProcessGroup
    store = dist.HashStore()
    pg = Gc3ProcessGroup(store, 0, 1, timedelta(seconds=10))
    cuda = pg._get_backend(torch.device("cuda", 0))
    assert cuda.name() == "gc3" and not cuda.supports_splitting and not cuda.supports_tensor_alloc("cuda")
    assert cuda.size() == 1 and cuda.rank() == 0
    cuda.eager_connect_single_device(torch.device("cuda", 0))
    assert pg._comm is None
    assert pg._get_backend(torch.device("cpu")).name() == "gloo"


USER_PROGRAM = ROOT / "tests" / "gpu_programs" / "torch_user_programs.py"


def run_user_program(n, tmp_path, env, *flags, timeout=240):
    pre = HOOKED if "--hook" in flags else []
    return spawn_ranks([*pre, str(USER_PROGRAM)], n, tmp_path, env, *flags, timeout=timeout,
                       says="ALL OK rank={rank}")


@needs_torch
@pytest.mark.parametrize("n, hook", [(4, False), (2, True)])
def test_torch_user_programs_on_gloo(n, hook, tmp_path):
    """The user-style program's references (tests/gpu_programs/torch_user_programs.py)
    on the CPU half of a gc3 group; with --hook through backend="nccl" and GC3_TORCH=1."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH="1" if hook else "0")
    outs = run_user_program(n, tmp_path, env, "--device", "cpu", *(["--hook"] if hook else []), timeout=180)
    assert outs[0].count("PASS") >= 15, outs[0]


@pytest.mark.gpu
@needs_torch
@pytest.mark.parametrize("n, hook", [(4, False), (2, True)])
def test_torch_user_programs_on_ranks_sharing_one_gpu(n, hook, tmp_path):
    """The same program on CUDA tensors, n processes on one GPU, NCCL fallback off:
    device_id=, DeviceMesh 1-D and 2-D, subgroups, list and object collectives,
    every reduce op and dtype, odd tensors, side streams, async reuse and futures."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH_FALLBACK="0", NCCL_NVLS_ENABLE="0", GC3_TIMEOUT_S="60",
               GC3_TORCH="1" if hook else "0", GC3_CONFIG=str(tuned_catalog(n, tmp_path, *([2] if n > 2 else []))),
               GC3_CACHE_DIR=str(tmp_path / "cache"))
    outs = run_user_program(n, tmp_path, env, *(["--hook"] if hook else []))
    unsigned = tuple(f"reduce ops {getattr(torch, name)}" for name in ("uint32", "uint64") if hasattr(torch, name))
    for needed in ("reduce ops torch.int8", "list collectives", "object collectives", "device meshes", "subgroups",
                   "odd tensors", "streams and async") + unsigned:
        assert f"PASS {needed} rank=0" in outs[0], f"{needed!r} did not pass on rank 0:\n{outs[0][-3000:]}"
    import ast
    served = ast.literal_eval(outs[0].split("served=")[1].splitlines()[0])
    assert "NCCL" not in served and sum(served.values()) >= 30, f"gc3 served too little: {served}"


@needs_torch
def test_a_one_rank_group_copies_without_the_communicator():
    """A DeviceMesh dimension of size 1 is a one-rank group: no catalog has programs
    for it, and every collective is its input."""
    def body(pg, r):
        x = val(r, 5)
        pg.allreduce([x], dist.AllreduceOptions())
        assert torch.equal(x, val(0, 5))
        out = torch.empty(3)
        pg._allgather_base(out, val(0, 3), AllgatherOptions())
        assert torch.equal(out, val(0, 3))
        outs = [torch.empty(2)]
        pg.alltoall(outs, [val(0, 2)], dist.AllToAllOptions())
        assert torch.equal(outs[0], val(0, 2))
        out = torch.empty(4)
        pg._reduce_scatter_base(out, val(0, 4), dist.ReduceScatterOptions())
        assert torch.equal(out, val(0, 4))
        return "ok"

    (result, counts), = run_threads(1, body)
    assert result == "ok" and counts == [], counts


@needs_torch
def test_the_host_time_benchmark_runs_every_case():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_torch_host.py"), "--calls", "20"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [l.split() for l in out.stdout.splitlines() if l and not l.startswith("#")]
    assert [" ".join(r[:-1]) for r in rows] == ["all_reduce SUM", "all_reduce AVG", "all_gather_into_tensor",
                                                "reduce_scatter_tensor"]
    assert all(float(r[-1]) > 0 for r in rows)
