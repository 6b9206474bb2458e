"""`gc3 compile`: runs a program file, lowers, verifies, writes XML, summarises."""
import textwrap

from click.testing import CliRunner

from gc3.cli import main
from gc3.simulator import simulate
from gc3.ir.xml_io import read_xml

RING = textwrap.dedent("""
    import sys
    from lower_programs import ring_allreduce

    ring_allreduce(*map(int, sys.argv[1:]), protocol="LL")
""")


def run(*args):
    return CliRunner().invoke(main, ["compile", *map(str, args)], catch_exceptions=False)


def test_compile_writes_verified_xml_and_a_summary(tmp_path):
    src = tmp_path / "ring.py"
    src.write_text(RING)
    out = tmp_path / "ring.xml"
    res = run(src, 5, "-o", out)
    assert res.exit_code == 0, res.output
    prog = read_xml(out)
    assert (prog.name, prog.ngpus, prog.proto, prog.gc3version is not None) == ("allreduce_ring", 5, "LL", True)
    assert "5 ranks" in res.output and "verified" in res.output and str(out) in res.output
    assert "rrs" in res.output
    assert simulate(prog, count=5 * 11).ok


def test_options_override_the_program(tmp_path):
    src = tmp_path / "ring.py"
    src.write_text(RING)
    out = tmp_path / "ring.xml"
    res = run(src, 4, 2, "--instances", 3, "--protocol", "Simple", "--no-fusion", "-o", out)
    assert res.exit_code == 0, res.output
    prog = read_xml(out)
    assert (prog.proto, prog.nchannels, prog.gpu(0).i_chunks) == ("Simple", 3, 12)
    kinds = {st.type for g in prog.gpus for tb in g.threadblocks for st in tb.steps}
    assert kinds <= {"s", "r", "rrc", "nop"}
    res = run(src, 4, "--max-tbs", 1, "--no-fusion", "-o", out)
    assert res.exit_code == 1 and "max_tbs=1" in res.output


def test_program_errors_are_reported_with_their_location(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("""
        from gc3 import GC3Program, chunk
        from gc3.collectives import AllReduce
        with GC3Program("bad", AllReduce(2, 1)):
            chunk(0, "in", 5)
    """))
    res = run(bad, "-o", tmp_path / "x.xml")
    assert res.exit_code == 2
    assert "FAILED: IndexOutOfRangeError" in res.output and f"{bad}:5:" in res.output
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    res = run(empty, "-o", tmp_path / "x.xml")
    assert res.exit_code == 2 and "traced no GC3Program" in res.output
    assert not (tmp_path / "x.xml").exists()


def test_unwritable_output_is_a_clean_error(tmp_path):
    src = tmp_path / "ring.py"
    src.write_text(RING)
    res = run(src, 3, "-o", tmp_path / "missing" / "x.xml")
    assert res.exit_code == 2 and "folder" in res.output and "does not exist" in res.output
    assert "x.xml" in res.output
