"""Fusion (pass 2) pinned by exact opcode sequences on small programs."""
from pathlib import Path

from gc3 import Check, GC3Program, chunk
from gc3.dsl.collectives import AllGather, AllReduce, Collective, input_chunk
from gc3.compiler.instruction_dag import build_instr_dag
from gc3.compiler.fusion import fuse
from gc3.ir import Convention, local_input, local_output
from gc3.compiler.pipeline import lower
from gc3.compiler.buffers import plan_buffers
from gc3.simulator import simulate
from gc3.verify import verify
from gc3.ir.xml_io import read_xml

from lower_programs import ring_allreduce

MSCCL_RING = Path(__file__).parent / "data" / "msccl" / "allreduce_ring_4r_1i.xml"


def types(prog, rank, tb=0):
    return [st.type for st in prog.gpu(rank).threadblocks[tb].steps]


def test_ring_allreduce_fuses_to_the_msccl_sequence_on_every_rank():
    prog = lower(ring_allreduce(4))
    for rank in range(4):
        assert len(prog.gpu(rank).threadblocks) == 1
        assert types(prog, rank) == ["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]


def test_ring_allreduce_matches_msccl_tools_output_step_for_step():
    """Same TBs, opcodes, local operands and counts as msccl-tools' XML for the same program."""
    ours = lower(ring_allreduce(4))
    theirs = read_xml(MSCCL_RING)

    def shape(prog):
        out = []
        for g in prog.gpus:
            for tb in g.threadblocks:
                out.append((g.id, tb.send, tb.recv, tb.chan, [
                    (st.type, local_input(st, prog.convention), local_output(st, prog.convention), st.cnt)
                    for st in tb.steps]))
        return out

    assert ours.convention == Convention.GC3 and theirs.convention == Convention.MSCCL
    assert shape(ours) == shape(theirs)


def test_without_fusion_only_plain_sends_receives_and_rrc_remain():
    prog = lower(ring_allreduce(4), instr_fusion=False)
    for rank in range(4):
        tbs = prog.gpu(rank).threadblocks
        seqs = sorted(("send" if tb.send >= 0 else "recv", [st.type for st in tb.steps if st.type != "nop"])
                      for tb in tbs)
        assert seqs == [("recv", ["rrc", "rrc", "rrc", "r", "r", "r"]), ("send", ["s"] * 6)]


def test_program_setting_is_the_default_and_the_argument_overrides_it():
    unfused = ring_allreduce(4, instr_fusion=False)
    assert {st.type for g in lower(unfused).gpus for tb in g.threadblocks for st in tb.steps} <= {"s", "r", "rrc", "nop"}
    assert types(lower(unfused, instr_fusion=True), 0) == ["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]


def _dag(program, fused=True):
    d = build_instr_dag(program.chunk_dag, plan_buffers(program.chunk_dag, 1))
    return fuse(d) if fused else d


def test_rrcs_kept_when_the_reduced_value_is_read_again_locally():
    # rank 1 reduces rank 0's chunk into its own, forwards it to rank 2, and
    # also copies it locally: the stored result is read, so it must be rrcs.
    with GC3Program("keep", AllReduce(3, 1, inplace=False)) as p:
        c = chunk(1, "in", 0).reduce(chunk(0, "in", 0))
        c.copy(2, "scratch", 0)
        c.copy(1, "out", 0)
    kinds = sorted(x.type for x in _dag(p).instrs)
    assert kinds == ["cpy", "r", "rrcs", "s"]


def test_rrs_when_the_reduced_value_is_overwritten_before_any_other_read():
    with GC3Program("drop", AllReduce(3, 1, inplace=True)) as p:
        c = chunk(1, "in", 0).reduce(chunk(0, "in", 0))
        c = c.copy(2, "scratch", 0)
        c.copy(1, "in", 0)            # overwrites rank 1's partial sum
    # rank 2 sends the sum straight back (rcs) and rank 1 stores it (r)
    assert sorted(x.type for x in _dag(p).instrs) == ["r", "rcs", "rrs", "s"]


def test_rrcs_kept_when_the_reduced_value_is_final_output():
    with GC3Program("final", AllReduce(3, 1, inplace=True)) as p:
        chunk(1, "in", 0).reduce(chunk(0, "in", 0)).copy(2, "scratch", 0)
    assert sorted(x.type for x in _dag(p).instrs) == ["r", "rrcs", "s"]


def test_rrs_when_the_reduced_value_lands_in_scratch_nobody_reads_again():
    with GC3Program("dead", AllReduce(3, 1, inplace=True)) as p:
        c = chunk(1, "in", 0).copy(1, "scratch", 0)
        c.reduce(chunk(0, "in", 0)).copy(2, "scratch", 0)
    assert sorted(x.type for x in _dag(p).instrs) == ["cpy", "r", "rrs", "s"]


def test_of_several_forwarding_sends_the_one_on_the_longest_path_is_fused():
    # rank 1 receives chunk 0 and forwards it to rank 2 (a dead end) and to
    # rank 3 (which passes it on to rank 0's output): the second is longer.
    with GC3Program("fork", AllGather(4, 1, inplace=False)) as p:
        c = chunk(0, "in", 0).copy(1, "scratch", 0)
        c.copy(2, "scratch", 0)
        c.copy(3, "scratch", 0).copy(0, "out", 1)
    dag = _dag(p)
    (rcs,) = [x for x in dag.instrs if x.type == "rcs" and x.rank == 1]
    assert (rcs.rank, rcs.recv_peer, rcs.send_peer) == (1, 0, 3)
    assert sorted((x.rank, x.type) for x in dag.instrs) == [
        (0, "r"), (0, "s"), (1, "rcs"), (1, "s"), (2, "r"), (3, "rcs")]


def test_no_fusion_across_different_user_channels_or_threadblocks():
    for first, second in (({"ch": 0}, {"ch": 1}), ({"recvtb": 2}, {"sendtb": 3})):
        with GC3Program("pinned", AllGather(3, 1, inplace=False)) as p:
            c = chunk(0, "in", 0).copy(1, "scratch", 0, **first)
            c.copy(2, "scratch", 0, **second)
        assert sorted(x.type for x in _dag(p).instrs) == ["r", "r", "s", "s"], second
    # an op without a hint joins a pinned one
    with GC3Program("half", AllGather(3, 1, inplace=False)) as p:
        c = chunk(0, "in", 0).copy(1, "scratch", 0)
        c.copy(2, "scratch", 0, ch=1)
    assert sorted(x.type for x in _dag(p).instrs) == ["r", "rcs", "s"]
    with GC3Program("same", AllGather(3, 1, inplace=False)) as p:
        c = chunk(0, "in", 0).copy(1, "scratch", 0, ch=1)
        c.copy(2, "scratch", 0, ch=1)
    assert sorted(x.type for x in _dag(p).instrs) == ["r", "rcs", "s"]


def test_fusion_never_changes_the_result():
    for fused in (True, False):
        prog = lower(ring_allreduce(5), instr_fusion=fused)
        for count in (5 * 13, 1000, 3):
            res = simulate(prog, count=count, dtype="int32", op="max")
            assert res.ok, res.errors


class _Pipe(Collective):
    """Rank 0's chunk ends up on every rank's output (a custom collective)."""
    name = "pipe"

    def precondition(self, rank, index):
        return rank == 0

    def postcondition(self, rank, index):
        return input_chunk(0, index)


def test_custom_collective_chain_fuses_into_rcs_run():
    with GC3Program("pipe", _Pipe(4, 1)) as p:
        c = chunk(0, "in", 0).copy(0, "out", 0)
        for r in (1, 2, 3):
            c = c.copy(r, "out", 0)
    prog = lower(p)
    assert [types(prog, r) for r in range(4)] == [["cpy", "s"], ["rcs"], ["rcs"], ["r"]]


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
