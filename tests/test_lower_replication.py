"""Replication (pass 3): instances and parallelize under the layout's block rule."""
import itertools

import numpy as np

from gc3 import Check, GC3Program, chunk, parallelize
from gc3.dsl.collectives import AllReduce, AllToAll, Collective, input_chunk
from gc3.errors import LoweringError
from gc3.ir.layout import layout_for
from gc3.compiler.pipeline import lower
from gc3.compiler.buffers import plan_buffers
from gc3.simulator import simulate

from lower_programs import allpairs_allreduce, hierarchical_allreduce, ring_allgather, two_step_alltoall


def test_index_map_is_a_bijection_that_keeps_every_chunk_in_its_block():
    traced = two_step_alltoall(2, 2)                 # 4 blocks of 1 chunk, plus scratch
    with GC3Program("par", AllToAll(2, 3, inplace=False)) as p:
        with parallelize(2):
            chunk(0, "in", 3, count=1).copy(1, "out", 0)
        with parallelize(3):
            chunk(1, "in", 0, count=1).copy(0, "out", 3)
    for program, k in ((traced, 3), (p, 2)):
        plan = plan_buffers(program.chunk_dag, k)
        P = plan.parallel
        for (rank, buf), c in plan.block.items():
            size = plan.declared[(rank, buf)]
            if not size:
                continue
            blocks = size // c
            seen = [plan.index(rank, buf, b * c + j, i, u)
                    for b, j, i, u in itertools.product(range(blocks), range(c), range(k), range(P))]
            assert sorted(seen) == list(range(size * k * P)), (rank, buf)
            for b, j, i, u in itertools.product(range(blocks), range(c), range(k), range(P)):
                assert plan.index(rank, buf, b * c + j, i, u) // (c * k * P) == b


def test_parallel_factors_cut_every_chunk_and_copies_get_their_own_channels():
    with GC3Program("par", AllToAll(2, 3, inplace=False)) as p:
        with parallelize(2):
            chunk(0, "in", 3, count=1).copy(1, "out", 0)
        with parallelize(3):
            chunk(1, "in", 0, count=1).copy(0, "out", 3)
    plan = plan_buffers(p.chunk_dag, 2)
    assert (plan.parallel, plan.copies, plan.factor) == (6, 3, 12)
    prog = lower(p, instances=2)
    assert prog.gpu(0).i_chunks == 6 * 12
    sends = sorted((tb.chan, st.srcoff, st.cnt) for tb in prog.gpu(0).threadblocks for st in tb.steps if st.type == "s")
    # rank 0's i[3] (block 1, chunk 0): instance i, copy q -> 36 + 18i + 3q, 3 sub-chunks, channel 3i + q
    assert sends == [(0, 36, 3), (1, 39, 3), (3, 54, 3), (4, 57, 3)]


def test_multi_chunk_steps_stay_whole_inside_a_block_and_split_across_blocks():
    ag = ring_allgather(3, chunk_factor=2)           # copies of 2 chunks inside one block
    for k in (1, 2):
        prog = lower(ag, instances=k)
        assert {st.cnt for g in prog.gpus for tb in g.threadblocks for st in tb.steps} == {2}
    a2a = two_step_alltoall(2, 2)                    # gathers 2 chunks that belong to 2 output blocks
    one = lower(a2a, instances=1)
    assert max(st.cnt for g in one.gpus for tb in g.threadblocks for st in tb.steps) == 2
    two = lower(a2a, instances=2)
    assert max(st.cnt for g in two.gpus for tb in g.threadblocks for st in tb.steps) == 1
    for count in (4 * 3, 4 * 50):
        assert simulate(two, count=count).ok


def test_each_instance_has_its_own_scratch():
    prog = lower(allpairs_allreduce(3), instances=2)
    for g in prog.gpus:
        per_instance = g.s_chunks // 2
        for tb in g.threadblocks:
            used = {st.srcoff for st in tb.steps if st.srcbuf == "s" and st.type != "nop"}
            used |= {st.dstoff for st in tb.steps if st.dstbuf == "s" and st.type != "nop"}
            assert used <= set(range(tb.chan * per_instance, (tb.chan + 1) * per_instance)), (g.id, tb.id)


def test_instances_never_share_a_channel_or_a_chunk():
    prog = lower(hierarchical_allreduce(2, 2), instances=2)
    plan = plan_buffers(hierarchical_allreduce(2, 2).chunk_dag, 2)
    per_instance = prog.nchannels // 2
    for g in prog.gpus:
        owner = {}
        for tb in g.threadblocks:
            inst = tb.chan // per_instance
            for st in tb.steps:
                if st.type == "nop":
                    continue
                for buf, off in ((st.srcbuf, st.srcoff), (st.dstbuf, st.dstoff)):
                    c = plan.shift(g.id, buf)            # chunks of one instance in a block
                    for idx in range(off, off + st.cnt):
                        assert owner.setdefault((buf, idx // c % 2), inst) == inst


def test_parallel_and_plain_ops_touching_one_chunk_agree_on_data():
    # A chunk sent in two parallel halves, then forwarded whole: the plain op
    # must wait for both halves (edges between copies whose sub-chunks overlap).
    with GC3Program("mixed", AllReduce(3, 2, inplace=False)) as p:
        for j in range(2):
            with parallelize(2):
                a = chunk(0, "in", j).copy(1, "scratch", j)
            a.reduce(chunk(1, "in", j))
            with parallelize(2):
                a = a.copy(2, "scratch", j)
            a.reduce(chunk(2, "in", j))
            for r in range(3):
                a.copy(r, "out", j)
            chunk(2, "scratch", j).copy(0, "scratch", j)       # keep the other direction busy
            # ranks 0 and 1 add nothing more: everyone ends with in0+in1+in2
    for k in (1, 2):
        prog = lower(p, instances=k)
        for count in (2, 38, 400):
            res = simulate(prog, count=count)
            assert res.ok, res.errors[:2]
        assert layout_for(prog, 400).chunks_per_block == 2 * 2 * k


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
