"""Semantic verification (gc3/verify/semantics.py): the IR computes its collective."""
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import cli
from gc3.errors import (DeadlockError, DuplicateContributionError, PostconditionUnprovableError, RaceError,
                        SemanticError, UnwrittenReadError)
from gc3.simulator import simulate
from gc3.verify import verify
from gc3.ir.xml_io import from_xml, read_xml, to_xml

main = cli()   # gc3's CLI with the runtime's commands, installed or not

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "ir_samples").glob("*.xml")) + sorted((ROOT / "tests" / "data" / "msccl").glob("*.xml"))
SHARED = sorted(Path("/work/shared/msccl_xml_samples").glob("*.xml"))
HEAD = '<algo name="t" proto="Simple" nchannels="1" nchunksperloop="{c}" ngpus="2" coll="{coll}" inplace="0" gc3version="0.1.0">'


def ir(coll, gpus, c=1):
    """A 2-rank gc3-convention IR from {rank: [(send, recv, [step tuples])]} with i/o/s chunk counts."""
    lines = [HEAD.format(c=c, coll=coll)]
    for r, (ic, oc, sc, tbs) in gpus.items():
        lines.append(f'<gpu id="{r}" i_chunks="{ic}" o_chunks="{oc}" s_chunks="{sc}">')
        for t, (send, recv, steps) in enumerate(tbs):
            lines.append(f'<tb id="{t}" send="{send}" recv="{recv}" chan="0">')
            for k, (typ, sb, so, db, do, *dep) in enumerate(steps):
                depid, deps, hasdep = dep if dep else (-1, -1, 0)
                lines.append(f'<step s="{k}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
                             f'cnt="1" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')
            lines.append("</tb>")
        lines.append("</gpu>")
    lines.append("</algo>")
    return from_xml("\n".join(lines))


def allgather(extra0=(), extra1=()):
    """2-rank allgather: each rank copies its input to its own block and sends it to the other's."""
    def rank(r):
        return (1, 2, 1, [(1 - r, 1 - r, [("s", "i", 0, "i", 0), ("r", "o", 1 - r, "o", 1 - r)]),
                          (-1, -1, [("cpy", "i", 0, "o", r)])] + list(extra0 if r == 0 else extra1))
    return ir("allgather", {0: rank(0), 1: rank(1)})


@pytest.mark.parametrize("path", SAMPLES + SHARED, ids=lambda p: p.name)
def test_every_sample_is_proven(path):
    s = verify(read_xml(path))
    assert s.proven and s.proven > 0


def test_the_hand_written_allgather_is_proven():
    assert verify(allgather()).proven == 4


def test_hierarchical_allreduce_missing_one_reduction_is_rejected_naming_rank_chunk_and_writer():
    # An msccl-tools case: every send has its receive, one reduction is a plain receive.
    text = (ROOT / "ir_samples" / "allreduce_hierarchical_2x4_Simple.xml").read_text()
    bad = text.replace('<step s="6" type="rrc" srcbuf="i" srcoff="2"', '<step s="6" type="r" srcbuf="i" srcoff="2"', 1)
    assert bad != text
    prog = from_xml(bad)
    assert not simulate(prog, count=1000).ok
    with pytest.raises(SemanticError, match=r"rank \d+ output chunk o\[\d+\].*should hold .*missing in\(\d+,\d+\).*"
                                            r"last written by rank \d+ tb \d+ step \d+"):
        verify(prog)


def test_an_out_of_place_collective_may_not_write_its_input():
    prog = allgather(extra1=[(-1, -1, [("cpy", "i", 0, "i", 0)])])
    with pytest.raises(SemanticError, match=r"rank 1 tb 2 step 0 \(cpy\) writes i\[0:1\] on rank 1: an out-of-place"):
        verify(prog)


def test_reading_a_slot_nothing_wrote():
    prog = allgather(extra0=[(-1, -1, [("cpy", "s", 0, "s", 0)])])
    with pytest.raises(UnwrittenReadError, match=r"rank 0 tb 2 step 0 \(cpy\) reads s\[0\] on rank 0, which nothing"):
        verify(prog)


