"""Absorption (gc3/compiler/absorption.py): r+re and cpy+rrc folded into one rrc, and only where that is safe."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gc3 import GC3Program, chunk
from gc3.compiler.absorption import absorb
from gc3.dsl.collectives import AllReduce
from gc3.compiler.instruction_dag import build_instr_dag, topological_order
from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.compiler.buffers import plan_buffers
from gc3.simulator import simulate
from gc3.verify import verify

from lower_programs import ring_allreduce

ALGORITHMS = Path(__file__).resolve().parents[1] / "gc3" / "algorithms"


def algorithm(name, *args):
    return run_script(str(ALGORITHMS / f"{name}.py"), [str(a) for a in args])


def step_types(prog):
    return {r: sorted({st.type for tb in prog.gpu(r).threadblocks for st in tb.steps}) for r in range(prog.ngpus)}


def steps(prog, rank, kind):
    return [st for tb in prog.gpu(rank).threadblocks for st in tb.steps if st.type == kind]


# ----------------------------------------------------------------------------- the two target programs

@pytest.mark.parametrize("instances", [1, 16])
def test_two_rank_oneshot_is_a_send_and_one_rrc_per_rank(instances):
    traced = algorithm("allreduce_oneshot", 2)
    prog = lower(traced, instances=instances, protocol="LL")
    verify(prog)
    assert step_types(prog) == {0: ["rrc", "s"], 1: ["rrc", "s"]}
    for r in range(2):
        for st_ in steps(prog, r, "rrc"):
            assert (st_.srcbuf, st_.srcoff) == (st_.dstbuf, st_.dstoff) and st_.srcbuf == "i"
        assert len(steps(prog, r, "rrc")) == instances
        # the scratch the received copy used to land in is not allocated any more
        assert prog.gpu(r).s_chunks == 0


@pytest.mark.parametrize("instances", [1, 16])
def test_without_fusion_the_two_rank_oneshot_is_as_traced(instances):
    traced = algorithm("allreduce_oneshot", 2)
    for prog in (lower(traced, instances=instances, protocol="LL", instr_fusion=False, tb_merge=False),
                 lower(traced, instances=instances, protocol="LL", absorption=False, tb_merge=False)):
        assert step_types(prog) == {0: ["r", "re", "s"], 1: ["r", "re", "s"]}
        assert [g.s_chunks for g in prog.gpus] == [instances, instances]
    # the schedule lower() gave before absorption existed, step for step
    one = lower(traced, protocol="LL", instr_fusion=False, tb_merge=False)
    for g in one.gpus:
        peer = 1 - g.id
        assert [(tb.send, tb.recv, [(s.type, s.srcbuf, s.srcoff, s.dstbuf, s.dstoff, s.depid, s.deps)
                                    for s in tb.steps]) for tb in g.threadblocks] == [
            (-1, peer, [("r", "s", 0, "s", 0, -1, -1)]),
            (peer, -1, [("s", "i", 0, "i", 0, -1, -1), ("re", "s", 0, "i", 0, 0, 0)])]


@pytest.mark.parametrize("instances", [1, 4])
def test_two_rank_reducescatter_ring_reads_its_input_directly(instances):
    prog = lower(algorithm("reducescatter_ring", 2), instances=instances)
    verify(prog)
    for r in range(2):
        assert not steps(prog, r, "cpy")
        rrcs = steps(prog, r, "rrc")
        assert len(rrcs) == instances
        assert {(st_.srcbuf, st_.dstbuf) for st_ in rrcs} == {("i", "o")}
    unfused = lower(algorithm("reducescatter_ring", 2), instances=instances, instr_fusion=False)
    assert all(steps(unfused, r, "cpy") for r in range(2))


def test_copy_absorption_feeds_fusion_in_the_longer_ring():
    # out of place, rank r copied its block into scratch, reduced into it and
    # forwarded it: now it reduces straight from its input and stores nothing
    prog = lower(algorithm("reducescatter_ring", 4))
    for r in range(4):
        (tb,) = prog.gpu(r).threadblocks
        assert [st_.type for st_ in tb.steps] == ["s", "rrs", "rrs", "rrc"]
        assert {st_.srcbuf for st_ in tb.steps} == {"i"}



def test_compile_command_can_turn_absorption_off(tmp_path):
    from click.testing import CliRunner
    from gc3.cli import main
    from gc3.ir.xml_io import read_xml

    kinds = {}
    for flags in ((), ("--no-absorption",)):
        out = tmp_path / f"oneshot{len(flags)}.xml"
        res = CliRunner().invoke(main, ["compile", str(ALGORITHMS / "allreduce_oneshot.py"), "2", "--protocol", "LL",
                                        *flags, "-o", str(out)], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        kinds[flags] = step_types(read_xml(out))[0]
    assert kinds == {(): ["rrc", "s"], ("--no-absorption",): ["r", "re", "s"]}

# ----------------------------------------------------------------------------- where it must not apply

def test_four_rank_oneshot_keeps_its_parallel_reduction_chain():
    prog = lower(algorithm("allreduce_oneshot", 4), protocol="LL")
    for r in range(4):
        assert len(steps(prog, r, "re")) == 3 and len(steps(prog, r, "r")) == 3
        assert not steps(prog, r, "rrc")


def test_four_rank_ring_allreduce_is_unchanged():
    prog = lower(ring_allreduce(4))
    for r in range(4):
        assert [st_.type for st_ in prog.gpu(r).threadblocks[0].steps] == ["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]


def test_receive_whose_value_is_read_again_is_not_absorbed():
    with GC3Program("twice", AllReduce(2, 1, inplace=False)) as p:
        got = chunk(0, "in", 0).copy(1, "scratch", 0)
        chunk(1, "in", 0).reduce(got)
        got.copy(1, "out", 0)              # the received tile is needed after the reduction
    assert sorted(x.type for x in absorb(build_instr_dag(p.chunk_dag, plan_buffers(p.chunk_dag, 1))).instrs) == ["cpy", "r", "re", "s"]


def test_receive_into_the_output_that_survives_is_not_absorbed():
    with GC3Program("final", AllReduce(2, 1, inplace=False)) as p:
        got = chunk(0, "in", 0).copy(1, "out", 0)
        chunk(1, "in", 0).reduce(got)      # out[0] keeps the received value: it must be stored
    assert sorted(x.type for x in absorb(build_instr_dag(p.chunk_dag, plan_buffers(p.chunk_dag, 1))).instrs) == ["r", "re", "s"]


# ----------------------------------------------------------------------------- copy absorption and S's writers

def _trace_outputs(trace, inputs, n):
    mem = {(r, "in", 0): inputs[r].copy() for r in range(n)}
    for kind, src, dst in trace:
        mem[dst] = mem[src].copy() if kind == "copy" else mem[dst] + mem[src]
    return [mem[(r, "out", 0)] for r in range(n)]


class Recorder:
    """Trace with numpy semantics alongside, for a reference of non-collective programs."""

    def __init__(self):
        self.trace = []

    def copy(self, src, dst, **kw):
        chunk(*src).copy(*dst, **kw)
        self.trace.append(("copy", src, dst))

    def reduce(self, dst, src, **kw):
        chunk(*dst).reduce(chunk(*src), **kw)
        self.trace.append(("reduce", src, dst))


def _check_on_data(p, trace, n, **lower_kw):
    prog = lower(p, **lower_kw)
    verify(prog, semantics=False)  # these traces compute their own reference, not the collective
    for unit, seed in ((5, None), (12, 1), (12, 7)):
        rng = np.random.default_rng(unit)
        inputs = [rng.integers(-50, 50, unit).astype(np.int64) for _ in range(n)]
        res = simulate(prog, count=unit, dtype="int64", inputs=inputs, reference=_trace_outputs(trace, inputs, n),
                       interleave_seed=seed)
        assert res.ok, res.errors[:3]
    return prog


def _clobbered_source(overwrite_reaches_rrc: bool):
    """Rank 1 copies in[0] to scratch, in[0] is overwritten, then rank 2's
    value is reduced into the scratch copy.  When the overwrite travels to
    rank 2 and back before the reduction, reading in[0] at the reduction
    would read the new value: the copy must stay."""
    t = Recorder()
    with GC3Program("clobber", AllReduce(3, 1, inplace=False)) as p:
        t.copy((1, "in", 0), (1, "sc", 0))                       # cpy S -> D
        t.copy((0, "in", 0), (1, "in", 0))                       # W: rank 1's S overwritten
        if overwrite_reaches_rrc:
            t.copy((1, "in", 0), (2, "tmp", 0))                  # W's value goes to rank 2 ...
            t.reduce((2, "tmp", 0), (2, "in", 0))
            t.reduce((1, "sc", 0), (2, "tmp", 0))                # ... and comes back into D
        else:
            t.reduce((1, "sc", 0), (2, "in", 0))                 # rrc on D, independent of W
        for r in range(3):
            t.copy((1, "sc", 0), (r, "out", 0))
    return p, t.trace


def test_copy_absorption_refused_when_the_source_is_overwritten_first():
    p, trace = _clobbered_source(True)
    dag = absorb(build_instr_dag(p.chunk_dag, plan_buffers(p.chunk_dag, 1)))
    assert [(x.rank, x.srcbuf, x.dstbuf) for x in dag.instrs if x.type == "cpy"][0] == (1, "i", "s")
    prog = _check_on_data(p, trace, 3)
    assert any(st_.type == "cpy" and st_.srcbuf == "i" for st_ in steps(prog, 1, "cpy"))


def test_copy_absorption_orders_the_overwrite_after_the_reduction():
    p, trace = _clobbered_source(False)
    dag = absorb(build_instr_dag(p.chunk_dag, plan_buffers(p.chunk_dag, 1)))
    assert not [x for x in dag.instrs if x.type == "cpy" and x.srcbuf == "i"]
    (rrc,) = [x for x in dag.instrs if x.type == "rrc"]
    assert (rrc.srcbuf, rrc.srcoff, rrc.dstbuf) == ("i", 0, "s")
    (w,) = [x for x in dag.instrs if x.type == "r" and x.rank == 1 and x.dstbuf == "i"]
    assert w.id in dag.succs[rrc.id] and rrc.id in dag.preds[w.id]
    topological_order(dag)                      # still acyclic
    _check_on_data(p, trace, 3)


def test_a_value_read_by_an_absorbed_copy_is_still_stored():
    """Rank 1 reduces into scratch and forwards it (fusion: rrcs, or rrs if
    nobody else reads the scratch); the scratch is then copied and reduced
    into: after absorption the rrc reads the scratch, so it must be stored."""
    t = Recorder()
    with GC3Program("stored", AllReduce(3, 1, inplace=False)) as p:
        t.copy((1, "in", 0), (1, "sc", 0))
        t.reduce((1, "sc", 0), (0, "in", 0))           # rrc into sc, ...
        t.copy((1, "sc", 0), (2, "tmp", 0))            # ... forwarded
        t.copy((1, "sc", 0), (1, "acc", 0))            # cpy S -> D, absorbed ...
        t.reduce((1, "acc", 0), (2, "in", 0))          # ... into this rrc, which now reads sc
        for r in range(3):
            t.copy((1, "acc", 0) if r != 2 else (2, "tmp", 0), (r, "out", 0))
    prog = _check_on_data(p, trace=t.trace, n=3)
    assert [st_.dstbuf for st_ in steps(prog, 1, "cpy")] == ["o"] and not steps(prog, 1, "rrs")
    (fwd,) = [st_ for st_ in steps(prog, 1, "rrcs") if st_.srcbuf == "i"]          # stores sc
    (reader,) = [st_ for st_ in steps(prog, 1, "rrcs") + steps(prog, 1, "rrc") if st_.srcbuf == "s"]
    assert (fwd.dstbuf, fwd.dstoff) == (reader.srcbuf, reader.srcoff)


def test_receive_absorption_result_is_a_consistent_dag():
    traced = algorithm("allreduce_oneshot", 2)
    dag = absorb(build_instr_dag(traced.chunk_dag, plan_buffers(traced.chunk_dag, 1)))
    assert sorted(x.type for x in dag.instrs) == ["rrc", "rrc", "s", "s"]
    assert [x.id for x in dag.instrs] == list(range(len(dag.instrs)))
    for u, vs in enumerate(dag.succs):
        assert vs == sorted(vs) and dag.preds[u] == sorted(dag.preds[u])
        for v in vs:
            assert u in dag.preds[v]
    for x in dag.instrs:
        if x.type == "rrc":
            s = dag.recv_from[x.id]
            assert dag.instrs[s].type == "s" and dag.send_to[s] == x.id and dag.instrs[s].rank == x.recv_peer
    assert len(dag.value_readers) == len(dag.value_dies) == len(dag.instrs)


# ----------------------------------------------------------------------------- data

ABSORBED = [("allreduce_oneshot", (2,), 1, "LL"), ("allreduce_oneshot", (2,), 16, "LL"),
            ("allreduce_oneshot", (2, 3), 2, "Simple"), ("reducescatter_ring", (2,), 4, "Simple"),
            ("reducescatter_ring", (4,), 2, "LL"), ("reducescatter_ring", (3, 2), 1, "Simple"),
            ("reduce_ring", (4,), 1, "Simple"), ("allreduce_allpairs", (2,), 4, "LL"),
            ("reducescatter_direct", (2,), 2, "LL"), ("reducescatter_recursive_halving", (8,), 1, "Simple")]


@pytest.mark.parametrize("name, args, instances, proto", ABSORBED)
def test_absorbed_programs_compute_the_collective(name, args, instances, proto):
    traced = algorithm(name, *args)
    prog = lower(traced, instances=instances, protocol=proto)
    before = lower(traced, instances=instances, protocol=proto, absorption=False)
    count_steps = lambda q: sum(len(tb.steps) for g in q.gpus for tb in g.threadblocks)  # noqa: E731
    assert count_steps(prog) < count_steps(before)           # absorption did something here
    verify(prog)
    n = prog.ngpus
    for count in (n, n * 7, n * 97, n * prog.nchunksperloop * 3 + n):
        res = simulate(prog, count=count, root=traced.collective.root or 0)
        assert res.ok, (count, res.errors[:3])
        assert not res.warnings, res.warnings


@pytest.mark.parametrize("dtype, op", [("float32", "sum"), ("bfloat16", "sum"), ("int32", "max"),
                                       ("float64", "prod"), ("uint8", "min")])
def test_absorbed_programs_dtypes_and_ops(dtype, op):
    for name, args, instances, proto in ABSORBED[:5]:
        prog = lower(algorithm(name, *args), instances=instances, protocol=proto)
        for per_rank in (3, 101):
            res = simulate(prog, count=per_rank * prog.ngpus, dtype=dtype, op=op)
            assert res.ok, (name, dtype, op, res.errors[:3])


# ----------------------------------------------------------------------------- property

@st.composite
def staged_programs(draw):
    """Random programs built from the two absorbable shapes (receive to a
    staging slot then reduce it in; copy locally then receive-reduce into the
    copy) with unrelated copies that may overwrite any of their slots."""
    n = draw(st.integers(2, 4))
    t = Recorder()
    slots = [(r, "in", 0) for r in range(n)]
    with GC3Program("rand_absorb", AllReduce(n, 1, inplace=False)) as p:
        for k in range(draw(st.integers(1, 8))):
            r = draw(st.integers(0, n - 1))
            peer = draw(st.sampled_from([q for q in range(n) if q != r]))
            shape = draw(st.sampled_from(["recv_reduce", "copy_rrc", "guarded", "clobber"]))
            if shape == "recv_reduce":
                stage = (r, "stage", draw(st.integers(0, 1)))
                t.copy(draw(st.sampled_from([s for s in slots if s[0] == peer])), stage)
                dst = draw(st.sampled_from([s for s in slots if s[0] == r and s != stage]))
                t.reduce(dst, stage)
                if draw(st.booleans()):
                    slots.append(stage)          # sometimes the staged value is read again later
            elif shape == "copy_rrc":
                src = draw(st.sampled_from([s for s in slots if s[0] == r]))
                dst = (r, draw(st.sampled_from(["acc", "out"])), 0)
                if dst == src:
                    continue
                t.copy(src, dst)
                t.reduce(dst, draw(st.sampled_from([s for s in slots if s[0] == peer])))
                slots.append(dst)
            elif shape == "guarded":
                # copy, overwrite the copy's source, then reduce into the copy,
                # sometimes with a value that saw the overwrite
                src = draw(st.sampled_from([s for s in slots if s[0] == r]))
                dst = (r, "acc", 1)
                if dst == src:
                    continue
                t.copy(src, dst)
                t.copy(draw(st.sampled_from([s for s in slots if s != src])), src)
                if draw(st.booleans()):
                    t.copy(src, (peer, "tmp", 1))
                    t.reduce(dst, (peer, "tmp", 1))
                else:
                    t.reduce(dst, draw(st.sampled_from([s for s in slots if s[0] == peer])))
                slots.append(dst)
            else:
                src = draw(st.sampled_from(slots))
                dst = draw(st.sampled_from([s for s in slots if s != src]))
                t.copy(src, dst)
        for r in range(n):
            src = draw(st.sampled_from(slots))
            if src != (r, "out", 0):
                t.copy(src, (r, "out", 0))
    return p, t.trace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=staged_programs(), instances=st.integers(1, 2), interleave=st.sampled_from([None, 5]))
def test_random_programs_compute_the_same_with_and_without_absorption(case, instances, interleave):
    p, trace = case
    n = p.collective.num_ranks
    rng = np.random.default_rng(len(trace))
    inputs = [rng.integers(-50, 50, 6 * instances).astype(np.int64) for _ in range(n)]
    # every step is elementwise on equal-sized slots, so however instances
    # split the chunk, the outputs are the trace applied to whole buffers
    expected = _trace_outputs(trace, inputs, n)
    for absorption in (True, False):
        prog = lower(p, instances=instances, absorption=absorption)
        verify(prog, semantics=False)  # arbitrary traces implement no collective
        res = simulate(prog, count=len(inputs[0]), dtype="int64", inputs=inputs, reference=expected,
                       interleave_seed=interleave)
        assert res.ok, (absorption, trace, res.errors[:3])



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=staged_programs())
def test_pruned_ancestor_search_agrees_with_a_full_search(case):
    """White box: the search that guards copy absorption only looks between
    topological positions, which edges added against trace order must keep
    right; checked against an unpruned search on every query."""
    from gc3.compiler import absorption

    pruned = absorption._Work.is_ancestor_of_any

    def checked(self, targets, v):
        got = pruned(self, targets, v)
        seen, work, truth = {v}, [v], False
        while work:
            for p in self._ins(work.pop()):
                truth |= p in targets
                if p not in seen:
                    seen.add(p)
                    work.append(p)
        assert got == truth
        assert all(self.pos[u] < self.pos[x] for u in range(len(self.instrs)) for x in self._outs(u))
        return got

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(absorption._Work, "is_ancestor_of_any", checked)
        lower(case[0])
