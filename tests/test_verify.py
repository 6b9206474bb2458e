"""Pass 7: verification of a scheduled IR (structure, limits, FIFO order, deadlock)."""
from pathlib import Path

import pytest

from gc3 import limits
from gc3.errors import (DeadlockError, FifoOrderError, IRStructureError, LimitError,
                        UnmatchedTransferError, VerificationError)
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.verify import check_report, verify as full_verify

from gc3.verify.deadlock import min_slots
from gc3.verify.model import build_model
from gc3.ir.xml_io import from_xml, read_xml, to_xml


def verify(prog, **options):
    """These schedules test the other passes and compute nothing in particular."""
    return full_verify(prog, semantics=False, **options)

MSCCL = sorted((Path(__file__).parent / "data" / "msccl").glob("*.xml"))


def step(type_, src=("i", 0), dst=("i", 0), cnt=1, dep=None, hasdep=False):
    depid, deps = dep if dep is not None else (-1, -1)
    return Step(s=0, type=type_, srcbuf=src[0], srcoff=src[1], dstbuf=dst[0], dstoff=dst[1],
                cnt=cnt, depid=depid, deps=deps, hasdep=hasdep)


def tb(id_, send=-1, recv=-1, steps=(), chan=0):
    steps = [s if isinstance(s, Step) else step(s) for s in steps]
    for k, s in enumerate(steps):
        s.s = k
    return Threadblock(id=id_, send=send, recv=recv, chan=chan, steps=steps)


def program(ranks, *, i_chunks=4, o_chunks=4, s_chunks=0, nchannels=1, inplace=False, gc3=True):
    """ranks: one list of threadblocks per rank."""
    return Program(name="t", proto="Simple", nchannels=nchannels, nchunksperloop=i_chunks, ngpus=len(ranks),
                   coll="custom", inplace=inplace, gc3version="0.1.0" if gc3 else None,
                   gpus=[Gpu(r, i_chunks, o_chunks, s_chunks, list(tbs)) for r, tbs in enumerate(ranks)])


def exchange(ops):
    """Two ranks, one TB each, both running `ops` against each other."""
    return program([[tb(0, send=1, recv=1, steps=ops)], [tb(0, send=0, recv=0, steps=ops)]])


# --- deadlock ---------------------------------------------------------------
def test_issue_exchange_deadlocks_with_two_slots_and_names_both_tbs():
    prog = exchange(["s", "s", "s", "r", "r", "r"])
    with pytest.raises(DeadlockError) as err:
        verify(prog, slots=2)
    msg = str(err.value)
    assert "slots=2" in msg
    assert "rank 0 tb 0 step 2 (s)" in msg and "rank 1 tb 0 step 2 (s)" in msg
    assert "free slot on 0->1 chan 0" in msg and "free slot on 1->0 chan 0" in msg


@pytest.mark.parametrize("slots", [3, 4, 8])
def test_issue_exchange_accepted_with_enough_slots(slots):
    prog = exchange(["s", "s", "s", "r", "r", "r"])
    summary = verify(prog, slots=slots)
    # what was checked: the slots asked for (not the protocol's), every one of the 2 x 3 sends
    # matched over the two connections, and no semantics (these schedules compute nothing)
    assert (summary.slots, summary.pairs, summary.connections) == (slots, 6, 2)
    assert (summary.ranks, summary.threadblocks, summary.steps, summary.deps) == (2, 2, 12, 0)
    assert summary.proven is None and summary.slots >= min_slots(build_model(prog)) == 3


def test_exchange_needs_exactly_as_many_slots_as_sends_in_a_row():
    for n in range(1, 6):
        assert min_slots(build_model(exchange(["s"] * n + ["r"] * n))) == n


def test_receive_first_on_both_sides_deadlocks_for_any_slots():
    prog = exchange(["r", "s"])
    with pytest.raises(DeadlockError, match="waits to receive on 1->0 chan 0 from rank 1 tb 0"):
        verify(prog, slots=100)
    assert min_slots(build_model(prog)) is None