def test_a_contribution_reduced_twice():
    # Rank 1 adds its own input into the block it gathered from rank 0, twice.
    prog = allgather(extra1=[(-1, -1, [("cpy", "i", 0, "s", 0), ("re", "i", 0, "s", 0)])])
    with pytest.raises(DuplicateContributionError, match=r"rank 1 tb 2 step 1 \(re\) on rank 1 reduces in\(1,0\)"):
        verify(prog)


@pytest.mark.parametrize("late", [False, True])
def test_two_unordered_writers_are_rejected_whichever_runs_first(late):
    # A third threadblock of rank 1 also writes o[0].  Whether it runs before or
    # after the receive in one execution, the result depends on the interleaving.
    writer = (-1, -1, [("cpy", "i", 0, "o", 0)])
    prog = allgather(extra1=[writer])
    if late:   # make the rogue write the last one the verifier's own run does
        tbs = prog.gpus[1].threadblocks
        tbs.insert(0, tbs.pop())
        for i, tb in enumerate(tbs):
            tb.id = i
    with pytest.raises(RaceError, match=r"write/write race on rank 1 o\[0\]"):
        verify(prog)


def test_a_write_ordered_by_a_dependency_is_not_a_race():
    # The same second writer, but it waits for the receive (depid/deps) and writes
    # the value that is there anyway: ordered, so accepted.
    prog = allgather(extra1=[(-1, -1, [("cpy", "o", 0, "o", 0, 0, 1, 0)])])
    prog.gpus[1].threadblocks[0].steps[1].hasdep = True
    assert verify(prog).proven == 4


def test_a_read_racing_with_the_write_it_needs():
    # Rank 1 copies o[0] to scratch without waiting for the receive that fills it.
    prog = allgather(extra1=[(-1, -1, [("cpy", "i", 0, "s", 0), ("cpy", "o", 0, "s", 0)])])
    prog.gpus[1].s_chunks = 1
    with pytest.raises((RaceError, UnwrittenReadError)):
        verify(prog)


def test_deadlock_is_still_reported_first():
    prog = ir("allgather", {r: (1, 2, 0, [(1 - r, 1 - r, [("r", "o", 1 - r, "o", 1 - r), ("s", "i", 0, "i", 0)]),
                                         (-1, -1, [("cpy", "i", 0, "o", r)])]) for r in range(2)})
    with pytest.raises(DeadlockError):
        verify(prog)


# --- every call size -------------------------------------------------------------------
def parked_in_a_shorter_chunk(detour=True):
    """2-rank allgather with 2 chunks per block; rank 0 parks its input chunk 0 in
    o[1] (a chunk at in-block position 1, shorter for some sizes) and copies it
    to o[0] from there afterwards."""
    def rank(r):
        own = [("cpy", "i", 0, "o", 2 * r), ("cpy", "i", 1, "o", 2 * r + 1)]
        if r == 0 and detour:
            own = [("cpy", "i", 0, "o", 1), ("cpy", "o", 1, "o", 0), ("cpy", "i", 1, "o", 1)]
        p = 1 - r
        return (2, 4, 0, [(p, p, [("s", "i", 0, "i", 0), ("s", "i", 1, "i", 1), ("r", "o", 2 * p, "o", 2 * p),
                                  ("r", "o", 2 * p + 1, "o", 2 * p + 1)]), (-1, -1, own)])
    return ir("allgather", {0: rank(0), 1: rank(1)}, c=2)


def test_chunk_granularity_plus_the_tiling_rule_agree_with_simulate_on_odd_sizes():
    prog = parked_in_a_shorter_chunk()
    # Even sizes: both chunks are full and the detour is harmless ...
    assert simulate(prog, count=8).ok
    # ... odd sizes make chunk 1 shorter: the detour loses an element.
    assert not simulate(prog, count=7).ok
    with pytest.raises(SemanticError, match=r"rank 0 output chunk o\[0\].*truncated"):
        verify(prog)
    # Without the detour the program is proven, and simulate agrees at every small size.
    good = parked_in_a_shorter_chunk(detour=False)
    verify(good)
    for count in range(0, 13):
        assert simulate(good, count=count).ok, count


@pytest.mark.parametrize("name", ["allreduce_ring_4r_inplace_Simple_i2", "allgather_ring_8r_Simple_i2",
                                  "reducescatter_ring_4r_inplace_Simple", "alltoall_three_step_2x4_Simple",
                                  "broadcast_tree_8r_LL"])
