"""The example algorithms trace and pass Check(); run_script and `gc3 trace`."""
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3 import Check, GC3Program, chunk, parallelize
from gc3.dsl.chunk_dag import depth
from gc3.cli import main
from gc3.dsl.collectives import AllToAll
from gc3.errors import GC3Error, UninitializedChunkError
from gc3.dsl.program import run_script
from gc3.dsl.topology import hierarchical

ALGOS = Path(__file__).resolve().parent.parent / "gc3" / "algorithms"


def kinds(prog):
    return Counter(("remote " if op.remote else "local ") + op.kind for op in prog.ops)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce(n):
    prog = run_script(ALGOS / "allreduce_ring.py", [str(n)])
    assert prog.collective.name == "allreduce" and prog.collective.inplace
    assert kinds(prog) == {"remote reduce": n * (n - 1), "remote copy": n * (n - 1)}
    assert depth(prog.chunk_dag) == 2 * (n - 1)
    assert prog.check()


@pytest.mark.parametrize("n, cf", [(2, 1), (4, 1), (5, 3)])
def test_ring_allgather(n, cf):
    prog = run_script(ALGOS / "allgather_ring.py", [str(n), str(cf)])
    assert kinds(prog) == {"local copy": n, "remote copy": n * (n - 1)}
    assert all(op.src.count == cf for op in prog.ops)
    assert depth(prog.chunk_dag) == n
    assert prog.check()


@pytest.mark.parametrize("n, cf", [(2, 1), (4, 2), (7, 1)])
def test_direct_alltoall(n, cf):
    prog = run_script(ALGOS / "alltoall_direct.py", [str(n), str(cf)])
    assert kinds(prog) == {"local copy": n, "remote copy": n * (n - 1)}
    assert depth(prog.chunk_dag) == 1
    assert prog.check()