def test_cyclic_cross_tb_dependency():
    prog = program([[tb(0, steps=[step("nop", dep=(1, 0), hasdep=True)]),
                     tb(1, steps=[step("nop", dep=(0, 0), hasdep=True)])]])
    with pytest.raises(DeadlockError) as err:
        verify(prog)
    msg = str(err.value)
    assert "rank 0 tb 0 step 0 (nop) waits for rank 0 tb 1 step 0 (nop)" in msg
    assert "rank 0 tb 1 step 0 (nop) waits for rank 0 tb 0 step 0 (nop)" in msg


def test_dependency_across_ranks_through_fifo_cycle():
    # rank 0: tb1 sends only after tb0 received; rank 1 does the same: nobody sends first.
    ranks = [[tb(0, recv=1, steps=[step("r", hasdep=True)]), tb(1, send=1, steps=[step("s", dep=(0, 0))])]
             for _ in range(2)]
    ranks[1][0].recv = 0
    ranks[1][1].send = 0
    with pytest.raises(DeadlockError) as err:
        verify(program(ranks))
    assert "(depid/deps)" in str(err.value) and "waits to receive" in str(err.value)
    # Dropping one side's dependency breaks the cycle.
    ranks[1][1].steps[0].depid = ranks[1][1].steps[0].deps = -1
    verify(program(ranks))


def test_deadlock_reports_tbs_blocked_behind_the_cycle():
    prog = exchange(["s", "s", "r", "r"])
    prog.gpus[0].threadblocks.append(tb(1, steps=[step("nop", dep=(0, 3))]))
    prog.gpus[0].threadblocks[0].steps[3].hasdep = True
    with pytest.raises(DeadlockError, match=r"1 more threadblocks are blocked behind it, e\.g\. rank 0 tb 1 step 0"):
        verify(prog, slots=1)
    verify(prog, slots=2)


def test_ring_sample_needs_two_slots():
    prog = read_xml(MSCCL[[p.name for p in MSCCL].index("allreduce_ring_4r_1i.xml")])
    assert min_slots(build_model(prog)) == 2
    with pytest.raises(DeadlockError) as err:
        verify(prog, slots=1)
    for r in range(4):
        assert f"rank {r} tb 0 step 1 (rrs)" in str(err.value)


# --- matching and FIFO order ------------------------------------------------
def test_recv_without_any_sender():
    prog = program([[tb(0, recv=1, steps=["r"])], [tb(0, steps=["nop"])]])
    with pytest.raises(UnmatchedTransferError, match="rank 0 tb 0 step 0 \\(r\\) receives from rank 1 on chan 0, "
                                                     "but no threadblock of rank 1 sends"):
        verify(prog)


def test_send_without_any_receiver():
    prog = program([[tb(0, send=1, steps=["s"])], [tb(0, steps=["nop"])]])
    with pytest.raises(UnmatchedTransferError, match="no threadblock of rank 1 receives from rank 0"):
        verify(prog)


def test_more_receives_than_sends_names_the_extra_receive():
    prog = program([[tb(0, send=1, steps=["s", "s"])], [tb(0, recv=0, steps=["r", "r", "r"])]])
    with pytest.raises(UnmatchedTransferError, match="rank 1 tb 0 step 2 \\(r\\) is receive #2 on 0->1 chan 0"):
        verify(prog)


def test_more_sends_than_receives_names_the_extra_send():
    prog = program([[tb(0, send=1, steps=["s", "s"])], [tb(0, recv=0, steps=["r"])]])
    with pytest.raises(UnmatchedTransferError, match="rank 0 tb 0 step 1 \\(s\\) is send #1"):
        verify(prog)


def test_mismatched_cnt():
    prog = program([[tb(0, send=1, steps=[step("s"), step("s", cnt=2)])],
                    [tb(0, recv=0, steps=[step("r"), step("r")])]])
    with pytest.raises(FifoOrderError) as err:
        verify(prog)
    assert "send #1 on 0->1 chan 0 (rank 0 tb 0 step 1 (s))" in str(err.value)
    assert "cnt=2 vs cnt=1" in str(err.value)