def test_proven_samples_are_right_at_odd_sizes(name):
    prog = read_xml(ROOT / "ir_samples" / f"{name}.xml")
    verify(prog)
    from gc3.ir.layout import layout_for
    blocks = layout_for(prog, 0).blocks_in
    for units in (1, 3, 7, 13, 101):
        assert simulate(prog, count=blocks * units, detect_races=False).ok, units


# --- postconditions travel with the IR --------------------------------------------------
def gc3(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_custom_collective_round_trips_its_postcondition(tmp_path):
    out = tmp_path / "atn.xml"
    r = gc3("compile", ROOT / "gc3" / "algorithms" / "alltonext.py", 2, 3, 2, "--instances", 2, "-o", out)
    assert r.exit_code == 0, r.output
    prog = read_xml(out)
    assert prog.postcondition and from_xml(to_xml(prog)).postcondition == prog.postcondition
    assert gc3("check", out).exit_code == 0
    # the postcondition is what is proven: change one term and the same schedule is wrong
    text = out.read_text()
    wrong = re.sub(r'(<term rank="2" out="0" src=")1"', r'\g<1>0"', text)
    assert wrong != text
    (tmp_path / "wrong.xml").write_text(wrong)
    r = gc3("check", tmp_path / "wrong.xml")
    assert r.exit_code == 1 and "SemanticError" in r.output and "rank 2 output chunk o[0]" in r.output
    # without it, check cannot prove anything: a distinct status
    (tmp_path / "bare.xml").write_text(re.sub(r"\s*<postcondition>.*</postcondition>", "", text, flags=re.S))
    r = gc3("check", tmp_path / "bare.xml")
    assert r.exit_code == 3 and "cannot be proven" in r.output and "Traceback" not in r.output
    with pytest.raises(PostconditionUnprovableError):
        verify(read_xml(tmp_path / "bare.xml"))


# MSCCL's runtime reads algorithm XML with a small hand-written parser: fixed
# element names, at most 16 attributes of at most 255 characters per element
# (NCCL's xml.h bounds), no namespaces, and it looks for <gpu> children of
# <algo> by name, so other children are skipped.
MSCCL_ELEMENTS = {"algo": None, "gpu": "algo", "tb": "gpu", "step": "tb"}


def msccl_reader_accepts(text):
    from lxml import etree
    root = etree.fromstring(text.encode())
    assert root.tag == "algo"
    skipped = 0
    for el in root.iter():
        if not isinstance(el.tag, str):
            continue
        assert ":" not in el.tag and "}" not in el.tag
        assert len(el.attrib) <= 16 and all(len(v) <= 255 and ":" not in k for k, v in el.attrib.items())
        parent = el.getparent()
        if el.tag in MSCCL_ELEMENTS and (parent is None or parent.tag == MSCCL_ELEMENTS[el.tag]):
            continue
        # anything else must sit inside a child of <algo> the reader skips as a whole
        top = el
        while top.getparent() is not root:
            top = top.getparent()
        assert top.tag not in MSCCL_ELEMENTS
        skipped += 1
    return skipped


# The fused samples (gemm steps, fused="1") are gc3's extension: MSCCL would refuse them anyway.
@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "ir_samples").glob("*.xml")
                                        if 'fused="1"' not in p.read_text().split("\n", 1)[0]),
                         ids=lambda p: p.name)
def test_communication_only_xml_satisfies_msccls_reader(path):
    assert msccl_reader_accepts(path.read_text()) == 0


def test_a_custom_collectives_postcondition_is_skipped_by_msccls_reader(tmp_path):
    out = tmp_path / "atn.xml"
    assert gc3("compile", ROOT / "gc3" / "algorithms" / "alltonext.py", 3, 2, "-o", out).exit_code == 0
    assert msccl_reader_accepts(out.read_text()) > 0


def test_compile_refuses_a_collective_without_postcondition(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(textwrap.dedent("""
        from gc3 import GC3Program, chunk
        from gc3.collectives import Collective
        with GC3Program("p", Collective(2, 1)):
            chunk(0, "in", 0).copy(1, "out", 0)
    """))
    r = gc3("compile", prog, "-o", tmp_path / "p.xml")
    assert r.exit_code != 0 and "defines no postcondition" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "p.xml").exists()


