"""`gc3 simulate` holds to its memory limit: the estimate it makes from the IR and
the size before allocating is refused over GC3_SIM_MAX_BYTES, and a run it
accepts fits, checked under an address-space limit (RLIMIT_AS) of the setting
plus 1.5 GiB in a subprocess, so that an estimate that is too low fails here
rather than on a user's machine."""
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gc3.errors import InputError, SizeError
from gc3.ir.layout import layout_for
from gc3.simulator import simulate
from gc3.simulator.driver import load_program
from gc3.simulator.footprint import ENV, estimate, max_bytes

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "ir_samples" / "allreduce_ring_8r_Simple.xml"
GIB = 1 << 30
LIMIT = 1 * GIB
HEADROOM = 3 * GIB // 2      # the interpreter, numpy and lxml themselves


def _estimate(path, nbytes, itemsize=4):
    prog = load_program(str(path))
    n = nbytes // itemsize
    layouts = [layout_for(prog, n, r) for r in range(prog.ngpus)]
    return estimate(prog, layouts, itemsize, aliased=prog.inplace, slots=8).total


def _largest_size_within(path, limit):
    """The largest whole-MiB size whose estimate is within `limit`, and the next one up."""
    mib = 1
    while _estimate(path, (mib + 1) << 20) <= limit:
        mib += 1
    return mib << 20, (mib + 1) << 20


# `gc3 simulate` in the child, which then reports its own peak resident memory: VmHWM, not
# ru_maxrss, which Linux carries over from the parent (pytest) through fork and exec.
_CHILD = """
import re, sys
from gc3.cli import main
try:
    main(sys.argv[1:])
    code = 0
except SystemExit as exc:
    code = exc.code
kib = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
print("PEAK", int(kib) * 1024, file=sys.stderr)
sys.exit(code)
"""


def _simulate_limited(path, size):
    """`gc3 simulate` in a child whose address space is LIMIT + HEADROOM; (returncode, output, peak RSS)."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT + HEADROOM, LIMIT + HEADROOM))

    env = dict(os.environ, **{ENV: "1GiB"}, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _CHILD, "simulate", str(path), "--size", str(size), "-q"],
                         env=env, capture_output=True, text=True, preexec_fn=limit_memory, timeout=600)
    peak = re.search(r"^PEAK (\d+)$", res.stderr, re.M)
    return res.returncode, res.stdout + res.stderr, int(peak.group(1))


def _baseline():
    """What a run holds besides its data: the peak of a tiny one."""
    rc, out, peak = _simulate_limited(RING, "4K")
    assert rc == 0, out
    return peak


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc (Linux)")
def test_under_the_limit_runs_within_it_and_over_it_is_refused_clearly():
    under, over = _largest_size_within(RING, LIMIT)
    assert _estimate(RING, under) > LIMIT * 3 // 4, "the case must come close to the limit to test it"

    rc, out, peak = _simulate_limited(RING, under)
    assert rc == 0, out
    assert "result     OK" in out
    # the estimate is an upper bound of the data the run really held
    assert peak <= _estimate(RING, under) + _baseline(), (peak, _estimate(RING, under))

    rc, out, _ = _simulate_limited(RING, over)
    assert rc == 2, out
    assert "MemoryError" not in out and "Traceback" not in out
    assert re.search(r"needs about [0-9.]+ GiB of memory \(.*\), more than GC3_SIM_MAX_BYTES=1\.00 GiB", out), out
    assert _estimate(RING, over) > LIMIT


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc (Linux)")
def test_the_estimate_covers_a_long_schedule(tmp_path):
    """A 64-rank ring with 8 instances (65024 steps): there the trace and the race
    detector's clocks and cells weigh as much as the buffers, and must be counted."""
    xml = tmp_path / "ring64.xml"
    res = subprocess.run([sys.executable, "-m", "gc3", "compile", str(ROOT / "gc3" / "algorithms" / "allreduce_ring.py"),
                          "64", "--instances", "8", "-o", str(xml), "-q"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    size = 1 << 18
    prog = load_program(str(xml))
    fp = estimate(prog, [layout_for(prog, size // 4, r) for r in range(64)], 4, aliased=True, slots=8)
    assert fp.lasting["race detection"] + fp.lasting["trace"] > fp.lasting["rank buffers"] / 4
    rc, out, peak = _simulate_limited(xml, size)
    assert rc == 0, out
    assert peak <= fp.total + _baseline(), (peak, fp.total, _baseline())


def test_the_limit_is_a_setting(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert max_bytes() == 8 * GIB
    for text, value in (("1GiB", GIB), ("512M", 512 << 20), ("1073741824", GIB)):
        monkeypatch.setenv(ENV, text)
        assert max_bytes() == value
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(InputError, match="GC3_SIM_MAX_BYTES='lots'"):
        max_bytes()


def test_refused_before_anything_is_allocated(monkeypatch):
    """Over the limit, `simulate` raises before drawing inputs: a 1 TiB call on 8 ranks
    returns at once instead of failing in numpy."""
    monkeypatch.setenv(ENV, "64MiB")
    import gc3.simulator.driver as driver

    monkeypatch.setattr(driver, "make_inputs", lambda *a, **k: pytest.fail("allocated before refusing"))
    with pytest.raises(SizeError) as err:
        simulate(str(RING), size="1TiB")
    msg = str(err.value)
    assert "needs about" in msg and "GC3_SIM_MAX_BYTES=64.00 MiB" in msg and "rank buffers" in msg


def test_every_part_counts():
    """Each lasting part grows with what it is about: buffers with the size, race
    detection and the trace with the schedule, and race detection only when on."""
    prog = load_program(str(RING))

    def parts(nbytes, **kw):
        n = nbytes // 4
        return estimate(prog, [layout_for(prog, n, r) for r in range(prog.ngpus)], 4, aliased=prog.inplace,
                        slots=8, **kw)

    small, big = parts(1 << 20), parts(1 << 24)
    for what in ("inputs", "rank buffers", "expected outputs", "messages in flight"):
        assert big.lasting[what] == 16 * small.lasting[what], what
    assert big.lasting["race detection"] == small.lasting["race detection"] > 0
    assert "race detection" not in parts(1 << 20, detect_races=False).lasting
    assert small.total > sum(small.lasting.values())       # plus the largest transient phase
