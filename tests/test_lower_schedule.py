"""Channels, threadblocks and synchronization (passes 4-6)."""
import pytest

from gc3 import GC3Program, chunk
from gc3 import Check
from gc3.dsl.collectives import AllGather, AllReduce
from gc3.errors import ScheduleError
from gc3.compiler.pipeline import lower
from gc3.simulator import simulate
from gc3.verify import verify as full_verify


from lower_programs import allpairs_allreduce, exchange, hierarchical_allreduce, ring_allreduce, two_step_alltoall


def verify(prog, **options):
    """These schedules test the other passes and compute nothing in particular."""
    return full_verify(prog, semantics=False, **options)

HERE = __file__


def tbs(prog, rank):
    return prog.gpu(rank).threadblocks


def peers(prog, rank):
    return sorted((tb.send, tb.recv, tb.chan) for tb in tbs(prog, rank))


def test_one_threadblock_per_send_recv_channel_tuple():
    fused = lower(ring_allreduce(4))
    unfused = lower(ring_allreduce(4), instr_fusion=False)
    for r in range(4):
        nxt, prv = (r + 1) % 4, (r - 1) % 4
        assert peers(fused, r) == [(nxt, prv, 0)]             # rcs/rrs need both peers in one TB
        assert peers(unfused, r) == [(-1, prv, 0), (nxt, -1, 0)]


def test_instances_get_their_own_channels_and_chunks():
    prog = lower(ring_allreduce(4), instances=3)
    assert prog.nchannels == 3
    for g in prog.gpus:
        assert sorted(tb.chan for tb in g.threadblocks) == [0, 1, 2]
        for tb in g.threadblocks:
            # instance i owns chunks [4i, 4i+4) of the 12-chunk buffer
            offsets = {st.srcoff for st in tb.steps} | {st.dstoff for st in tb.steps}
            assert offsets <= set(range(4 * tb.chan, 4 * tb.chan + 4)), (g.id, tb.chan, offsets)


def test_user_channel_is_honoured():
    prog = lower(ring_allreduce(3), instances=1)
    assert {tb.chan for g in prog.gpus for tb in g.threadblocks} == {0}
    with GC3Program("ch", AllGather(3, 1, inplace=False)) as p:
        for r in range(3):
            c = chunk(r, "in", 0).copy(r, "out", r)
            c.copy((r + 1) % 3, "out", r, ch=2).copy((r + 2) % 3, "out", r, ch=2)
    prog = lower(p)
    assert prog.nchannels == 3
    assert {tb.chan for g in prog.gpus for tb in g.threadblocks if tb.send >= 0 or tb.recv >= 0} == {2}
    assert simulate(prog, count=30).ok


def _two_forwarding_chains(**hints):
    # Rank 1 forwards rank 0's chunk to rank 2, and rank 3's chunk to rank 2 too:
    # one TB cannot receive from both 0 and 3 while sending to 2, so the two
    # chains need two channels.
    with GC3Program("fork", AllGather(4, 1, inplace=False)) as p:
        chunk(0, "in", 0).copy(1, "scratch", 0, **hints).copy(2, "out", 0, **hints)
        chunk(3, "in", 0).copy(1, "scratch", 1, **hints).copy(2, "out", 3, **hints)
    return p


def test_incompatible_forwarding_chains_go_to_the_lowest_free_channels():
    prog = lower(_two_forwarding_chains())
    assert peers(prog, 1) == [(2, 0, 0), (2, 3, 1)]
    assert prog.nchannels == 2
    verify(prog)


def test_pinning_incompatible_chains_on_one_channel_compiles_them_unfused():
    # Fused, the two chains cannot share channel 0; fusion is only an
    # optimization, so the program is lowered without it rather than refused.
    prog = lower(_two_forwarding_chains(ch=0))
    verify(prog)
    assert prog.nchannels == 1
    assert sorted(st.type for tb in tbs(prog, 1) for st in tb.steps) == ["r", "r", "s", "s"]
    with pytest.raises(ScheduleError) as err:
        lower(_two_forwarding_chains(ch=0, sendtb=0, recvtb=0))   # TB 0 of rank 1 would receive from 0 and 3
    assert "test_lower_schedule.py:" in str(err.value)


