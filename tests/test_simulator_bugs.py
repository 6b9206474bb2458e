"""Planted bugs are caught: wrong offsets (data), missing dependencies (races),
cyclic waits and too-small FIFOs (deadlocks), mismatched sends/receives."""
from pathlib import Path

import pytest

from gc3.simulator import simulate
from gc3.ir.xml_io import read_xml

from sim_programs import allpairs_allreduce, edited

DATA = Path(__file__).parent / "data" / "msccl"
RING = read_xml(DATA / "allreduce_ring_4r_1i.xml")
PAIRS = read_xml(DATA / "allreduce_allpairs_2r_1i.xml")
A2A = read_xml(DATA / "alltoall_two_step_2n_4g.xml")


@pytest.mark.parametrize("prog,where,fields,count", [
    (RING, (1, 0, 0), dict(srcoff=2, dstoff=2), 8),           # ring sends the wrong chunk first
    (PAIRS, (0, 1, 2), dict(srcoff=0), 8),                    # re adds the wrong scratch chunk
    (A2A, (0, 4, 0), dict(srcoff=6), 16),                     # alltoall forwards the wrong block
    (allpairs_allreduce(4, 2, 2), (2, 1, 0), dict(srcoff=3, dstoff=3), 64),
], ids=["ring-s", "pairs-re", "alltoall-s", "generated-s"])
def test_wrong_srcoff_is_a_data_mismatch(prog, where, fields, count):
    assert simulate(prog, count=count).ok
    res = simulate(edited(prog, *where, **fields), count=count)
    assert not res.ok and res.wrong > 0 and not res.deadlock
    fw = res.first_wrong
    assert fw.expected != fw.got
    assert res.errors[0].startswith(f"{res.wrong} output element(s) differ")
    assert f"first at rank {fw.rank} index {fw.index}" in res.errors[0]


def test_missing_dependency_is_a_race_naming_both_steps():
    # tb 1 step 3 sends i[0:2] after tb 0 step 0 has reduced into i[0]; drop that dependency.
    res = simulate(edited(PAIRS, 0, 1, 3, depid=-1, deps=-1), count=8)
    assert not res.ok
    races = [str(r) for r in res.races]
    assert any("rank 0 buffer 'i' chunk 0" in r and "rank 0 tb 0 step 0 (re)" in r and "rank 0 tb 1 step 3 (s)" in r
               for r in races), races
    assert len(res.races) == 1


def test_missing_dependency_race_is_found_whatever_the_interleaving():
    # The reducer's first re waits for the receive into scratch; without it
    # the re reads scratch that a receive writes concurrently.
    prog = allpairs_allreduce(3, 1, 2)
    bug = edited(prog, 1, 2, 0, depid=-1, deps=-1)
    for seed in (None, 1, 2, 3):
        res = simulate(bug, count=30, interleave_seed=seed)
        assert any("rank 1 tb 2 step 0 (re)" in str(r) and "rank 1 tb 0 step 2 (r)" in str(r) for r in res.races), \
            res.summary()


def test_cyclic_wait_is_a_deadlock_reporting_every_blocked_tb():
    # tb 0 step 0 waits for tb 1 step 1; make tb 1 step 1 wait for tb 0 step 0.
    res = simulate(edited(PAIRS, 0, 1, 1, depid=0, deps=0), count=8)
    assert not res.ok and res.predicted_time is None
    lines = res.deadlock
    assert "rank 0 tb 0 step 0 (re): waits for rank 0 tb 1 step 1 to complete" in lines[0]
    assert any(l.startswith("rank 0 tb 1 step 1 (r): waits for rank 0 tb 0 step 0 to complete") for l in lines)
    # Rank 1 is stuck too, behind it, and says on what.
    assert lines[2].startswith("rank 1 tb 1 step 4 (r): waits for a message from rank 0 on channel 0 (FIFO empty; "
                               "1 received so far; sender tb 1 blocked at rank 0 tb 1 step 1 (r))"), lines
    assert len(lines) == 3
    assert any(e.startswith("deadlock: no threadblock can progress; 3 blocked") for e in res.errors)


