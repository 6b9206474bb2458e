"""The fused pipeline's data layout on the CPU (runtime_cuda/torch_dist/overlap.py):
every operator, at several chunk counts and odd sizes, with G ranks as threads whose
collectives meet in a stand-in process group, against the product computed whole.

What runs for real: the chunk bounds, the column and row slicing, the scratch buffers
and their reuse, the collectives' arguments (counts, in/out buffers), the copy-out
of all-reduce and all-gather, and the final concatenation.  What is stood in for:
CUDA streams and events (ordering is the GPU tests' job), and the communicator."""
import threading
import types

import pytest

torch = pytest.importorskip("torch")

from runtime_cuda.torch_dist import overlap  # noqa: E402
from thread_ranks import run_ranks


class _Stream:
    def __init__(self, device=None, priority=0):
        self.cuda_stream = id(self)

    priority_range = staticmethod(lambda: (0, -1))

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass


class _Event:
    def __init__(self, enable_timing=False):
        pass

    def record(self, stream=None):
        pass


class _World:
    """The ranks' collectives, met call by call: each deposits its input, all wait, each
    reads what its output needs, all wait again."""

    def __init__(self, n):
        self.n, self.barrier, self.slots = n, threading.Barrier(n, timeout=60), [None] * n
        self.calls = []

    def run(self, rank, coll, send, recv, count, op):
        self.slots[rank] = send.reshape(-1).clone()
        self.barrier.wait()
        ins, out = self.slots, recv.view(-1)
        if rank == 0:
            self.calls.append((coll, count))
        if coll == "allreduce":
            out.copy_(sum(x[:count] for x in ins))
        elif coll == "reducescatter":
            out.copy_(sum(x[rank * count:(rank + 1) * count] for x in ins))
        elif coll == "allgather":
            out.copy_(torch.cat([x[:count] for x in ins]))
        elif coll == "alltoall":
            out.copy_(torch.cat([x[rank * count:(rank + 1) * count] for x in ins]))
        else:
            raise AssertionError(coll)
        self.barrier.wait()


class _Group:
    def __init__(self, world, rank):
        self.world, self.rank = world, rank
        self._device = types.SimpleNamespace(index=0)    # what the pipeline reads of the group's GPU

    def size(self):
        return self.world.n

    def _cuda(self, tensors, what):
        assert all(t.is_contiguous() for t in tensors), what
        return "comm"

    def _submit(self, comm, coll, send, recv, count, op):
        assert comm == "comm" and (op == "sum") == (coll in ("allreduce", "reducescatter"))
        self.world.run(self.rank, coll, send, recv, count, op)


@pytest.fixture
def cpu_cuda(monkeypatch):
    local = threading.local()

    def current_stream(device=None):
        if not hasattr(local, "stream"):
            local.stream = _Stream()
        return local.stream

    cuda = types.SimpleNamespace(Stream=_Stream, Event=_Event, current_stream=current_stream,
                                 set_stream=lambda s: None)
    monkeypatch.setattr(overlap, "torch", types.SimpleNamespace(mm=torch.mm, cat=torch.cat, cuda=cuda))
    monkeypatch.setattr(overlap, "_tracing", lambda: False)
    monkeypatch.setattr(overlap, "_LANES", {})


def _ranks(n, body):
    world = _World(n)
    results, errors = [None] * n, []

    def run(r):
        try:
            results[r] = body(_Group(world, r), r)
        except BaseException as exc:   # reported below with its rank
            errors.append((r, exc))
            world.barrier.abort()

    run_ranks(n, run, 120)
    assert not errors, errors
    return results, world


def _x(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("chunks", [1, 2, 3, 5])
def test_every_operator_lays_its_chunks_out_as_the_whole_product(cpu_cuda, n, chunks):
    M, K, N = 8 * 41, 24, 3 * 64 + 40      # bounds on and off the 64-wide alignment
    A = [_x(10 + r, M, K) for r in range(n)]
    B = [_x(20 + r, K, N) for r in range(n)]
    total = sum(a @ b for a, b in zip(A, B))
    m = M // n

    def body(pg, r):
        out = {}
        for _ in range(2):    # twice: the second call reuses the group's scratch buffers
            out["rs"] = overlap.matmul_reduce_scatter(pg, A[r], B[r], chunks, "rs").clone()
            out["ar"] = overlap.matmul_all_reduce(pg, A[r], B[r], chunks, "ar").clone()
            out["a2a"] = overlap.matmul_all_to_all(pg, A[r], B[0], chunks, "a2a").clone()
            g, (o,) = overlap.all_gather_matmul(pg, A[r][:m], [B[r]], chunks, True, "ag")
            out["ag"], out["ag_A"] = o.clone(), g.clone()
        return out

    results, world = _ranks(n, body)
    gathered = torch.cat([a[:m] for a in A])
    for r, got in enumerate(results):
        torch.testing.assert_close(got["rs"], total[r * m:(r + 1) * m])
        torch.testing.assert_close(got["ar"], total)
        torch.testing.assert_close(got["a2a"], torch.cat([A[q][r * m:(r + 1) * m] @ B[0] for q in range(n)]))
        torch.testing.assert_close(got["ag"], gathered @ B[r])
        assert torch.equal(got["ag_A"], gathered)
    expected = len(overlap.bounds(N, chunks)) - 1
    assert sum(1 for c, _ in world.calls if c == "reducescatter") == 2 * expected
    assert len(overlap._LANES) == 1


def test_scratch_is_kept_per_shape_and_bounded(cpu_cuda):
    def body(pg, r):
        A, B = _x(1 + r, 64, 8), _x(5, 8, 64)
        overlap.matmul_all_reduce(pg, A, B, 2, "ar")
        overlap.matmul_all_reduce(pg, A, B, 2, "ar")
        kept = len(pg._overlap_scratch)
        for rows in range(1, overlap.SCRATCH_SHAPES + 4):
            overlap.matmul_all_reduce(pg, _x(rows, 64 * rows, 8), B, 2, "ar")
        return kept, len(pg._overlap_scratch)

    (first, last), _ = _ranks(2, body)[0]
    assert first == 1 and last == overlap.SCRATCH_SHAPES
