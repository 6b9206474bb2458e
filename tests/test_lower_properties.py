"""Property tests: random small valid programs lower, verify, round-trip and compute the right thing."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from gc3 import Check, GC3Program, chunk, parallelize
from gc3.dsl.collectives import AllGather, AllReduce, AllToAll
from gc3.compiler.pipeline import lower
from gc3.simulator import simulate
from gc3.verify import verify
from gc3.ir.xml_io import from_xml, to_xml


def _route(draw, n, start, end=None):
    """A random simple path of ranks from `start` (to `end` if given)."""
    others = [r for r in range(n) if r not in (start, end)]
    hops = draw(st.permutations(others))[:draw(st.integers(0, len(others)))]
    return [start, *hops] + ([end] if end is not None and end != start else [])


@st.composite
def allgather_programs(draw):
    n, c = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    grouped = draw(st.booleans())
    with GC3Program("rand_allgather", AllGather(n, c, inplace=False)) as prog:
        for r in range(n):
            pieces = [(0, c)] if grouped else [(j, 1) for j in range(c)]
            for j, cnt in pieces:
                # a random order in which the chunk visits every rank (a chain of copies)
                order = [r, *draw(st.permutations([x for x in range(n) if x != r]))]
                c0 = chunk(r, "in", j, count=cnt).copy(r, "out", r * c + j)
                prev = c0
                for dst in order[1:]:
                    # copy from the latest holder, sometimes via a scratch hop
                    if draw(st.booleans()):
                        prev = prev.copy(dst, "out", r * c + j)
                    else:
                        prev = prev.copy(dst, "stage").copy(dst, "out", r * c + j)
        Check()
    return prog


@st.composite
def allreduce_programs(draw):
    n, c = draw(st.integers(2, 4)), draw(st.integers(1, 2))
    with GC3Program("rand_allreduce", AllReduce(n, c * n, inplace=True)) as prog:
        for j in range(c * n):
            order = draw(st.permutations(range(n)))
            acc = chunk(order[0], "in", j)
            for r in order[1:]:
                acc = chunk(r, "in", j).reduce(acc)
            holders = [order[-1]]
            for r in draw(st.permutations(order[:-1])):
                # broadcast the sum from any rank that already has it
                src = holders[draw(st.integers(0, len(holders) - 1))]
                chunk(src, "in", j).copy(r, "in", j)
                holders.append(r)
        Check()
    return prog


@st.composite
def alltoall_programs(draw):
    n = draw(st.integers(2, 4))
    with GC3Program("rand_alltoall", AllToAll(n, 1, inplace=False)) as prog:
        for src in range(n):
            for dst in range(n):
                path = _route(draw, n, src, dst)
                ref = chunk(src, "in", dst)
                for hop in path[1:-1]:
                    ref = ref.copy(hop, f"relay{src}")
                ref.copy(dst, "out", src)
        Check()
    return prog


@st.composite
def staged_allreduce_programs(draw):
    """Reductions staged through ONE reused scratch slot per rank (false
    dependencies between chunks sharing a connection), some in parallelize."""
    n, c = draw(st.integers(2, 5)), draw(st.integers(1, 2))
    with GC3Program("rand_staged", AllReduce(n, c * n, inplace=True)) as prog:
        for j in range(c * n):
            order = draw(st.permutations(range(n)))
            with parallelize(draw(st.sampled_from([1, 2]))):
                acc = chunk(order[0], "in", j)
                for r in order[1:]:
                    if draw(st.booleans()):
                        acc = chunk(r, "in", j).reduce(acc.copy(r, "tmp", 0))
                    else:
                        acc = chunk(r, "in", j).reduce(acc)
            for r in order[:-1]:
                copied = acc.copy(r, "in", j)
                if draw(st.booleans()):
                    acc = copied            # a chain; otherwise a star from the same holder
        Check()
    return prog


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.one_of(allgather_programs(), allreduce_programs(), alltoall_programs(),
                         staged_allreduce_programs()),
       instances=st.integers(1, 3), fused=st.booleans(), proto=st.sampled_from(["Simple", "LL", "LL128"]))
def test_random_programs_lower_verify_round_trip_and_simulate(program, instances, fused, proto):
    prog = lower(program, instances=instances, instr_fusion=fused, protocol=proto)
    verify(prog)
    text = to_xml(prog)
    assert from_xml(text) == prog and to_xml(from_xml(text)) == text
    n = prog.ngpus
    for count in (n * 5, n * prog.nchunksperloop * 2 + n):
        res = simulate(prog, count=count, dtype="int32")
        assert res.ok, res.errors[:3]


def _instruction_graph(program):
    import networkx as nx
    from gc3.compiler.instruction_dag import build_instr_dag
    from gc3.compiler.buffers import plan_buffers

    dag = build_instr_dag(program.chunk_dag, plan_buffers(program.chunk_dag, 1))
    g = nx.DiGraph()
    g.add_nodes_from(range(len(dag.instrs)))
    g.add_edges_from((u, v) for u, vs in enumerate(dag.succs) for v in vs)
    g.add_edges_from((u, v) for u, v in enumerate(dag.send_to) if v >= 0)
    return dag, g


@settings(max_examples=25, deadline=None)
@given(program=st.one_of(allgather_programs(), allreduce_programs(), alltoall_programs()))
def test_every_chunk_dag_edge_is_kept_by_the_instruction_dag(program):
    import networkx as nx

    dag, g = _instruction_graph(program)
    of_op = {}
    for x in dag.instrs:
        of_op.setdefault(x.ops[0].id, []).append(x.id)
    closure = nx.transitive_closure_dag(g)
    cd = program.chunk_dag.graph
    for u, v in cd.edges:
        if cd.nodes[u].get("kind") == "source":
            continue
        assert any(closure.has_edge(a, b) for a in of_op[u] for b in of_op[v]), (cd.nodes[u]["op"], cd.nodes[v]["op"])


@st.composite
def arbitrary_programs(draw):
    """Any sequence of copies and reduces between random slots (not a valid
    collective): the trace itself, interpreted on numpy, is the reference."""
    n, c = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    trace = []
    with GC3Program("rand_any", AllReduce(n, c, inplace=False)) as prog:
        have = [(r, "i", j) for r in range(n) for j in range(c)]
        for _ in range(draw(st.integers(1, 12))):
            with parallelize(draw(st.sampled_from([1, 1, 2, 3]))):
                src = draw(st.sampled_from(have))
                ch = draw(st.sampled_from([None, None, 0, 1]))
                if draw(st.booleans()):
                    buf = draw(st.sampled_from(["o", "sc", "tmp", "i"]))
                    dst = (draw(st.integers(0, n - 1)), buf, draw(st.integers(0, c - 1)))
                    if dst == src:
                        continue
                    chunk(*src).copy(*dst, ch=ch)
                    if dst not in have:
                        have.append(dst)
                    trace.append(("copy", src, dst))
                else:
                    dst = draw(st.sampled_from(have))
                    if dst == src:
                        continue
                    chunk(*dst).reduce(chunk(*src), ch=ch)
                    trace.append(("reduce", src, dst))
        for r in range(n):
            for j in range(c):
                src = draw(st.sampled_from(have))
                if src != (r, "o", j):
                    chunk(*src).copy(r, "o", j)
                    trace.append(("copy", src, (r, "o", j)))
                    have.append((r, "o", j))
    return prog, trace


def _interpret(trace, inputs, n, c):
    u = len(inputs[0]) // c
    mem = {(r, "i", j): inputs[r][j * u:(j + 1) * u] for r in range(n) for j in range(c)}
    for kind, src, dst in trace:
        mem[dst] = mem[src] if kind == "copy" else mem[dst] + mem[src]
    return [np.concatenate([mem[(r, "o", j)] for j in range(c)]) for r in range(n)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=arbitrary_programs(), fused=st.booleans(), unit=st.sampled_from([6, 12]),
       interleave=st.sampled_from([None, 3]))
def test_any_traced_program_computes_what_its_trace_says(case, fused, unit, interleave):
    from gc3.errors import ScheduleError

    (program, trace), n, c = case, case[0].collective.num_ranks, case[0].collective.chunk_factor
    try:
        prog = lower(program, instr_fusion=fused)
    except ScheduleError:
        # only the user's channel hints may make a program unschedulable
        assert any(op.ch is not None for op in program.ops)
        return
    verify(prog, semantics=False)  # an arbitrary trace implements no collective
    rng = np.random.default_rng(unit)
    inputs = [rng.integers(-50, 50, c * unit).astype(np.int64) for _ in range(n)]
    res = simulate(prog, count=c * unit, dtype="int64", inputs=inputs,
                   reference=_interpret(trace, inputs, n, c), interleave_seed=interleave)
    assert res.ok, (trace, res.errors[:3])
