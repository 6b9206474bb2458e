"""runtime_cuda.core.stuck: a body that overruns its deadline ends the process with
status 3 and the message naming it; one that finishes in time leaves nothing
behind."""
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(body: str):
    code = ("import time\nfrom runtime_cuda.core.stuck import deadline\n"
            f"with deadline(0.3, 'allreduce 4096 bytes in place did not finish'):\n    {body}\nprint('after')\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return p, time.monotonic() - t0


def test_overrun_ends_the_process_naming_what():
    p, took = run("time.sleep(30)")
    assert p.returncode == 3
    assert "allreduce 4096 bytes in place did not finish" in p.stderr
    assert "after" not in p.stdout
    assert took < 20


def test_body_in_time_continues():
    p, _ = run("time.sleep(0.01)")
    assert p.returncode == 0 and p.stdout.strip() == "after" and p.stderr == ""


def test_no_deadline_when_zero():
    from runtime_cuda.core.stuck import deadline
    with deadline(0, "never"):
        time.sleep(0.01)
