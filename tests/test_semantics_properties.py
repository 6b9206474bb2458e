"""`gc3 check` against `gc3 simulate` on thousands of IR variants.

* Mutants (one random change of a valid IR: an offset +-1, a buffer swapped, a
  reduction turned into a copy, a count changed, a dependency dropped, two
  steps swapped): whenever check accepts one, simulate must find it right at an
  uneven and an even call size, with no race and no deadlock.
* Rewrites that keep the meaning (threadblocks or channels renumbered, a nop
  added, independent steps swapped): check must still accept every one, so a
  checker that rejects whatever looks unfamiliar fails here.

Seeded, so a failure names the sample and the mutation and reproduces.
"""
import random
from pathlib import Path

import pytest

from gc3.errors import GC3Error
from gc3.ir.layout import layout_for
from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script
from gc3.simulator import simulate
from gc3.verify import verify
from gc3.ir.xml_io import read_xml

from ir_mutations import REWRITES, mutate

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["broadcast_tree_8r_LL", "reducescatter_ring_4r_inplace_Simple", "allgather_ring_4r_Simple",
         "alltoall_direct_4r_LL", "reduce_ring_8r_Simple", "broadcast_ring_8r_Simple",
         "reducescatter_recursive_halving_8r_Simple", "allreduce_oneshot_4r_LL", "allreduce_ring_4r_inplace_Simple_i2",
         "allgather_recursive_doubling_8r_Simple", "allreduce_allpairs_4r_LL", "allreduce_recursive_doubling_8r_Simple",
         "allgather_direct_8r_inplace_Simple", "alltoall_three_step_2x4_Simple", "alltoall_two_step_2x4_LL",
         "allreduce_hierarchical_2x4_Simple"]
MUTANTS = 2000
REWRITTEN = 500


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    from test_semantics import CUSTOM
    progs = [(name, read_xml(ROOT / "ir_samples" / f"{name}.xml")) for name in SMALL]
    progs += [(p.name, read_xml(p)) for p in sorted((ROOT / "tests" / "data" / "msccl").glob("*.xml"))]
    progs.append(("alltonext_2x2", lower(run_script(ROOT / "gc3" / "algorithms" / "alltonext.py", ["2", "2"]))))
    custom = tmp_path_factory.mktemp("custom") / "pairsums.py"
    custom.write_text(CUSTOM)
    # checked by simulate against the postcondition its XML carries
    progs.append(("pairsums (custom)", lower(run_script(custom))))
    for name, prog in progs:
        verify(prog)          # the originals are right
    return progs


def sizes(prog):
    """An uneven call size (short chunks in every block) and an even one."""
    L = layout_for(prog, 0)
    per_block = L.chunks_per_block
    return L.blocks_in * (3 * per_block + 1), L.blocks_in * 2 * per_block


def test_check_accepting_a_mutant_means_simulate_finds_it_right(programs):
    rng = random.Random(14)
    accepted = rejected = 0
    for _ in range(MUTANTS):
        name, prog = rng.choice(programs)
        mutant, what = mutate(prog, rng)
        try:
            verify(mutant)
        except GC3Error:
            rejected += 1
            continue
        accepted += 1
        for count in sizes(prog):
            try:
                res = simulate(mutant, count=count)
                ok, why = res.ok, res.errors[:2]
            except GC3Error as exc:
                ok, why = False, [str(exc)]
            assert ok, f"check accepted {name} with {what}, but simulate at count={count} says {why}"
    # Both outcomes must occur, or the test proves nothing: most single changes are wrong,
    # some are harmless (a field the opcode does not read, a swap of independent steps).
    assert rejected > MUTANTS // 2 and accepted > 50, (accepted, rejected)


def test_meaning_preserving_rewrites_are_still_proven(programs):
    rng = random.Random(41)
    done = {k: 0 for k in REWRITES}
    checked = 0
    for i in range(REWRITTEN):
        name, prog = rng.choice(programs)
        kind = list(REWRITES)[i % len(REWRITES)]
        rewritten = REWRITES[kind](prog, rng)
        if rewritten is None:
            continue
        # two rewrites in a row, to reach layouts none of the originals has
        again = REWRITES[rng.choice(list(REWRITES))](rewritten, rng) or rewritten
        for p in (rewritten, again):
            try:
                verify(p)
            except GC3Error as exc:
                pytest.fail(f"{kind} of {name} changed nothing it computes, yet check says {type(exc).__name__}: {exc}")
            checked += 1
        done[kind] += 1
    assert checked >= REWRITTEN and all(done.values()), (checked, done)
