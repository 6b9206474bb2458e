"""`gc3 check` and `gc3 show` through the click entry point."""
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.cli import main
from gc3.cli.show import abbreviate
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.ir.xml_io import write_xml

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data" / "msccl"
MSCCL = sorted(DATA.glob("*.xml"))


def gc3(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def exchange_xml(tmp_path):
    """A 2-rank exchange: each rank's single TB does s s s r r r."""
    def tb():
        return Threadblock(0, send=-1, recv=-1, chan=0, steps=[
            Step(s=k, type=t, srcbuf="i", srcoff=0, dstbuf="i", dstoff=0) for k, t in enumerate("sssrrr")])
    gpus = [Gpu(r, 1, 1, 0, [tb()]) for r in range(2)]
    for g in gpus:
        g.threadblocks[0].send = g.threadblocks[0].recv = 1 - g.id
    path = tmp_path / "exchange.xml"
    write_xml(Program("exchange", "Simple", 1, 1, 2, "custom", False, gpus, gc3version="0.1.0"), path)
    return path


@pytest.mark.parametrize("path", MSCCL, ids=lambda p: p.name)
def test_check_accepts_the_msccl_samples(path):
    r = gc3("check", path)
    assert r.exit_code == 0, r.output
    assert "FIFO order:" in r.output and "deadlock: none with 8 slots" in r.output
    assert r.output.rstrip().endswith(f"{path}: OK")


def test_check_rejects_the_issue_exchange_with_two_slots(exchange_xml):
    r = gc3("check", exchange_xml, "--slots", 2)
    assert r.exit_code == 1
    assert "DeadlockError" in r.output and "rank 0 tb 0 step 2 (s)" in r.output and "rank 1 tb 0 step 2 (s)" in r.output
    assert "Traceback" not in r.output
    # Enough slots: nothing is wrong, but a custom collective without a
    # <postcondition> cannot be proven either, which has its own status.
    ok = gc3("check", exchange_xml, "--slots", 3)
    assert ok.exit_code == 3 and "PostconditionUnprovableError" in ok.output and "cannot be proven" in ok.output


def test_check_max_tbs(tmp_path):
    path = DATA / "alltoall_two_step_2n_4g.xml"
    r = gc3("check", path, "--max-tbs", 7)
    assert r.exit_code == 1 and "LimitError: rank 0 has 8 threadblocks, more than max_tbs=7" in r.output
    assert gc3("check", path, "--max-tbs", 8).exit_code == 0


def test_check_reports_malformed_and_missing_files(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<algo name="x" proto="LL" nchannels="1" nchunksperloop="1" ngpus="1" coll="c" inplace="1">\n<tbx/></algo>')
    r = gc3("check", bad)
    assert r.exit_code == 2 and "IRFormatError" in r.output and "bad.xml:2: `<tbx>`: unknown element" in r.output
    r = gc3("check", tmp_path / "missing.xml")
    assert r.exit_code == 2 and "cannot read" in r.output


def test_check_rejects_a_bad_slot_count(exchange_xml):
    assert gc3("check", exchange_xml, "--slots", 0).exit_code == 2


def test_show_alltoall_sample():
    r = gc3("show", DATA / "alltoall_two_step_2n_4g.xml")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("hierarchical_all_to_all: alltoall, 8 ranks, proto Simple, nchannels 6")
    assert sum(line.startswith("rank ") for line in lines) == 8
    rank0 = lines.index("rank 0: 8 TBs, i_chunks 8, o_chunks 8, s_chunks 4")
    assert lines[rank0 + 1].split() == ["tb", "send", "recv", "chan", "steps", "ops"]
    assert lines[rank0 + 2].split() == ["0", "-1", "1", "0", "2", "r*2"]
    assert lines[rank0 + 9].split() == ["7", "4", "-1", "4", "4", "nop*3", "s"]
    assert "instructions: s 56, r 56, cpy 16, nop 24 (total 152)" in lines
    assert "channels: 3 used (0, 4, 5) of nchannels 6" in lines
    assert "dependencies: 32 cross-TB (depid/deps), 32 steps signal completion (hasdep)" in lines


def test_show_ring_sample_opcode_sequence():
    r = gc3("show", DATA / "allreduce_ring_4r_1i.xml")
    assert r.exit_code == 0
    assert r.output.count("s rrs*2 rrcs rcs*2 r") == 4
    assert "instructions: s 4, r 4, rcs 8, rrs 8, rrcs 4 (total 28)" in r.output


def test_abbreviate_folds_runs_and_cuts_long_sequences():
    assert abbreviate(["s", "s", "r"]) == "s*2 r"
    long = abbreviate(["s", "r"] * 50, width=20)
    assert long.startswith("s r s r") and long.endswith("more)") and len(long) < 40


def test_show_dag_needs_a_program(exchange_xml, tmp_path):
    r = gc3("show", exchange_xml, "--dag", tmp_path / "d.png")
    assert r.exit_code == 2 and "need a DSL program" in r.output


def test_show_program_draws_its_chunk_dag(tmp_path):
    png = tmp_path / "dag.png"
    r = gc3("show", ROOT / "gc3" / "algorithms" / "allreduce_ring.py", 3, "--dag", png)
    assert r.exit_code == 0, r.output
    assert "allreduce_ring" in r.output and f"wrote the chunk DAG to {png}" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_show_program_reports_script_errors(tmp_path):
    script = tmp_path / "empty.py"
    script.write_text("x = 1\n")
    r = gc3("show", script)
    assert r.exit_code == 2 and "traced no GC3Program" in r.output
