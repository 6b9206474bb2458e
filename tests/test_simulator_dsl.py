"""DSL programs, traced and lowered by gc3, execute correctly in the simulator."""
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3 import Check, GC3Program, chunk
from gc3.cli import main
from gc3.collectives import Broadcast, Reduce
from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.simulator import simulate

ALGOS = Path(__file__).parent.parent / "gc3" / "algorithms"
CASES = [("allreduce_ring.py", ["4"]), ("allgather_ring.py", ["4"]), ("alltoall_direct.py", ["4"]),
         ("allreduce_hierarchical.py", ["2", "2"])]


@pytest.fixture(scope="module")
def traced():
    return {name: run_script(ALGOS / name, args) for name, args in CASES}


@pytest.mark.parametrize("name", [c[0] for c in CASES])
@pytest.mark.parametrize("count", [16, 4 * 7, 4 * 1000 + 4])
def test_gc3program_is_lowered_and_simulated(traced, name, count):
    res = simulate(traced[name], count=count, dtype="float16", op="max")
    assert res.ok, res.summary()
    assert res.program.convention == "gc3"


@pytest.mark.parametrize("name", [c[0] for c in CASES])
@pytest.mark.parametrize("instances,protocol", [(2, "LL"), (3, "Simple")])
def test_lowering_options_stay_correct(traced, name, instances, protocol):
    prog = lower(traced[name], instances=instances, protocol=protocol)
    for count in (4 * 5, 4 * 64):
        res = simulate(prog, count=count, dtype="int32", op="sum", seed=count)
        assert res.ok, res.summary()


def test_cli_simulates_a_dsl_file_with_its_arguments():
    r = CliRunner().invoke(main, ["simulate", str(ALGOS / "allreduce_ring.py"), "4", "--size", "64K"])
    assert r.exit_code == 0, r.output
    assert "allreduce, 4 ranks" in r.output and "result     OK" in r.output


def _rooted(kind, n, root):
    with GC3Program(f"{kind.__name__}_root", kind(num_ranks=n, chunk_factor=2, inplace=False, root=root)) as prog:
        if kind is Broadcast:
            c = chunk(root, "in", 0, count=2).copy(root, "out", 0)
            for s in range(1, n):
                c = c.copy((root + s) % n, "out", 0)
        else:
            acc = chunk((root + 1) % n, "in", 0, count=2)
            for s in range(2, n + 1):
                acc = chunk((root + s) % n, "in", 0, count=2).reduce(acc)
            acc.copy(root, "out", 0)
        Check()
    return prog


@pytest.mark.parametrize("kind", [Broadcast, Reduce])
def test_simulating_a_dsl_program_checks_against_its_own_root(kind):
    prog = _rooted(kind, 5, 3)
    for count in (10, 7, 1):
        res = simulate(prog, count=count, op="max")
        assert res.ok, res.errors[:2]
    # an explicit root still wins (and is then wrong for this program)
    assert not simulate(prog, count=10, root=0).ok