def test_manual_threadblocks_are_honoured_per_instance():
    prog = lower(allpairs_allreduce(3), instances=2)
    for r in range(3):
        got = {(tb.id, tb.send, tb.recv, tb.chan) for tb in tbs(prog, r)}
        # user TB t becomes TBs 2t (instance 0, channel 0) and 2t+1 (instance 1, channel 1)
        want = {(2 * t + i, t if t != r else -1, t if t != r else -1, i) for t in range(3) for i in range(2)}
        assert got == want, r


def test_illegal_manual_assignment_names_the_op_and_the_conflict():
    with GC3Program("two_peers", AllGather(3, 1, inplace=False)) as p:
        chunk(0, "in", 0).copy(1, "out", 0, sendtb=0)
        chunk(0, "in", 0).copy(2, "out", 0, sendtb=0)   # TB 0 already sends to rank 1
    with pytest.raises(ScheduleError) as err:
        lower(p)
    msg = str(err.value)
    assert f"{HERE}:" in msg and "sendtb=0" in msg and "already sends to rank 1" in msg

    with GC3Program("split_conn", AllGather(2, 2, inplace=False)) as p:
        chunk(0, "in", 0).copy(1, "out", 0, sendtb=0)
        chunk(0, "in", 1).copy(1, "out", 1, sendtb=1)   # same connection, other TB
    with pytest.raises(ScheduleError) as err:
        lower(p)
    assert "send connection to rank 1 on channel 0 already belongs to threadblock 0" in str(err.value)

    with GC3Program("recv_two", AllGather(3, 1, inplace=False)) as p:
        chunk(0, "in", 0).copy(2, "out", 0, recvtb=4)
        chunk(1, "in", 0).copy(2, "out", 1, recvtb=4)   # TB 4 of rank 2 already receives from 0
    with pytest.raises(ScheduleError) as err:
        lower(p)
    assert "recvtb=4" in str(err.value) and "already recvs from rank 0" in str(err.value)


def test_local_instruction_goes_to_the_threadblock_that_finished_earliest():
    # Rank 1: TB S sends its own chunk at once (depth 0); TB R receives rank
    # 0's chunk (depth 1).  A local copy of an input chunk at depth 0 may go
    # to either: S's last instruction is earlier in the global order... but
    # ties go to the TB whose *last* instruction is earliest, and a TB with no
    # instruction yet is earliest of all.
    with GC3Program("tie", AllGather(3, 1, inplace=False)) as p:
        chunk(1, "in", 0).copy(2, "out", 1)              # s on rank 1 (TB send 2)
        chunk(0, "in", 0).copy(1, "out", 0)              # r on rank 1 (TB recv 0)
        chunk(1, "in", 0).copy(1, "out", 1)              # cpy on rank 1
    prog = lower(p, instr_fusion=False)
    where = {tuple(st.type for st in tb.steps): (tb.send, tb.recv) for tb in tbs(prog, 1)}
    # the recv TB has not run anything when the cpy (depth 0) is placed, the send TB has
    assert where == {("s",): (2, -1), ("cpy", "r"): (-1, 0)}


def _deps(prog, rank):
    return {(tb.id, k): (st.depid, st.deps) for tb in tbs(prog, rank) for k, st in enumerate(tb.steps)
            if st.depid >= 0}


def test_dependency_implied_by_transitivity_is_dropped():
    # rank 1: P = receive into s[0] (TB recv 0), Q = send s[0] to rank 2 (TB send 2,
    # waits for P), Z = reduce i[0] into s[0] on TB 5: Z reads what P wrote and
    # overwrites what Q read, but waiting for Q implies P.
    with GC3Program("trans", AllReduce(3, 1, inplace=False)) as p:
        c = chunk(0, "in", 0).copy(1, "scratch", 0)
        c.copy(2, "scratch", 0)
        c.reduce(chunk(1, "in", 0), sendtb=5)
    prog = lower(p, instr_fusion=False)
    by_peer = {(tb.send, tb.recv): tb for tb in tbs(prog, 1)}
    recv_tb, send_tb = by_peer[(-1, 0)], by_peer[(2, -1)]
    (z,) = [tb for tb in tbs(prog, 1) if [st.type for st in tb.steps] == ["re"]]
    assert (z.steps[0].depid, z.steps[0].deps) == (send_tb.id, 0)
    assert send_tb.steps[0].depid == recv_tb.id and send_tb.steps[0].hasdep
    verify(prog)


