"""LL threadblock merging (gc3.compiler.threadblocks.merge_lone_pairs): a channel's lone send and lone receive
threadblocks become one where one waits on the other; the schedule stays deadlock-free and computes the same."""
from pathlib import Path

import numpy as np
import pytest

from gc3 import GC3Program, chunk
from gc3.dsl.collectives import AllToAll
from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.simulator import simulate
from gc3.verify import verify

ALGORITHMS = Path(__file__).resolve().parents[1] / "gc3" / "algorithms"
TWO_RANK = [("allreduce_oneshot", "allreduce"), ("allreduce_allpairs", "allreduce"),
            ("reducescatter_ring", "reducescatter"), ("reducescatter_direct", "reducescatter"),
            ("alltoall_direct", "alltoall"), ("allgather_direct", "allgather"), ("allreduce_ring", "allreduce")]


def algorithm(name, *args):
    return run_script(str(ALGORITHMS / f"{name}.py"), [str(a) for a in args])


def shape(prog):
    return [[(tb.send, tb.recv, [st.type for st in tb.steps]) for tb in g.threadblocks] for g in prog.gpus]


@pytest.mark.parametrize("instances", [1, 16])
def test_two_rank_oneshot_runs_one_threadblock_per_channel_with_no_cross_threadblock_wait(instances):
    prog = lower(algorithm("allreduce_oneshot", 2), instances=instances, protocol="LL")
    for g in prog.gpus:
        peer = 1 - g.id
        assert [(tb.send, tb.recv, tb.chan) for tb in g.threadblocks] == [(peer, peer, c) for c in range(instances)]
        for tb in g.threadblocks:
            assert [(st.type, st.depid) for st in tb.steps] == [("s", -1), ("rrc", -1)]
    apart = lower(algorithm("allreduce_oneshot", 2), instances=instances, protocol="LL", tb_merge=False)
    assert all(len(g.threadblocks) == 2 * instances for g in apart.gpus)
    # the receive-reduce overwrites what the send reads: apart, it waits on the send's threadblock
    assert any(st.depid >= 0 for g in apart.gpus for tb in g.threadblocks for st in tb.steps)


def test_only_ll_merges_by_default():
    traced = algorithm("allreduce_oneshot", 2)
    simple = lower(traced, instances=4, protocol="Simple")
    assert all(len(g.threadblocks) == 8 for g in simple.gpus)
    assert shape(lower(traced, instances=4, protocol="Simple", tb_merge=True)) == \
        shape(lower(traced, instances=4, protocol="LL"))


@pytest.mark.parametrize("name", ["alltoall_direct", "reducescatter_ring", "allgather_direct"])
def test_send_and_receive_threadblocks_that_do_not_wait_on_each_other_stay_apart(name):
    """They overlap their send with their receive; merged they would run one after the other."""
    merged = lower(algorithm(name, 2), instances=4, protocol="LL")
    assert shape(merged) == shape(lower(algorithm(name, 2), instances=4, protocol="LL", tb_merge=False))
    assert all(tb.send < 0 or tb.recv < 0 for g in merged.gpus for tb in g.threadblocks)


def test_channels_with_several_send_or_receive_threadblocks_are_left_alone():
    """Four ranks, direct AllToAll: each channel has three send and three receive threadblocks per rank;
    which send would pair with which receive is arbitrary, so nothing is merged."""
    prog = lower(algorithm("alltoall_direct", 4), protocol="LL")
    assert prog.gpus[0].threadblocks
    assert all(tb.send < 0 or tb.recv < 0 for g in prog.gpus for tb in g.threadblocks)
    assert shape(prog) == shape(lower(algorithm("alltoall_direct", 4), protocol="LL", tb_merge=False))


def test_threadblocks_placed_by_hand_are_not_merged():
    with GC3Program("manual", AllToAll(num_ranks=2, chunk_factor=1, inplace=False)) as prog:
        for r in range(2):
            chunk(r, "in", r).copy(r, "out", r)
            chunk(r, "in", 1 - r).copy(1 - r, "out", r, sendtb=0, recvtb=1)
    lowered = lower(prog, protocol="LL")
    for g in lowered.gpus:
        assert sorted((tb.send, tb.recv) for tb in g.threadblocks if tb.send >= 0 or tb.recv >= 0) == \
            [(-1, 1 - g.id), (1 - g.id, -1)]


@pytest.mark.parametrize("name,coll", TWO_RANK)
@pytest.mark.parametrize("instances", [1, 4])
def test_merged_two_rank_programs_verify_and_compute_what_numpy_computes(name, coll, instances):
    prog = lower(algorithm(name, 2), instances=instances, protocol="LL")
    verify(prog)   # structure, limits, FIFO order, deadlock
    for dtype, op in (("float32", "sum"), ("int32", "max"), ("float16", "prod")):
        for count in (prog.ngpus, 1000, 4099 * 8 + 2):   # uneven: chunks of different lengths
            res = simulate(prog, count=count, dtype=dtype, op=op)
            assert res.ok, (name, instances, dtype, op, count, res)
