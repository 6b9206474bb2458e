"""The GEMM fusions' executor against the compiled programs (runtime_cuda/fused/schedule.py):
which GEMM chunk feeds which transfer, and in which order per threadblock, read from the IR of
gc3/algorithms/fused/*; the executor runs only a schedule its program states, and what it issues
follows gemm.chunk_schedule."""
import numpy as np
import pytest

from gc3.errors import GC3Error
from gc3.ir.xml_io import from_xml, to_xml
from runtime_cuda.fused import gemm, schedule
from runtime_cuda.fused.schedule import PROGRAMS, check_executor, compiled, ir_chunks

from test_fused_gemm import cp, group, matrices  # noqa: F401  (cp: the numpy stand-in for CuPy)


@pytest.mark.parametrize("op", list(PROGRAMS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_the_executor_schedule_is_the_programs(op, n):
    check_executor(op, n)
    chains = ir_chunks(compiled(op, n))
    for r in range(n):   # every rank block once, its own chunk the only one that stays
        got = sorted(c for chain in chains[r] for c in chain)
        assert got == [(b, None if b == r else b) for b in range(n)], (r, chains[r])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_all_gather_gemm_return_a_variant_states_the_same_schedule(n):
    """The return_a program (blocks arrive into the gathered A, the GEMMs read them there) has the
    executor's chunks, as the plain one does; and only it serves a call that returns A."""
    op = "all_gather_gemm"
    prog = compiled(op, n, True)
    assert prog.compute.return_a and not compiled(op, n).compute.return_a
    check_executor(op, n, return_a=True)
    assert ir_chunks(prog) == ir_chunks(compiled(op, n))
    with pytest.raises(GC3Error, match="states no gathered-A output"):
        check_executor(op, n, compiled(op, n), return_a=True)
    with pytest.raises(GC3Error, match="gemm_reduce_scatter gathers no A"):
        compiled("gemm_reduce_scatter", n, True)


def test_a_fused_call_that_returns_a_requires_the_return_a_schedule(cp, monkeypatch):  # noqa: F811
    rng = np.random.default_rng(5)
    A, _ = matrices(cp, rng, [(4, 4)] * 2, "float32")
    B, _ = matrices(cp, rng, [(4, 3)] * 2, "float32")
    asked = []
    monkeypatch.setattr(schedule, "require", lambda op, n, return_a=False: asked.append((op, n, return_a)))
    g = group(2)
    gemm.all_gather_gemm(A, B, g, fused=True)
    gemm.all_gather_gemm(A, B, g, return_a=True, fused=True)
    gemm.all_gather_gemm(A, B, g, return_a=True, fused=False)
    assert asked == [("all_gather_gemm", 2, False), ("all_gather_gemm", 2, True)]


def _swap_rows(prog, rank, kind):
    """The IR with the row ranges of two of `rank`'s GEMM steps on different threadblocks exchanged."""
    g = prog.gpus[rank]
    firsts = [next(st for st in tb.steps if st.type == kind) for tb in g.threadblocks
              if any(st.type == kind for st in tb.steps)]
    a, b = firsts[0].compute, firsts[1].compute
    text = to_xml(prog)
    gpu_at = text.index(f'<gpu id="{rank}"')
    head, body = text[:gpu_at], text[gpu_at:]
    ka, kb = f'col0="{a.col0}" col1="{a.col1}"', f'col0="{b.col0}" col1="{b.col1}"'
    assert ka in body and kb in body
    body = body.replace(ka, "@A@", 1).replace(kb, ka, 1).replace("@A@", kb, 1)
    return from_xml(head + body)


@pytest.mark.parametrize("op", list(PROGRAMS))
def test_a_program_with_two_chunks_swapped_is_refused(op):
    kind = "agemm" if op == "all_gather_gemm" else "gemm"
    bad = _swap_rows(compiled(op, 4), 1, kind)
    with pytest.raises(GC3Error, match=r"rank 1: the executor's GEMM chunks \(row block, peer\)"):
        check_executor(op, 4, bad)


def test_an_executor_order_the_program_does_not_allow_is_refused(monkeypatch):
    """Rank 1's threadblock sending to rank 0 computes block 0, then its own block 1 (the IR's
    chain); an executor issuing its own block first breaks it."""
    real = gemm.chunk_schedule

    def own_first(op, r, n):
        s = real(op, r, n)
        return s[-1:] + s[:-1]
    monkeypatch.setattr(schedule, "chunk_schedule", own_first)
    with pytest.raises(GC3Error, match="orders its GEMM chunks"):
        check_executor("gemm_reduce_scatter", 4)


def test_the_executor_issues_what_chunk_schedule_says(cp, monkeypatch):  # noqa: F811
    """A different (still valid) chunk order changes the order of the GEMMs and transfers
    the executor issues, and the refusal reaches a fused call."""
    rng = np.random.default_rng(3)
    A, _ = matrices(cp, rng, [(8, 4)] * 4, "float32")
    B, _ = matrices(cp, rng, [(4, 4)] * 4, "float32")

    def chunks_of(g):
        return [s.chunk for s in g.trace.stamps() if s.rank == 0 and s.what == "gemm end"]
    g = group(4, trace=True)
    gemm.gemm_reduce_scatter(A, B, g, fused=True)
    assert chunks_of(g) == [f"partial chunk {d}" for d in (1, 2, 3, 0)]
    real = gemm.chunk_schedule
    monkeypatch.setattr(gemm, "chunk_schedule", lambda op, r, n: list(reversed(real(op, r, n)[:-1])) + real(op, r, n)[-1:])
    gemm.gemm_reduce_scatter(A, B, g, fused=True)
    assert chunks_of(g) == [f"partial chunk {d}" for d in (3, 2, 1, 0)]
    monkeypatch.setattr(gemm, "chunk_schedule", lambda op, r, n: real(op, r, n)[-1:] + real(op, r, n)[:-1])
    monkeypatch.setattr(schedule, "chunk_schedule", gemm.chunk_schedule)
    schedule.require.cache_clear()
    try:
        with pytest.raises(GC3Error, match="orders its GEMM chunks"):
            gemm.gemm_reduce_scatter(A, B, g, fused=True)
    finally:
        schedule.require.cache_clear()