@pytest.mark.parametrize("per_peer", [2, 4])
def test_fifo_too_small_for_the_schedule_deadlocks(per_peer):
    # Every peer threadblock sends `per_peer` messages before receiving any.
    prog = allpairs_allreduce(4, 1, per_peer)
    assert simulate(prog, count=64, slots=per_peer).ok
    res = simulate(prog, count=64, slots=per_peer - 1)
    assert not res.ok and res.deadlock
    assert all(f"waits for a free slot in the FIFO to rank" in l and f"all {per_peer - 1} slot(s) full" in l
               for l in res.deadlock if "(s)" in l.split(":")[0])
    assert sum("free slot" in l for l in res.deadlock) == 4 * 3


def test_ring_needs_two_slots_because_rrs_waits_for_data_and_space():
    # Like the verifier (and MSCCL's primitives), a fused receive-and-send
    # starts only with a tile to receive *and* a free slot to send into: with
    # one slot every rank holds its first send and waits for space.
    assert simulate(RING, count=16, slots=2).ok
    res = simulate(RING, count=16, slots=1)
    assert len(res.deadlock) == 4
    assert res.deadlock[0] == ("rank 0 tb 0 step 1 (rrs): waits for a free slot in the FIFO to rank 1 on channel 0 "
                               "(all 1 slot(s) full; receiver blocked at rank 1 tb 0 step 1 (rrs))")


def test_receive_without_any_sender_names_the_missing_connection():
    prog = read_xml(DATA / "allreduce_ring_4r_1i.xml")
    prog.gpu(2).threadblocks[0].send = -1   # rank 2 no longer sends to rank 3 ...
    for st in prog.gpu(2).threadblocks[0].steps:
        st.type = {"s": "nop", "rrs": "rrc", "rrcs": "rrc", "rcs": "r"}.get(st.type, st.type)
        if st.type == "nop":
            st.cnt = 0
    res = simulate(prog, count=8)
    assert any("rank 3 tb 0 step 1 (rrs): waits for a message from rank 2 on channel 0, but no threadblock of "
               "rank 2 sends to rank 3 on channel 0" in l for l in res.deadlock), res.deadlock


def test_message_never_received_and_cnt_mismatch_are_errors():
    prog = read_xml(DATA / "allreduce_ring_4r_1i.xml")
    for g in prog.gpus:                     # drop every rank's last receive
        g.threadblocks[0].steps.pop()
    res = simulate(prog, count=8)
    assert not res.ok and not res.deadlock
    assert sum("were never received" in e for e in res.errors) == 4
    res = simulate(edited(PAIRS, 1, 1, 0, cnt=1), count=8)
    assert any("rank 0 tb 1 step 1 (r) receives cnt=2 but the matched send rank 1 tb 1 step 0 (s) sent cnt=1" in e
               for e in res.errors), res.errors


def test_two_threadblocks_on_one_connection_is_rejected():
    prog = read_xml(DATA / "alltoall_two_step_2n_4g.xml")
    prog.gpu(0).threadblocks[1].recv = 1    # tb 0 already receives from rank 1 on channel 0
    res = simulate(prog, count=8)
    assert "rank 0: tb 0 and tb 1 both recv from rank 1 on channel 0" in res.errors


def test_8_rank_allpairs_two_instances_1mib():
    # The slow case that was reported; its time is measured by scripts/bench_simulate.py, not asserted here.
    prog = allpairs_allreduce(8, 2, 4)
    res = simulate(prog, size="1MiB")
    assert res.ok and sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks) == 2240


@pytest.mark.parametrize("prog", [allpairs_allreduce(4, 1, 3), RING, A2A], ids=lambda p: p.name)
def test_simulated_deadlocks_agree_with_the_verifier(prog):
    from gc3.errors import DeadlockError
    from gc3.verify import verify
    for slots in range(1, 5):
        try:
            verify(prog, slots=slots)
            verifier_deadlocks = False
        except DeadlockError:
            verifier_deadlocks = True
        res = simulate(prog, count=48, slots=slots)
        assert bool(res.deadlock) == verifier_deadlocks, (slots, res.deadlock)
        assert res.ok != verifier_deadlocks
