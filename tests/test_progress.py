"""Progress of long commands: one helper (gc3.cli._progress), a bar redrawn on a
terminal, periodic lines in a log, on stderr, nothing with -q or for short work."""
import io
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import gc3.cli._progress as progress
from gc3.cli import main
from gc3.cli._progress import Progress

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "ir_samples" / "allreduce_ring_8r_Simple.xml"


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.02)
    monkeypatch.setattr(progress, "REDRAW_S", 0.01)


def _work(p, steps=40):
    p.phase("executing", total=steps)
    for _ in range(steps):
        time.sleep(0.005)
        p.advance()
    p.phase("checking")
    time.sleep(0.1)


def test_a_log_gets_lines_with_phase_fraction_and_time(fast):
    out = io.StringIO()
    with Progress("simulate", stream=out, quiet=False) as p:
        _work(p)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("simulate: ") for line in lines), lines
    assert any("executing" in line and "%" in line and "/40)" in line for line in lines), lines
    assert any("checking" in line and "elapsed" in line for line in lines), lines
    assert "\r" not in out.getvalue() and "[" not in out.getvalue()     # no bar in a log


def test_a_terminal_gets_one_redrawn_bar_cleared_at_the_end(fast):
    out = Tty()
    with Progress("check", stream=out, quiet=False) as p:
        _work(p)
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") >= 3
    assert "check: executing [" in text and "#" in text
    assert text.endswith("\r\033[K")


def test_quiet_and_short_work_print_nothing(fast, monkeypatch):
    out = io.StringIO()
    with Progress("compile", stream=out, quiet=True) as p:
        _work(p)
    assert out.getvalue() == ""
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 5.0)
    with Progress("compile", stream=out, quiet=False) as p:
        _work(p)
    assert out.getvalue() == ""


def test_the_time_left_comes_from_the_phase_fraction():
    p = Progress("x", quiet=True, tty=False)
    p.phase("executing", total=100)
    p.phase_start -= 10.0           # 10 s for a quarter: 30 s left
    p.start -= 10.0
    p.advance(25)
    assert "25% (25/100), about 30 s left, 10 s elapsed" in p.text()


@pytest.mark.parametrize("argv", [
    ["simulate", str(RING), "--size", "64K"],
    ["check", str(RING)],
    ["compile", str(ROOT / "gc3" / "algorithms" / "allreduce_ring.py"), "4", "-o", "{tmp}/r.xml"],
    ["trace", str(ROOT / "gc3" / "algorithms" / "allreduce_ring.py"), "4"],
    ["catalog", "check", str(ROOT / "ir_samples" / "index.json")],
])
def test_long_commands_report_on_stderr_and_q_silences_them(argv, fast, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 0, res.output
    label = " ".join(argv[:2]) if argv[0] == "catalog" else argv[0]
    assert f"{label}: " in res.stderr, res.stderr
    assert f"{label}: " not in res.stdout
    quiet = CliRunner().invoke(main, argv + ["-q"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    # The result line is the same, but for the time a step took (the two runs differ by scheduling).
    def last(out):
        return re.sub(r"\bin \d+(\.\d+)? s\b", "in T s", out.splitlines()[-1])
    assert last(quiet.stdout) == last(res.stdout)
