"""--unproven: a custom collective whose IR has no <postcondition> (msccl-tools'
alltonext, as MSCCL runs it) runs in `gc3 simulate` and `gc3 run`; structure,
deadlock and race checks still apply, the output says nothing was proven, and
the drop-in's catalog still refuses such an IR."""
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.cli import main
from gc3.ir.xml_io import read_xml

ROOT = Path(__file__).resolve().parents[1]
ALLTONEXT = ROOT / "tests" / "data" / "alltonext_custom_16r.xml"



def racy_program():
    """Two ranks of a custom collective: rank 1 receives rank 0's chunk into o[0] while a
    second threadblock of rank 1 copies its own input there, with no dependency between
    the two: a write/write race."""
    from gc3.ir import Gpu, Program, Step, Threadblock

    def step(typ):
        return Step(s=0, type=typ, srcbuf="i", srcoff=0, dstbuf="o", dstoff=0, cnt=1)

    return Program(name="racy", proto="Simple", nchannels=1, nchunksperloop=1, ngpus=2, coll="custom",
                   inplace=False, gc3version="0.1.0", gpus=[
                       Gpu(id=0, i_chunks=1, o_chunks=1, s_chunks=0,
                           threadblocks=[Threadblock(id=0, send=1, recv=-1, chan=0, steps=[step("s")])]),
                       Gpu(id=1, i_chunks=1, o_chunks=1, s_chunks=0,
                           threadblocks=[Threadblock(id=0, send=-1, recv=0, chan=0, steps=[step("r")]),
                                         Threadblock(id=1, send=-1, recv=-1, chan=0, steps=[step("cpy")])])])


def gc3(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_fixture_is_a_16_rank_custom_collective_without_postcondition():
    prog = read_xml(ALLTONEXT)
    assert prog.ngpus == 16 and prog.coll == "custom" and prog.postcondition is None
    assert gc3("check", ALLTONEXT).exit_code == 3


def test_simulate_runs_it_and_says_nothing_was_proven():
    refused = gc3("simulate", ALLTONEXT)
    assert refused.exit_code == 1 and "--unproven" in refused.output
    res = gc3("simulate", ALLTONEXT, "--unproven", "--size", "64K")
    assert res.exit_code == 0, res.output
    assert "NOT PROVEN: nothing was proven" in res.stdout
    assert "races      0" in res.stdout and "deadlock   " not in res.stdout


def test_simulate_unproven_still_moves_the_data_as_the_ir_says():
    """The buffers are those of the same IR with its collective's reference: alltonext."""
    from gc3.simulator import simulate

    custom = simulate(str(ALLTONEXT), count=64, unproven=True)
    assert custom.ok and custom.unproven
    for r in range(1, 16):
        assert (custom.outputs[r] == custom.inputs[r - 1]).all(), r


def test_unproven_still_finds_races_and_deadlocks(tmp_path):
    from gc3.ir.xml_io import write_xml

    racy = tmp_path / "racy.xml"
    write_xml(racy_program(), racy)
    res = gc3("simulate", racy, "--unproven", "--size", "4K")
    assert res.exit_code == 1 and "write/write race" in res.output, res.output
    run = gc3("run", racy, "--unproven")
    assert run.exit_code == 1 and "race" in run.output and "needs a CUDA GPU" not in run.output, run.output

    stuck = tmp_path / "stuck.xml"        # rank 0's send removed: rank 1 waits forever
    text = ALLTONEXT.read_text()
    start = text.index('<step s="0" type="s"')
    stuck.write_text(text[:start] + text[text.index("/>", start) + 2:])
    res = gc3("simulate", stuck, "--unproven", "--size", "64K")
    assert res.exit_code == 1 and "deadlock" in res.output, res.output


def test_run_without_the_flag_is_refused_with_a_hint():
    res = gc3("run", ALLTONEXT)
    assert res.exit_code == 3 and "--unproven runs it anyway" in res.output


def test_run_unproven_checks_everything_but_the_postcondition_before_the_gpu():
    try:
        import cupy  # noqa: F401
        pytest.skip("with cupy, tests/test_unproven_gpu.py runs it")
    except ImportError:
        pass
    res = gc3("run", ALLTONEXT, "--unproven")
    assert "NOTHING PROVEN" in res.output and "races checked" in res.output
    assert res.exit_code == 2 and "needs a CUDA GPU" in res.output


def test_the_drop_in_catalog_still_refuses_it(tmp_path):
    from runtime_cuda.nccl.catalog import check_config

    config = tmp_path / "catalog.xml"
    config.write_text(f'<gc3_config><load path="{ALLTONEXT}" collective="custom"/></gc3_config>')
    good, problems = check_config(config)
    assert good == [] and len(problems) == 1 and "custom" in str(problems[0]), problems