def test_channels_are_separate_fifos():
    # Same peers, two channels: the counts only have to match per channel.
    prog = program([[tb(0, send=1, steps=["s", "s"], chan=0), tb(1, send=1, steps=["s"], chan=1)],
                    [tb(0, recv=0, steps=["r"], chan=0), tb(1, recv=0, steps=["r", "r"], chan=1)]], nchannels=2)
    with pytest.raises(UnmatchedTransferError, match="0->1 chan 0"):
        verify(prog)
    prog.gpus[1].threadblocks[0].steps.append(step("r", ))
    prog.gpus[1].threadblocks[0].steps[-1].s = 1
    prog.gpus[1].threadblocks[1].steps.pop()
    verify(prog)


@pytest.mark.parametrize("path", MSCCL, ids=lambda p: p.name)
def test_msccl_samples_pass(path):
    summary = full_verify(read_xml(path))
    assert summary.proven > 0
    assert summary.pairs > 0 and summary.slots == limits.FIFO_SLOTS[read_xml(path).proto]


@pytest.mark.parametrize("sample, old, new, needle", [
    # Rank 1's second receive from rank 0 claims to store into o[2]; rank 0 sent to o[0].
    ("alltoall_two_step_2n_4g.xml", 'type="r" srcbuf="i" srcoff="1" dstbuf="o" dstoff="0"',
     'type="r" srcbuf="i" srcoff="1" dstbuf="o" dstoff="2"', "send targets o[0] but the receiver stores into o[2]"),
    # Rank 1's first receive names rank 0's i[0] as the source; rank 0 sent i[2].
    ("allreduce_allpairs_2r_1i.xml", 'type="r" srcbuf="i" srcoff="2" dstbuf="s"',
     'type="r" srcbuf="i" srcoff="0" dstbuf="s"', "source i[0] but the sender reads i[2]"),
])
def test_msccl_remote_operands_must_agree_with_the_other_side(sample, old, new, needle):
    text = (Path(__file__).parent / "data" / "msccl" / sample).read_text()
    bad = text.replace(old, new, 1)
    assert bad != text
    with pytest.raises(FifoOrderError) as err:
        verify(from_xml(bad))
    assert needle in str(err.value)


def test_gc3_convention_does_not_compare_remote_operands():
    # In gc3's convention every operand is local: different offsets on the two sides are fine.
    prog = program([[tb(0, send=1, steps=[step("s", src=("i", 1), dst=("i", 1))])],
                    [tb(0, recv=0, steps=[step("r", src=("o", 3), dst=("o", 3))])]])
    assert verify(prog).pairs == 1     # matched, whatever each side's offsets
    prog.gc3version = None  # the same fields read as msccl-tools' remote operands disagree
    with pytest.raises(FifoOrderError):
        verify(prog)


# --- structure --------------------------------------------------------------
def test_dep_on_nonexistent_step():
    prog = program([[tb(0, steps=["nop", "nop"]), tb(1, steps=[step("nop", dep=(0, 2))])]])
    with pytest.raises(IRStructureError, match="rank 0 tb 1 step 0 \\(nop\\): deps=2 but rank 0 tb 0 has only 2 steps"):
        verify(prog)


def test_dep_on_nonexistent_tb():
    prog = program([[tb(0, steps=[step("nop", dep=(5, 0))])]])
    with pytest.raises(IRStructureError, match="depid=5 but rank 0 has no threadblock 5"):
        verify(prog)


def test_dep_on_step_without_hasdep():
    prog = program([[tb(0, steps=["nop"]), tb(1, steps=[step("nop", dep=(0, 0))])]])
    with pytest.raises(IRStructureError, match="hasdep=0"):
        verify(prog)
    prog.gpus[0].threadblocks[0].steps[0].hasdep = True
    verify(prog)


def test_dep_on_own_threadblock():
    prog = program([[tb(0, steps=[step("nop", hasdep=True), step("nop", dep=(0, 0))])]])
    with pytest.raises(IRStructureError, match="depends on its own threadblock"):
        verify(prog)


def test_half_set_dependency():
    prog = program([[tb(0, steps=[step("nop", hasdep=True)]), tb(1, steps=[step("nop", dep=(0, -1))])]])
    with pytest.raises(IRStructureError, match="depid=0 deps=-1"):
        verify(prog)