def test_compile_refuses_a_wrong_program_that_never_calls_check(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(textwrap.dedent("""
        from gc3 import GC3Program, chunk
        from gc3.collectives import AllGather
        with GC3Program("p", AllGather(2, 1)):
            chunk(0, "in", 0).copy(1, "out", 0)
            chunk(0, "in", 0).copy(0, "out", 0)
            chunk(1, "in", 0).copy(1, "out", 1)
    """))
    r = gc3("compile", prog, "-o", tmp_path / "p.xml")
    assert r.exit_code == 1 and "PostconditionError" in r.output and "rank 0, 'o', 1" in r.output
    assert not (tmp_path / "p.xml").exists()


def test_a_step_over_overlapping_different_chunks_is_rejected():
    prog = allgather(extra0=[(-1, -1, [("cpy", "i", 0, "s", 0), ("cpy", "s", 0, "s", 1)])])
    prog.gpus[0].s_chunks = 3
    verify(prog)
    prog.gpus[0].threadblocks[2].steps[1].cnt = 2      # s[0:2] -> s[1:3]
    with pytest.raises(SemanticError, match=r"reads s\[0:2\] and writes s\[1:3\], which overlap"):
        verify(prog)


def test_a_broadcast_may_not_read_a_non_root_input():
    # NCCL reads only the root's send buffer; elsewhere it may be anything (even NULL).
    def rank(r, extra=()):
        if r == 0:
            return (1, 1, 0, [(1, -1, [("s", "i", 0, "i", 0)]), (-1, -1, [("cpy", "i", 0, "o", 0)])])
        return (1, 1, 1, [(-1, 0, [("r", "o", 0, "o", 0)])] + list(extra))
    assert verify(ir("broadcast", {0: rank(0), 1: rank(1)})).proven == 2
    peek = [(-1, -1, [("cpy", "i", 0, "s", 0)])]
    with pytest.raises(UnwrittenReadError, match=r"rank 1 tb 1 step 0 \(cpy\) reads i\[0\] on rank 1"):
        verify(ir("broadcast", {0: rank(0), 1: rank(1, peek)}))


def test_gc3_run_refuses_an_unproven_ir_before_looking_for_a_gpu(tmp_path):
    text = (ROOT / "ir_samples" / "allreduce_ring_4r_inplace_Simple_i2.xml").read_text()
    bad = tmp_path / "bad.xml"
    bad.write_text(text.replace('type="rrcs"', 'type="rcs"', 1))
    r = gc3("run", bad)
    assert r.exit_code == 1 and "SemanticError" in r.output and "needs a CUDA GPU" not in r.output


CUSTOM = '''
from gc3 import GC3Program, chunk, Check
from gc3.collectives import Collective, input_chunk, reduction

class PairSums(Collective):
    """Rank r's output: the sum of rank r's and rank r+1's inputs (a custom collective)."""
    name = "pairsums"
    def postcondition(self, rank, index):
        return reduction([input_chunk(rank, index), input_chunk((rank + 1) % self.num_ranks, index)])

N = 3
with GC3Program("pairsums", PairSums(N, 2), instances=2):
    for r in range(N):
        c = chunk((r + 1) % N, "in", 0, 2).copy(r, "out", 0)
        c.reduce(chunk(r, "in", 0, 2))
    Check()
'''


def test_simulate_checks_a_custom_collective_against_the_postcondition_in_its_xml(tmp_path):
    src = tmp_path / "pairsums.py"
    src.write_text(CUSTOM)
    out = tmp_path / "p.xml"
    r = gc3("compile", src, "-o", out)
    assert r.exit_code == 0, r.output
    for count in (8, 13):
        res = simulate(read_xml(out), count=count)
        assert res.ok and res.wrong == 0 and res.expected is not None, res.errors
    # The same schedule, told (in its XML) that rank 0 must also add rank 2's input:
    # check and simulate now both say it is wrong.
    text = out.read_text()
    wrong = text.replace('<term rank="0" out="0" src="0" in="0" cnt="4"/>',
                         '<term rank="0" out="0" src="0" in="0" cnt="4"/><term rank="0" out="0" src="2" in="0" cnt="4"/>')
    assert wrong != text
    prog = from_xml(wrong)
    with pytest.raises(SemanticError, match="rank 0 output chunk o\\[0\\].*missing in\\(2,0\\)"):
        verify(prog)
    assert not simulate(prog, count=13).ok
