"""Compiled programs execute correctly: verified, then simulated on data vs numpy."""
import pytest

from gc3.compiler.pipeline import lower
from gc3.simulator import simulate
from gc3.verify import verify

from lower_programs import (allpairs_allreduce, chain_broadcast, exchange, hierarchical_allreduce,
                            ring_allgather, ring_allreduce, ring_reducescatter, two_step_alltoall)

PROGRAMS = {
    "ring_allreduce_4": lambda: ring_allreduce(4),
    "ring_allreduce_5": lambda: ring_allreduce(5),
    "allpairs_allreduce_3": lambda: allpairs_allreduce(3),
    "two_step_alltoall_2x3": lambda: two_step_alltoall(2, 3),
    "hierarchical_allreduce_2x3": lambda: hierarchical_allreduce(2, 3),
    "hierarchical_allreduce_3x2": lambda: hierarchical_allreduce(3, 2),
    "ring_allgather_3x2": lambda: ring_allgather(3, chunk_factor=2),
    "ring_allgather_inplace_4": lambda: ring_allgather(4, inplace=True),
    "ring_reducescatter_4": lambda: ring_reducescatter(4),
    "chain_broadcast_root2": lambda: chain_broadcast(4, root=2, chunks=3),
    "exchange_12": lambda: exchange(12),
}
_cache = {}


def program(name):
    if name not in _cache:
        _cache[name] = PROGRAMS[name]()
    return _cache[name]


def counts(prog):
    # Element counts per rank: whole multiples of every block, some of which
    # leave the last chunks of each block short (or empty).
    n = prog.ngpus
    return [n, n * 7, n * 97, n * prog.nchunksperloop * 3]


@pytest.mark.parametrize("instances", [1, 2])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiled_program_verifies_and_simulates_correctly(name, instances):
    traced = program(name)
    for fused in (True, False):
        prog = lower(traced, instances=instances, instr_fusion=fused)
        verify(prog)
        for count in counts(prog):
            res = simulate(prog, count=count, root=traced.collective.root or 0)
            assert res.ok, (fused, count, res.errors[:3])
            assert not res.warnings, res.warnings


@pytest.mark.parametrize("dtype, op", [("int32", "max"), ("bfloat16", "sum"), ("float64", "prod"),
                                       ("uint8", "min")])
def test_dtypes_and_ops(dtype, op):
    for name in ("ring_allreduce_5", "hierarchical_allreduce_2x3", "allpairs_allreduce_3"):
        prog = lower(program(name), instances=2)
        for count in counts(prog)[:3]:
            res = simulate(prog, count=count, dtype=dtype, op=op)
            assert res.ok, (name, count, res.errors[:3])


def test_three_instances_and_protocols():
    for proto in ("LL", "LL128"):
        prog = lower(program("two_step_alltoall_2x3"), instances=3, protocol=proto)
        verify(prog)
        for count in counts(prog):
            assert simulate(prog, count=count).ok


def test_simulator_catches_a_broken_schedule():
    # The check above can fail: dropping one dependency breaks the program.
    prog = lower(program("allpairs_allreduce_3"))
    dep = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.depid >= 0)
    dep.depid = dep.deps = -1
    res = simulate(prog, count=3 * 9 * 4)
    assert not res.ok
