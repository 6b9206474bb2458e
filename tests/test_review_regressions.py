"""Regressions found by a fresh-eyes review: each test failed before its fix."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gc3 import Check, GC3Program, chunk
from gc3.dsl.collectives import AllGather, AllReduce, Broadcast, Collective, Reduce, input_chunk
from gc3.errors import GC3Error, IRStructureError, LoweringError
from gc3.compiler.pipeline import lower
from gc3.simulator import simulate
from gc3.verify import verify
from gc3.ir.xml_io import read_xml, to_xml

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "ir_samples" / "allgather_ring_4r_Simple.xml"


def _with_gpu0(**fields):
    prog = read_xml(SAMPLE)
    gpus = [dataclasses.replace(g, **fields) if g.id == 0 else g for g in prog.gpus]
    return dataclasses.replace(prog, gpus=gpus)


@pytest.mark.parametrize("field", ["i_chunks", "o_chunks", "s_chunks"])
def test_negative_chunk_counts_are_structure_errors_not_crashes(field):
    prog = _with_gpu0(**{field: -2})
    with pytest.raises(IRStructureError, match=rf"rank 0: {field}=-2"):
        verify(prog)
    # the simulator must fail with a GC3Error (never numpy's ValueError)
    try:
        res = simulate(prog, count=8)
    except GC3Error as exc:
        assert "-2" in str(exc)
    else:
        assert not res.ok


def test_cli_simulate_negative_scratch_is_a_clear_failure(tmp_path):
    path = tmp_path / "neg.xml"
    path.write_text(to_xml(_with_gpu0(s_chunks=-2)))
    for cmd in ("check", "simulate"):
        r = subprocess.run([sys.executable, "-m", "gc3", cmd, str(path), *(["--count", "8"] if cmd == "simulate" else [])],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)   # refused while reading: bad input
        assert "Traceback" not in r.stderr and "s_chunks='-2'" in r.stderr, (cmd, r.stderr)


def _staged_through_one_slot():
    # Rank 1 receives both chunks from rank 0 into ONE reused scratch slot.
    # Chunk 1 is ready at once, chunk 0 only after a reduce, but the slot's
    # reuse makes chunk 1's receive wait for chunk 0's: sending chunk 1 first
    # on the shared connection would be a FIFO deadlock.
    with GC3Program("stage_reuse", AllReduce(3, 2, inplace=True)) as prog:
        for j in (0, 1):
            acc = chunk(0, "in", j)
            if j == 0:
                acc = acc.reduce(chunk(2, "in", j))
            t = acc.copy(1, "tmp", 0)
            acc = chunk(1, "in", j).reduce(t)
            if j == 1:
                acc = chunk(2, "in", j).reduce(acc)
                acc.copy(1, "in", j)
                acc.copy(0, "in", j)
            else:
                acc.copy(0, "in", j)
                acc.copy(2, "in", j)
        Check()
    return prog


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("instances", [1, 2])
def test_reused_staging_slot_on_one_connection_lowers_and_runs(fused, instances):
    ir = lower(_staged_through_one_slot(), instr_fusion=fused, instances=instances)
    verify(ir)
    for count in (6, 7 * 2, 3):
        if count % 1 == 0:
            res = simulate(ir, count=count, dtype="int64", op="max", interleave_seed=count)
            assert res.ok, res.errors[:3]


def _rooted(kind, n, root):
    with GC3Program(f"{kind.__name__}_root", kind(num_ranks=n, chunk_factor=2, inplace=False, root=root)) as prog:
        if kind is Broadcast:
            c = chunk(root, "in", 0, count=2).copy(root, "out", 0)
            for s in range(1, n):
                c = c.copy((root + s) % n, "out", 0)
        else:
            acc = chunk((root + 1) % n, "in", 0, count=2)
            for s in range(2, n + 1):
                acc = chunk((root + s) % n, "in", 0, count=2).reduce(acc)
            acc.copy(root, "out", 0)
        Check()
    return prog


@pytest.mark.parametrize("kind", [Broadcast, Reduce])
def test_simulating_a_dsl_program_checks_against_its_own_root(kind):
    prog = _rooted(kind, 5, 3)
    for count in (10, 7, 1):
        res = simulate(prog, count=count, op="max")
        assert res.ok, res.errors[:2]
    # an explicit root still wins (and is then wrong for this program)
    assert not simulate(prog, count=10, root=0).ok


def test_cli_simulate_dsl_program_uses_its_root(tmp_path):
    src = tmp_path / "bcast3.py"
    src.write_text(
        "from gc3 import Check, GC3Program, chunk\n"
        "from gc3.collectives import Broadcast\n"
        "with GC3Program('b', Broadcast(num_ranks=5, chunk_factor=1, root=3)) as prog:\n"
        "    c = chunk(3, 'in', 0).copy(3, 'out', 0)\n"
        "    for s in range(1, 5):\n"
        "        c = c.copy((3 + s) % 5, 'out', 0)\n"
        "    Check()\n")
    r = subprocess.run([sys.executable, "-m", "gc3", "simulate", str(src), "--count", "7"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result     OK" in r.stdout


class _Reverse(Collective):
    """A custom collective: out[j] = in[C-1-j] on every rank."""
    name = "reverse"

    def postcondition(self, rank, index):
        return input_chunk(rank, self.chunk_factor - 1 - index)


def _reverse_program():
    with GC3Program("rev", _Reverse(2, 2)) as prog:
        for r in range(2):
            chunk(r, "in", 0).copy(r, "out", 1)
            chunk(r, "in", 1).copy(r, "out", 0)
        Check()
    return prog


def _reversed_halves(inputs, op, n):
    return [np.concatenate([x[len(x) // 2:], x[:len(x) // 2]]) for x in inputs]


def test_custom_collective_pairing_other_chunk_positions_is_not_silently_miscompiled():
    prog = _reverse_program()
    for count in (4, 12):
        assert simulate(lower(prog, instances=1), count=count, reference=_reversed_halves).ok
    # Instances cut every block instance-major, which only keeps pairings of
    # the same chunk position: anything else must be refused, not compiled wrong.
    for k in (2, 3):
        try:
            ir = lower(prog, instances=k)
        except LoweringError as exc:
            assert "instances" in str(exc) and "(rank 0, 'o', 0)" in str(exc)
        else:
            res = simulate(ir, count=4 * k, reference=_reversed_halves)
            assert res.ok, res.errors[:1]


class _Diagonal(Collective):
    """A custom collective: out_r[j] = in_j[j] (same positions, but the source rank depends on j)."""
    name = "diagonal"

    def postcondition(self, rank, index):
        return input_chunk(index, index)


def test_custom_collective_whose_source_rank_varies_inside_a_block_is_refused_with_instances():
    n = 2
    with GC3Program("diag", _Diagonal(n, n)) as prog:
        for r in range(n):
            for j in range(n):
                chunk(j, "in", j).copy(r, "out", j)
        Check()

    def ref(inputs, op, nranks):
        u = len(inputs[0]) // n
        return [np.concatenate([inputs[j][j * u:(j + 1) * u] for j in range(n)]) for _ in range(nranks)]

    assert simulate(lower(prog), count=12, reference=ref).ok
    try:
        ir = lower(prog, instances=2)
    except LoweringError as exc:
        assert "instances" in str(exc) and "(rank 0, 'o', 1)" in str(exc)
    else:
        res = simulate(ir, count=12, reference=ref)
        assert res.ok, res.errors[:1]


def test_cli_simulate_out_of_memory_is_a_clear_failure(monkeypatch):
    from click.testing import CliRunner

    from gc3.cli import main
    import gc3.simulator as sim

    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 60.0 GiB")

    monkeypatch.setattr(sim, "simulate", too_big)
    res = CliRunner().invoke(main, ["simulate", str(SAMPLE), "--size", "10GiB"])
    assert res.exit_code == 2 and not isinstance(res.exception, MemoryError), res.output
    assert "FAILED" in res.output and "memory" in res.output and "--size" in res.output


def test_simulate_rejects_a_channel_outside_nchannels_like_check():
    prog = dataclasses.replace(read_xml(SAMPLE), nchannels=0)
    with pytest.raises(IRStructureError, match="chan=0 outside"):
        verify(prog)
    res = simulate(prog, count=8)
    assert not res.ok and any("chan=0" in e and "nchannels=0" in e for e in res.errors), res.errors


def test_fusion_never_turns_a_valid_program_with_channel_hints_into_a_schedule_error():
    # Rank 1 forwards two chunks it receives from rank 0 on channel 0 to two
    # different peers, all on ch=0: fine unfused (one TB per connection), but
    # two fused rcs would need the one receive connection in two TBs.
    with GC3Program("fanout", AllGather(4, 2, inplace=False)) as prog:
        for r in range(4):
            chunk(r, "in", 0, count=2).copy(r, "out", 2 * r)
        chunk(0, "in", 0).copy(1, "out", 0, ch=0).copy(2, "out", 0, ch=0)
        chunk(0, "in", 1).copy(1, "out", 1, ch=0).copy(3, "out", 1, ch=0)
        chunk(0, "in", 1).copy(2, "out", 1)
        chunk(0, "in", 0).copy(3, "out", 0)
        for s in (1, 2, 3):
            for d in range(4):
                if d != s:
                    chunk(s, "in", 0, count=2).copy(d, "out", 2 * s)
        Check()
    for fused in (False, True):
        for k in (1, 2):
            ir = lower(prog, instr_fusion=fused, instances=k)
            verify(ir)
            for count in (8, 13):
                res = simulate(ir, count=count, dtype="int32")
                assert res.ok, res.errors[:2]
