"""`gc3 fuzz` (runtime_cuda/commands/fuzz.py) as a user meets it on any machine: its options,
a bad one refused with exit 2 naming it, and, where there is no GPU, exit 2 in one line
saying so rather than a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gc3(*args):
    out = subprocess.run([sys.executable, "-m", "runtime_cuda", "fuzz", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def _gpu():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def test_help_lists_the_options():
    rc, out = gc3("--help")
    assert rc == 0 and "usage: gc3 fuzz" in out and "--mode" in out and "--time-budget" in out


@pytest.mark.parametrize("args, says", [(("--colls", "allreduce,nope"), "unknown collective nope"),
                                        (("--dtypes", "float128"), "unknown dtype or op"),
                                        (("--calls", "-1"), "counts must be positive"),
                                        (("--mode", "threads"), "invalid choice")])
def test_bad_options_exit_2_naming_what(args, says):
    rc, out = gc3(*args)
    assert rc == 2 and says in out, out


def test_without_a_gpu_it_says_so_in_one_line():
    if _gpu():
        pytest.skip("this machine has a GPU: the fuzz would run")
    rc, out = gc3("--calls", "5")
    assert rc == 2, out
    assert out.strip().splitlines() == [out.strip()] and "needs CUDA GPUs" in out, out


def test_a_timed_out_batch_lists_its_calls_and_marks_the_route_the_error_names():
    """A GPU timeout surfaces when the host waits, after the whole batch went out: the report
    lists every call of the batch with its route, marks the calls served by the program the
    error names, and says which calls never went out."""
    from runtime_cuda.commands.fuzz import Outcome, batch_report, draw_spec

    specs = [draw_spec(2302, k, 4, 256 << 20) for k in range(11732, 11740)]
    routes = ["NCCL", "broadcast_ring_4r_Simple_c1_i64", "NCCL", "sendrecv", "NCCL", "oneshot_allreduce_4r",
              "allreduce_ring_4r_Simple_i64_unfused"]
    outcomes = [Outcome(s, r, []) for s, r in zip(specs, routes)]
    error = ("GPU wait timed out after 5 s (GC3_TIMEOUT_S) in 'allreduce_ring_4r_Simple_i64_unfused': rank 2 TB 6 "
             "step 3 (rrc), tile 0: waiting for data from rank 1")
    lines = batch_report(specs, outcomes, error)
    assert len(lines) == 8
    marked = [line for line in lines if "<- the error names this route" in line]
    assert marked == [f"  {specs[6].describe()} -> allreduce_ring_4r_Simple_i64_unfused   "
                      f"<- the error names this route"]
    assert lines[7].endswith("-> not issued") and "#11739" in lines[7]
    # A route that is only a prefix of the named program is not marked.
    assert not any("<-" in line for line in batch_report(specs[:1], [Outcome(specs[0], "allreduce_ring_4r", [])],
                                                          error))