@pytest.mark.parametrize("mutate, needle", [
    (lambda p: setattr(p.gpus[1], "id", 0), "two <gpu> elements with id 0"),
    (lambda p: setattr(p, "ngpus", 3), "ngpus=3 but the <gpu> ids are [0, 1]"),
    (lambda p: p.gpus[0].threadblocks.append(tb(0)), "rank 0: two threadblocks with id 0"),
    (lambda p: setattr(p.gpus[0].threadblocks[0], "send", 0), "rank 0 tb 0: send=0 is not another rank"),
    (lambda p: setattr(p.gpus[0].threadblocks[0], "recv", 2), "rank 0 tb 0: recv=2 is not another rank"),
    (lambda p: setattr(p.gpus[0].threadblocks[0], "chan", 1), "chan=1 outside 0..0"),
    (lambda p: p.gpus[0].threadblocks.append(tb(1, send=1)), "the send connection to rank 1 on chan 0 is already used by rank 0 tb 0"),
    (lambda p: setattr(p.gpus[1].threadblocks[0], "recv", -1), "rank 1 tb 0 step 0 (r) receives but the threadblock has no recv peer"),
    (lambda p: setattr(p.gpus[0].threadblocks[0], "send", -1), "rank 0 tb 0 step 0 (s) sends but the threadblock has no send peer"),
    (lambda p: setattr(p.gpus[0].threadblocks[0].steps[0], "cnt", 0), "cnt=0"),
    (lambda p: setattr(p.gpus[0].threadblocks[0].steps[0], "srcoff", 3), "operand i[3:5] outside rank 0's i_chunks=4"),
    (lambda p: setattr(p.gpus[1].threadblocks[0].steps[0], "dstoff", -1), "rank 1 tb 0 step 0 (r): operand o[-1:1]"),
])
def test_structural_errors_name_the_place(mutate, needle):
    prog = program([[tb(0, send=1, steps=[step("s", cnt=2)])],
                    [tb(0, recv=0, steps=[step("r", src=("o", 0), dst=("o", 0), cnt=2)])]])
    verify(prog)
    mutate(prog)
    with pytest.raises(IRStructureError) as err:
        verify(prog)
    assert needle in str(err.value)


def test_in_place_program_cannot_name_the_output_buffer():
    prog = program([[tb(0, steps=[step("cpy", src=("i", 0), dst=("o", 1))])]], o_chunks=0, inplace=True)
    with pytest.raises(IRStructureError, match=r"operand o\[1:2\] outside rank 0's o_chunks=0 \(an in-place program"):
        verify(prog)


def test_msccl_nops_may_have_zero_count_and_no_operands():
    prog = program([[tb(0, steps=[step("nop", src=("i", -1), dst=("o", -1), cnt=0)])]], gc3=False)
    summary = verify(prog)
    # the nop is a step of the schedule, and it moves nothing: no connection, no transfer
    assert (summary.ranks, summary.threadblocks, summary.steps) == (1, 1, 1)
    assert (summary.connections, summary.pairs, summary.deps) == (0, 0, 0)
    # only a nop: the same fields on a copy are a step that moves nothing
    prog.gpus[0].threadblocks[0].steps[0].type = "cpy"
    with pytest.raises(IRStructureError, match=r"\(cpy\): cnt=0; a step moves at least one chunk"):
        verify(prog)


# --- runtime limits ---------------------------------------------------------
def test_too_many_tbs():
    prog = program([[tb(k, steps=["nop"]) for k in range(5)]])
    verify(prog, max_tbs=5)
    with pytest.raises(LimitError, match="rank 0 has 5 threadblocks, more than max_tbs=4"):
        verify(prog, max_tbs=4)


def test_default_tb_limit_comes_from_gc3_limits():
    prog = program([[tb(k, steps=["nop"]) for k in range(limits.MAX_TBS + 1)]])
    with pytest.raises(LimitError, match=f"max_tbs={limits.MAX_TBS}"):
        verify(prog)


def test_too_many_steps_and_too_large_cnt():
    prog = program([[tb(0, steps=["nop"] * 6)]])
    with pytest.raises(LimitError, match="rank 0 tb 0 has 6 steps, more than 5"):
        verify(prog, max_steps=5)
    prog = program([[tb(0, steps=[step("cpy", dst=("o", 0), cnt=4)])]])
    with pytest.raises(LimitError, match=r"rank 0 tb 0 step 0 \(cpy\): cnt=4 exceeds the runtime's 3"):
        verify(prog, max_cnt=3)


