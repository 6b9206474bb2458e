"""Every program of gc3.algorithms (not the fused ones): traces and passes Check for several rank counts
(non-powers of two wherever the algorithm allows), has the step count and link
traffic its docstring states, compiles, passes gc3.verify, and computes the
collective on data (numpy reference) for uneven sizes, several dtypes and ops,
instance counts and protocols."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gc3 import algorithms
from gc3.cli import main as cli
from gc3.dtypes import OPS
from gc3.errors import GC3Error, TraceError
from gc3.ir.layout import blocks_of
from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.simulator import simulate
from gc3.verify import verify

ALGOS = Path(__file__).resolve().parent.parent / "gc3" / "algorithms"
REDUCING = {"allreduce", "reducescatter", "reduce"}

# algorithm -> argument lists; each is traced, checked, compiled with every
# schedule variant, verified and simulated.
CONFIGS = {
    "allreduce_ring": [(2,), (3,), (5, 1, 3), (8,), (4, 2, 2)],
    "allreduce_allpairs": [(2,), (3, 2), (5,), (8,)],
    "allreduce_recursive_doubling": [(2,), (4,), (16,), (8,)],
    "allreduce_oneshot": [(2,), (3, 2), (6,), (5,)],
    "allreduce_hierarchical": [(1, 3), (3, 2), (2, 3), (2, 4)],
    "allgather_ring": [(2,), (5, 2), (6,)],
    "allgather_direct": [(2,), (3, 2, 1), (7,), (6, 1, 0)],
    "allgather_recursive_doubling": [(2,), (4, 2, 1), (16,), (8,)],
    "reducescatter_ring": [(2,), (3, 2, 1), (7,), (6, 1, 0)],
    "reducescatter_direct": [(2,), (3, 1, 1), (7, 2), (5,)],
    "reducescatter_recursive_halving": [(2,), (4, 2, 1), (16,), (8,)],
    "alltoall_direct": [(2,), (5, 2), (3,)],
    "alltoall_two_step": [(1, 3), (4, 1), (3, 3, 2), (2, 3)],
    "alltoall_three_step": [(1, 3), (5, 2), (4, 3), (3, 2, 2)],
    "alltonext": [(1, 4), (2, 1), (4, 2, 2), (3, 3)],
    "broadcast_ring": [(2,), (3, 1, 2, 1), (7, 3, 4), (5, 2, 3)],
    "broadcast_tree": [(2,), (6, 3, 0, 1), (13, 1, 12), (7, 2, 3)],
    "reduce_ring": [(2,), (3, 1, 2, 1), (7, 3, 4), (5, 2, 3)],
}


def log2(n):
    return n.bit_length() - 1


# Communication steps (remote operations on the longest data-flow chain), as
# each program's docstring states them, from its argument list.
STEPS = {
    "allreduce_ring": lambda n, *_: 2 * (n - 1),
    "allreduce_allpairs": lambda n, *_: 2,
    "allreduce_recursive_doubling": lambda n: 2 * log2(n),
    "allreduce_oneshot": lambda n, *_: 1,
    "allreduce_hierarchical": lambda N, G, *_: 2 * (G - 1) + 2 * (N - 1),
    "allgather_ring": lambda n, *_: n - 1,
    "allgather_direct": lambda n, *_: 1,
    "allgather_recursive_doubling": lambda n, *_: log2(n),
    "reducescatter_ring": lambda n, *_: n - 1,
    "reducescatter_direct": lambda n, *_: 1,
    "reducescatter_recursive_halving": lambda n, *_: log2(n),
    "alltoall_direct": lambda n, *_: 1,
    "alltoall_two_step": lambda N, G, *_: 1 if N == 1 or G == 1 else 2,
    "alltoall_three_step": lambda N, G, *_: 1 if N == 1 else (3 if G > 1 else 1),
    "alltonext": lambda N, G, *_: 1 if N == 1 or G == 1 else (2 if G == 2 else 3),
    "broadcast_ring": lambda n, *_: n - 1,
    "broadcast_tree": lambda n, *_: log2(n),
    "reduce_ring": lambda n, *_: n - 1,
}


def trace(name, args):
    return run_script(ALGOS / f"{name}.py", [str(a) for a in args])


def remote_steps(prog) -> int:
    """Remote ops on the longest chain of true (data-flow) dependencies."""
    dag = prog.chunk_dag.graph
    flow = nx.DiGraph([(a, b) for a, b, kind in dag.edges(data="kind") if kind == "true"])
    flow.add_nodes_from(dag.nodes)
    longest = {}
    for node in nx.topological_sort(flow):
        op = dag.nodes[node].get("op")
        here = 1 if op is not None and op.remote else 0
        longest[node] = here + max((longest[p] for p in flow.predecessors(node)), default=0)
    return max(longest.values(), default=0)


def traffic(prog) -> Counter:
    """Chunks carried per directed link (src rank, dst rank)."""
    load = Counter()
    for op in prog.ops:
        if op.remote:
            load[(op.src.rank, op.dst.rank)] += op.src.count
    return load


CASES = [(name, args) for name, configs in CONFIGS.items() for args in configs]
CASE_IDS = [f"{n}-{'-'.join(map(str, a))}" for n, a in CASES]


@pytest.mark.parametrize("name, args", CASES, ids=CASE_IDS)
def test_traces_checks_and_takes_the_documented_steps(name, args):
    prog = trace(name, args)
    assert prog.check()
    assert remote_steps(prog) == STEPS[name](*args)


def test_every_algorithm_file_is_covered_and_documented():
    files = set(algorithms.names())
    assert files == {p.stem for p in ALGOS.glob("[!_]*.py")} == set(CONFIGS)
    for stem in files:
        doc = ast.get_docstring(ast.parse((ALGOS / f"{stem}.py").read_text()))
        assert doc, stem
        for part in ("Parameters:", "Intended sizes:", "Cost:"):
            assert part in doc, f"{stem}.py docstring lacks {part!r}"


# --- link traffic as the docstrings state it ------------------------------------------


def test_allpairs_allreduce_each_link_carries_two_blocks():
    n, c = 5, 2
    prog = trace("allreduce_allpairs", (n, c))
    assert traffic(prog) == {(a, b): 2 * c for a in range(n) for b in range(n) if a != b}


def test_recursive_doubling_allreduce_sends_2_n_minus_1_over_n_per_rank():
    n = 8
    prog = trace("allreduce_recursive_doubling", (n,))
    sent = Counter()
    for (src, dst), chunks in traffic(prog).items():
        assert bin(src ^ dst).count("1") == 1          # partners differ in one bit
        sent[src] += chunks
    assert set(sent.values()) == {2 * (n - 1)}           # of n chunks: 2(n-1)/n of the buffer
    load = traffic(prog)
    assert load[(0, n // 2)] == n and load[(0, 1)] == 2   # n/2 chunks each phase in round 1, 1 in the last


def test_ring_reducescatter_uses_only_ring_links():
    n, c = 6, 2
    prog = trace("reducescatter_ring", (n, c))
    assert traffic(prog) == {(r, (r + 1) % n): (n - 1) * c for r in range(n)}


def test_two_step_alltoall_coalesces_one_network_send_per_node_pair_and_gpu():
    N, G, c = 3, 4, 2
    prog = trace("alltoall_two_step", (N, G, c))
    cross = [op for op in prog.ops if op.src.rank // G != op.dst.rank // G]
    assert len(cross) == N * (N - 1) * G
    assert all(op.src.count == G * c and op.src.rank % G == op.dst.rank % G for op in cross)


def test_three_step_alltoall_sends_one_network_message_per_node_pair():
    N, G, c = 4, 3, 1
    prog = trace("alltoall_three_step", (N, G, c))
    cross = [op for op in prog.ops if op.src.rank // G != op.dst.rank // G]
    pairs = Counter((op.src.rank // G, op.dst.rank // G) for op in cross)
    assert pairs == {(a, b): 1 for a in range(N) for b in range(N) if a != b}
    assert {op.src.count for op in cross} == {G * G * c}
    # the pair n1 -> n2 leaves from GPU n2 mod G and arrives at GPU n1 mod G: spread over the NICs
    assert {(op.src.rank, op.dst.rank) for op in cross} == {
        (a * G + b % G, b * G + a % G) for a in range(N) for b in range(N) if a != b}


def test_alltonext_spreads_the_network_hop_over_every_gpu():
    N, G, c = 3, 4, 2
    prog = trace("alltonext", (N, G, c))
    for n in range(N - 1):
        cross = {(src, dst): chunks for (src, dst), chunks in traffic(prog).items()
                 if src // G == n and dst // G == n + 1}
        assert cross == {(n * G + g, (n + 1) * G + g): c for g in range(G)}


def test_ring_allreduce_runs_one_logical_ring_per_channel():
    prog = trace("allreduce_ring", (5, 1, 3))
    assert {op.ch for op in prog.ops} == {0, 1, 2}
    assert traffic(prog) == {(r, (r + 1) % 5): 3 * 2 * 4 for r in range(5)}
    assert lower(prog).nchannels == 3
    assert lower(prog, instances=2).nchannels == 6


def test_broadcast_tree_root_sends_to_two_children():
    n, root = 7, 3
    prog = trace("broadcast_tree", (n, 1, root))
    assert sorted(dst for (src, dst) in traffic(prog) if src == root) == sorted([(root + 1) % n, (root + 2) % n])


def test_out_of_place_programs_never_write_the_users_input():
    for name, args in [("reducescatter_ring", (5, 2)), ("reducescatter_recursive_halving", (8,)),
                       ("reducescatter_direct", (3,)), ("reduce_ring", (4, 2, 1))]:
        prog = trace(name, args)
        assert not prog.collective.inplace
        assert [op for op in prog.ops if op.dst.buffer == "i"] == [], name


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["allreduce_recursive_doubling", "allgather_recursive_doubling",
                                  "reducescatter_recursive_halving"])
@pytest.mark.parametrize("n", [1, 6])
def test_recursive_algorithms_reject_non_powers_of_two(name, n):
    with pytest.raises(TraceError, match=f"power-of-two rank count >= 2, got {n}"):
        trace(name, (n,))


@pytest.mark.parametrize("name, args", [("reducescatter_ring", (1,)), ("reduce_ring", (1,)), ("alltonext", (1, 1))])
def test_algorithms_that_need_two_ranks_say_so(name, args):
    with pytest.raises(TraceError, match="needs at least 2 ranks, got 1"):
        trace(name, args)


def test_bad_program_arguments_name_the_argument():
    with pytest.raises(GC3Error, match="argument inplace must be an int, got 'yes'"):
        trace("allgather_direct", ("4", "1", "yes"))
    with pytest.raises(GC3Error, match="expected at most 3 arguments"):
        trace("alltoall_two_step", (2, 2, 1, 1))


# --- compile, verify, simulate ---------------------------------------------------------

# (instances, protocol) schedules every algorithm is compiled with
SCHEDULES = [(1, "Simple"), (2, "LL"), (3, "LL128")]
DTYPES = ["int32", "float32", "bfloat16"]


def element_counts(ir):
    """Input element counts: one element per block (most chunks empty), and two uneven sizes."""
    blocks, _ = blocks_of(ir.coll, ir.ngpus, ir.gpus[0].i_chunks, ir.gpus[0].o_chunks)
    return [blocks * k for k in (1, 37, 203)]


@pytest.mark.parametrize("name, args", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("instances, protocol", SCHEDULES, ids=[f"{p}x{i}" for i, p in SCHEDULES])
def test_compiles_verifies_and_simulates(name, args, instances, protocol):
    prog = trace(name, args)
    ir = lower(prog, instances=instances, protocol=protocol)
    assert (ir.coll, ir.ngpus, ir.inplace, ir.proto) == (prog.collective.name, prog.num_ranks,
                                                         prog.collective.inplace, protocol)
    verify(ir)
    ops = sorted(OPS) if ir.coll in REDUCING else ["sum"]
    root = prog.collective.root or 0
    for k, count in enumerate(element_counts(ir)):
        dtype = DTYPES[(k + instances) % len(DTYPES)]
        for op in ops:
            res = simulate(ir, count=count, dtype=dtype, op=op, root=root, seed=k)
            assert res.ok, f"{name}{args} x{instances} {protocol} count={count} {dtype} {op}: {res.errors[:2]}"
            assert not res.warnings, res.warnings


def _args(draw, name):
    """Arguments `name` accepts: any rank count >= 2 (powers of two where required), chunks, flags."""
    ints = st.integers
    if name in ("allreduce_hierarchical", "alltoall_two_step", "alltoall_three_step", "alltonext"):
        nodes = draw(ints(1, 3))
        gpus = draw(ints(2 if nodes == 1 else 1, 4))
        return (nodes, gpus) if name == "allreduce_hierarchical" else (nodes, gpus, draw(ints(1, 2)))
    power = "recursive" in name
    n = 2 ** draw(ints(1, 4)) if power else draw(ints(2, 9))
    if name in ("broadcast_ring", "broadcast_tree", "reduce_ring"):
        return n, draw(ints(1, 3)), draw(ints(0, n - 1)), draw(ints(0, 1))
    if name == "allreduce_ring":
        return n, 1, draw(ints(1, 2))
    if name == "allreduce_recursive_doubling":
        return (n,)
    if name.startswith(("allgather_direct", "allgather_recursive", "reducescatter")):
        return n, draw(ints(1, 2)), draw(ints(0, 1))
    return n, draw(ints(1, 2))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_configurations_compile_and_compute_the_collective(data):
    name = data.draw(st.sampled_from(sorted(CONFIGS)), label="algorithm")
    args = _args(data.draw, name)
    instances, protocol = data.draw(st.sampled_from(SCHEDULES), label="schedule")
    prog = trace(name, args)
    ir = lower(prog, instances=instances, protocol=protocol)
    verify(ir)
    blocks, _ = blocks_of(ir.coll, ir.ngpus, ir.gpus[0].i_chunks, ir.gpus[0].o_chunks)
    count = blocks * data.draw(st.integers(1, 300), label="elements per block")
    op = data.draw(st.sampled_from(sorted(OPS) if ir.coll in REDUCING else ["sum"]), label="op")
    res = simulate(ir, count=count, dtype=data.draw(st.sampled_from(DTYPES), label="dtype"), op=op,
                   root=prog.collective.root or 0)
    assert res.ok, res.errors[:2]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gc3_compile_and_simulate_each_program_with_its_defaults(name, tmp_path):
    out = tmp_path / f"{name}.xml"
    run = CliRunner().invoke(cli, ["compile", str(ALGOS / f"{name}.py"), "-o", str(out)])
    assert run.exit_code == 0, run.output
    assert "verified" in run.output and out.is_file()
    sim = CliRunner().invoke(cli, ["simulate", str(out), "--count", "840"])
    assert sim.exit_code == 0, sim.output
    assert "OK" in sim.output