def test_second_dependency_goes_to_a_nop_before_the_step():
    with GC3Program("two_deps", AllReduce(3, 1, inplace=False)) as p:
        a = chunk(0, "in", 0).copy(1, "scratch", 0)
        b = chunk(2, "in", 0).copy(1, "scratch", 1)
        a.reduce(b, sendtb=7)
    prog = lower(p, absorption=False)     # absorption would fold the second receive into the re
    (z,) = [tb for tb in tbs(prog, 1) if tb.send == tb.recv == -1]
    assert [st.type for st in z.steps] == ["nop", "re"]
    waited = {(st.depid, st.deps) for st in z.steps}
    recv_tbs = {tb.id for tb in tbs(prog, 1) if tb.recv in (0, 2)}
    assert {d for d, _ in waited} == recv_tbs
    for tb in tbs(prog, 1):
        if tb.id in recv_tbs:
            assert tb.steps[0].hasdep
    verify(prog)


@pytest.mark.parametrize("make", [lambda: ring_allreduce(4), lambda: allpairs_allreduce(4),
                                  lambda: two_step_alltoall(2, 2), lambda: hierarchical_allreduce(2, 3)])
def test_dependencies_are_single_minimal_and_signalled(make):
    for fused in (True, False):
        prog = lower(make(), instances=2, instr_fusion=fused)
        for g in prog.gpus:
            targets = set()
            for tb in g.threadblocks:
                seen = {}
                for k, st in enumerate(tb.steps):
                    if st.depid < 0:
                        continue
                    assert st.depid != tb.id
                    # never a wait that an earlier step of this TB already covers
                    assert seen.get(st.depid, -1) < st.deps, (g.id, tb.id, k)
                    seen[st.depid] = st.deps
                    targets.add((st.depid, st.deps))
            flagged = {(tb.id, k) for tb in g.threadblocks for k, st in enumerate(tb.steps) if st.hasdep}
            assert flagged == targets


def test_sends_wait_for_free_fifo_slots_so_the_schedule_cannot_deadlock():
    # Each rank's single TB sends 20 chunks to the other and receives 20: all
    # sends first would deadlock with 8-slot FIFOs; the order interleaves them.
    for proto in ("Simple", "LL"):
        prog = lower(exchange(20, one_tb=True), protocol=proto)
        verify(prog)
        orders = []
        for g in prog.gpus:
            (tb,) = [t for t in tbs(prog, g.id) if t.send >= 0]
            assert tb.recv == tb.send
            kinds = "".join(st.type for st in tb.steps if st.type in ("s", "r"))
            assert kinds.count("s") == kinds.count("r") == 20
            orders.append(kinds)
        # one rank may send all 20 while the other drains, but not both
        assert any(kinds.index("r") <= 8 for kinds in orders), orders
        assert simulate(prog, count=2 * 20 * 5).ok


def test_fifo_order_the_depth_heuristic_cannot_keep_falls_back_to_trace_order():
    # On connection 0->1 the reduce's send is ready first, but its receive
    # needs the value the second send delivers: the depth-first greedy order
    # gets stuck; the traced order (staged copy first) is a valid schedule.
    with GC3Program("crossed", AllReduce(3, 2, inplace=False)) as p:
        late = chunk(2, "in", 1).copy(0, "scratch", 0)
        staged = late.copy(1, "scratch", 0)
        staged.reduce(chunk(0, "in", 0))
    prog = lower(p, instr_fusion=False)
    verify(prog)
    (tb,) = [tb for tb in prog.gpu(1).threadblocks if tb.recv == 0]
    assert [st.type for st in tb.steps] == ["r", "rrc"]


def test_too_many_threadblocks_is_a_schedule_error():
    with pytest.raises(ScheduleError, match="max_tbs=3"):
        lower(allpairs_allreduce(3), instances=2, max_tbs=3)
    assert len(lower(allpairs_allreduce(3), instances=2, max_tbs=6).gpu(0).threadblocks) == 6


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
    full_verify(ir)
    for count in (6, 7 * 2, 3):
        res = simulate(ir, count=count, dtype="int64", op="max", interleave_seed=count)
        assert res.ok, res.errors[:3]