@pytest.mark.parametrize("nodes, gpus", [(2, 2), (2, 4), (3, 2), (1, 3)])
def test_hierarchical_allreduce_with_parallelize(nodes, gpus):
    prog = run_script(ALGOS / "allreduce_hierarchical.py", [str(nodes), str(gpus)])
    assert prog.topology.gpus_per_node == gpus and prog.num_ranks == nodes * gpus
    assert prog.check()
    groups = Counter((op.parallel_group, op.parallel) for op in prog.ops)
    intra = nodes * gpus * (gpus - 1)       # per phase: every GPU does G-1 block steps
    inter = gpus * nodes * (nodes - 1) * 2
    assert groups == {k: v for k, v in {(0, nodes): intra, (None, 1): inter, (1, nodes): intra}.items() if v}
    same_node = {op.src.rank // gpus == op.dst.rank // gpus for op in prog.ops if op.parallel_group is not None}
    assert same_node <= {True}               # parallelized phases stay inside a node
    assert depth(prog.chunk_dag) == 2 * (gpus - 1) + 2 * (nodes - 1)


def test_paper_two_step_alltoall_with_tuple_ranks():
    """GC3 paper's two-step AllToAll: gather cross-node chunks on the peer GPU, one IB copy per pair."""
    N, G = 2, 3
    with GC3Program("alltoall_two_step", AllToAll(N * G, 1, False), topology=hierarchical(N, G)) as prog:
        for n1 in range(N):
            for g1 in range(G):
                for n2 in range(N):
                    for g2 in range(G):
                        src = chunk((n1, g1), "in", (n2, g2))
                        if n1 == n2:
                            src.copy((n2, g2), "out", (n1, g1))
                        else:       # stage on the GPU with the same local index, then one network hop
                            staged = src.copy((n1, g2), f"x{n2}", g1)
                            staged.copy((n2, g2), "out", (n1, g1))
        Check()
    assert prog.ops[0].src.rank == 0 and prog.ops[-1].dst.rank == N * G - 1
    remote_inter = [op for op in prog.ops if op.src.rank // G != op.dst.rank // G]
    assert all(op.src.rank % G == op.dst.rank % G for op in remote_inter)
    assert prog.scratch_sizes[0] == {"x1": G}


def test_tuple_index_is_node_times_gpus_plus_local():
    with GC3Program("t", AllToAll(4, 1, False), topology=hierarchical(2, 2)) as prog:
        ref = chunk((1, 0), "in", (1, 1))
        assert (ref.rank, ref.index) == (2, 3)
        ref.copy((0, 1), "out", (1, 0))
    assert (prog.ops[0].dst.rank, prog.ops[0].dst.index) == (1, 2)


def test_parallelize_marks_only_ops_inside():
    with GC3Program("t", AllToAll(2, 1, False)) as prog:
        chunk(0, "in", 0).copy(0, "out", 0)
        with parallelize(4):
            chunk(0, "in", 1).copy(1, "out", 0)
        with parallelize(2):
            chunk(1, "in", 0).copy(0, "out", 1)
        chunk(1, "in", 1).copy(1, "out", 1)
        Check()
    assert [(op.parallel, op.parallel_group) for op in prog.ops] == [(1, None), (4, 0), (2, 1), (1, None)]


def test_run_script_passes_argv_and_returns_last_program(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(
        "import sys\nfrom gc3 import GC3Program, chunk\nfrom gc3.collectives import AllGather\n"
        "for name in sys.argv[1:]:\n"
        "    with GC3Program(name, AllGather(2, 1, False)):\n"
        "        chunk(0, 'in', 0).copy(1, 'out', 0)\n")
    prog = run_script(script, ["first", "second"])
    assert prog.name == "second" and len(prog.ops) == 1


@pytest.mark.parametrize("body, needle", [
    ("x = 1\n", "traced no GC3Program"),
    ("import sys\nsys.exit(3)\n", "exited with status 3"),
])
def test_run_script_errors(tmp_path, body, needle):
    script = tmp_path / "bad.py"
    script.write_text(body)
    with pytest.raises(GC3Error) as err:
        run_script(script, [])
    assert needle in str(err.value)
    with pytest.raises(GC3Error):
        run_script(tmp_path / "missing.py", [])


def test_run_script_propagates_trace_errors_with_the_script_line(tmp_path):
    script = tmp_path / "uninit.py"
    script.write_text(
        "from gc3 import GC3Program, chunk\nfrom gc3.collectives import AllGather\n"
        "with GC3Program('u', AllGather(2, 1, False)):\n"
        "    chunk(1, 'out', 1)\n")
    with pytest.raises(UninitializedChunkError) as err:
        run_script(script, [])
    assert "uninit.py:4:" in str(err.value) and "(rank 1, 'o', 1)" in str(err.value)


def test_cli_trace_prints_summary():
    result = CliRunner().invoke(main, ["trace", str(ALGOS / "allreduce_ring.py"), "4"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ranks        4 " in out
    assert "operations   24: local copy 0, remote copy 12, local reduce 0, remote reduce 12" in out
    assert "DAG depth    6" in out
    assert "chunks       input 4, output 4" in out
    assert "check        passed" in out


def test_cli_trace_hierarchical_shows_parallel_blocks_and_draws_dag(tmp_path):
    png = tmp_path / "dag.png"
    result = CliRunner().invoke(main, ["trace", str(ALGOS / "allreduce_hierarchical.py"), "2", "2", "--dag", str(png)])
    assert result.exit_code == 0, result.output
    assert "block 0 x2, block 1 x2" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_trace_reports_a_failing_check(tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text(
        "from gc3 import GC3Program, chunk\nfrom gc3.collectives import AllGather\n"
        "with GC3Program('w', AllGather(2, 1, False)):\n"
        "    chunk(0, 'in', 0).copy(1, 'out', 0)\n")
    result = CliRunner().invoke(main, ["trace", str(script)])
    assert result.exit_code == 1
    assert "PostconditionError" in result.output and "(rank 0, 'o', 0)" in result.output


def test_msccl_tools_spellings_port_unchanged():
    """Buffer enum, size=, -1 defaults, scratch appends, reduce without reassignment."""
    from gc3.dsl.collectives import AllReduce
    from gc3.dsl.program import Buffer

    n = 3
    with GC3Program("allpairs", AllReduce(n, n * n, True), instances=2, protocol="LL") as prog:
        for r1 in range(n):
            for r2 in range(n):
                if r1 != r2:
                    chunk(r1, Buffer.input, r2 * n, size=n).copy(r2, "scratch", sendtb=r2, recvtb=r1, ch=-1)
        for r in range(n):
            for k in range(n * (n - 1)):
                c = chunk(r, Buffer.input, r * n + k % n)
                c.reduce(chunk(r, "scratch", k), sendtb=k % n)
        for r1 in range(n):
            for r2 in range(n):
                if r1 != r2:
                    chunk(r1, Buffer.input, r1 * n, n).copy(r2, Buffer.input, r1 * n, sendtb=r2, recvtb=r1)
        assert Check()
    assert prog.scratch_sizes == {r: {"s": n * (n - 1)} for r in range(n)}
    assert (prog.instances, prog.protocol) == (2, "LL")
    first = prog.ops[0]
    assert (first.sendtb, first.recvtb, first.ch, first.dst) == (1, 0, None, first.dst.__class__(1, "s", 0, n))


@pytest.mark.parametrize("args, needle", [(["four"], "argument ranks must be an int, got 'four'"),
                                          (["4", "1", "1", "1", "9"],
                                           "expected at most 4 arguments (ranks instances channels inplace)")])
def test_cli_trace_rejects_bad_program_arguments(args, needle):
    result = CliRunner().invoke(main, ["trace", str(ALGOS / "allreduce_ring.py"), *args])
    assert result.exit_code == 2 and needle in result.output, result.output