def test_too_many_channels():
    prog = program([[tb(0, steps=["nop"], chan=2)]], nchannels=3)
    verify(prog, max_channels=3)
    with pytest.raises(LimitError, match="nchannels=3"):
        verify(prog, max_channels=2)


def test_reduce_fanin_of_consecutive_re_chain():
    def chain(n, split_at=None):
        steps = [step("re", src=("s", k), dst=("i", 0)) for k in range(n)]
        if split_at is not None:
            steps[split_at].depid, steps[split_at].deps = 1, 0
        return program([[tb(0, steps=steps), tb(1, steps=[step("nop", hasdep=True)])]], s_chunks=n)

    verify(chain(limits.MAX_REDUCE_FANIN))
    with pytest.raises(LimitError, match=f"rank 0 tb 0 step {limits.MAX_REDUCE_FANIN} \\(re\\): "
                                         f"{limits.MAX_REDUCE_FANIN + 1} consecutive 're' steps"):
        verify(chain(limits.MAX_REDUCE_FANIN + 1))
    verify(chain(limits.MAX_REDUCE_FANIN + 1, split_at=4))  # a dependency splits the pass
    verify(chain(5), max_fanin=5)
    with pytest.raises(LimitError):
        verify(chain(6), max_fanin=5)


def _re_chain(n, change=None):
    steps = [Step(s=k, type="re", srcbuf="s", srcoff=k, dstbuf="i", dstoff=0) for k in range(n)]
    waiter = Threadblock(id=1, steps=[Step(s=0, type="nop", srcbuf="i", srcoff=0, dstbuf="i", dstoff=0)])
    if change is not None:
        change(steps, waiter)
    gpu = Gpu(0, i_chunks=2, o_chunks=0, s_chunks=n, threadblocks=[Threadblock(id=0, steps=steps), waiter])
    return Program("chain", "Simple", 1, 2, 1, "custom", True, [gpu], gc3version="0.1.0")


def _hasdep_at(k):
    def change(steps, waiter):
        steps[k].hasdep = True
        waiter.steps[0].depid, waiter.steps[0].deps = 0, k
    return change


def _field_at(k, **fields):
    def change(steps, waiter):
        for name, value in fields.items():
            setattr(steps[k], name, value)
    return change


@pytest.mark.parametrize("change, fused_too_far", [
    (None, True),
    (_hasdep_at(3), False),              # another TB waits on step 3: the pass ends there
    (_field_at(4, dstoff=1), False),     # another destination starts a new pass
    (_field_at(4, cnt=2, srcoff=0), False),   # another count too
    (_field_at(4, hasdep=False), True),
])
def test_fanin_chain_ends_where_the_runtime_ends_a_fused_pass(change, fused_too_far):
    prog = _re_chain(limits.MAX_REDUCE_FANIN + 1, change)
    if fused_too_far:
        with pytest.raises(LimitError, match="consecutive 're' steps"):
            verify(prog)
    else:
        verify(prog)


# --- report -----------------------------------------------------------------
def test_check_report_says_what_was_checked():
    prog = read_xml(MSCCL[[p.name for p in MSCCL].index("alltoall_two_step_2n_4g.xml")])
    lines = check_report(prog, slots=4)
    text = "\n".join(lines)
    assert "8 ranks" in text and "64 threadblocks, 152 steps" in text
    assert "32 cross-TB dependencies" in text
    assert "56 send/receive pairs on 32 connections" in text
    assert "none with 4 slots per connection (the schedule needs at least 1)" in text


def test_check_report_raises_like_verify():
    with pytest.raises(VerificationError):
        check_report(exchange(["s", "s", "r", "r"]), slots=1)


def test_round_tripped_program_verifies_the_same():
    prog = exchange(["s", "s", "s", "r", "r", "r"])
    again = from_xml(to_xml(prog))
    verify(again, slots=3)
    with pytest.raises(DeadlockError):
        verify(again, slots=2)
