"""`gc3 calibrate` (runtime_cuda/commands/calibrate.py over runtime_cuda/calibrate.py) as a user
meets it: its help, bad options and unreadable inputs refused with exit 2 in one line, a real fit
of two parameters (--dry-run: the committed preset is left alone), and the preset block it writes,
which reproduces the committed one from the committed figures."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gc3.simulator import cost_config
from gc3.simulator.cost_config import H200_CALIBRATION, preset
from runtime_cuda import calibrate

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"# CALIBRATED h200 BEGIN.*?# CALIBRATED h200 END\n", re.S)


def gc3(*args):
    out = subprocess.run([sys.executable, "-m", "runtime_cuda", "calibrate", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    return out.returncode, out.stdout, out.stderr


def test_help_lists_the_options():
    rc, out, _ = gc3("--help")
    assert rc == 0 and "usage: gc3 calibrate" in out and "--from-sweep" in out and "--dry-run" in out, out


@pytest.mark.parametrize("args, says", [(("--fit", "launch_s,nope"), "unknown parameter(s) nope"),
                                        (("--fit", ","), "unknown parameter(s) (none named)"),
                                        (("--holdout-above", "0"), "--holdout-above: a size in bytes"),
                                        (("--holdout-above", "lots"), "invalid int value"),
                                        (("--bogus",), "unrecognized arguments: --bogus")])
def test_bad_options_exit_2_naming_what(args, says):
    rc, out, err = gc3(*args)
    assert rc == 2 and says in err and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "error:" in line] == [err.strip().splitlines()[-1]]


def _one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_unreadable_inputs_exit_2_in_one_line(tmp_path):
    rc, _, err = gc3("--csv", str(tmp_path / "none.csv"), "--dry-run")
    assert rc == 2 and "none.csv: No such file or directory" in _one_line(err)
    (tmp_path / "bad.csv").write_text("coll,size\nallreduce,lots\n")
    rc, _, err = gc3("--csv", str(tmp_path / "bad.csv"), "--dry-run")
    assert rc == 2 and "bad.csv: not a CSV of measured points" in _one_line(err)
    (tmp_path / "sweep.txt").write_text("coll size program us\nallreduce 1KiB no-such-candidate 5.0 x\n")
    rc, _, err = gc3("--from-sweep", str(tmp_path / "sweep.txt"), "--dry-run")
    assert rc == 2 and "names a candidate that runtime_cuda/candidates.py does not define" in _one_line(err)
    rc, _, err = gc3("--holdout-above", str(1 << 50))
    assert rc == 2 and "the points must fall on both sides of it" in _one_line(err)


def test_a_dry_run_fits_and_writes_nothing():
    preset_file = Path(cost_config.__file__)
    before = preset_file.read_bytes()
    rc, out, err = gc3("--dry-run", "--fit", "alpha_LL128,tb_LL128")
    assert rc == 0, out + err
    assert re.search(r"^\d+ measured points, \d+ programs$", out, re.M), out
    assert "after (fitted): median |rel. error|" in out and "dry run: would write the preset 'calibrated on" in out
    assert preset_file.read_bytes() == before


def test_the_committed_preset_is_what_calibrate_writes_for_its_figures(tmp_path):
    committed = Path(cost_config.__file__).read_text()
    block = calibrate.preset_block(calibrate.vector_of(preset("h200")), H200_CALIBRATION, ll128=True)
    assert BLOCK.search(committed).group(0) == block
    # Written into a copy: only the block changes.
    copy = tmp_path / "cost_config.py"
    copy.write_text(committed)
    changed = calibrate.preset_block(calibrate.vector_of(preset("h200")) * 2, "a test fit", ll128=True)
    calibrate.write_preset(changed, copy)
    assert BLOCK.sub("", copy.read_text()) == BLOCK.sub("", committed) and changed in copy.read_text()
    copy.write_text("no block here\n")
    with pytest.raises(calibrate.InputError, match="no CALIBRATED h200 block"):
        calibrate.write_preset(changed, copy)
