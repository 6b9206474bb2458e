"""The README's exit-status contract, command by command: 0 success, 1 the
program is wrong, 2 an input (file, attribute, option, environment variable)
cannot be used, 3 (`check`) a custom collective with no postcondition."""
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.cli import main

ROOT = Path(__file__).resolve().parents[1]
RING_PY = ROOT / "gc3" / "algorithms" / "allreduce_ring.py"
RING_XML = ROOT / "ir_samples" / "allreduce_ring_8r_Simple.xml"
FUSED = ROOT / "ir_samples" / "allgather_gemm.xml"
ALLTONEXT = ROOT / "tests" / "data" / "alltonext_custom_16r.xml"
MSCCL = ROOT / "tests" / "data" / "msccl" / "allreduce_ring_4r_1i.xml"


def _has_cupy():
    try:
        import cupy  # noqa: F401
        return True
    except ImportError:
        return False


def _typo(tmp):
    bad = tmp / "typo.xml"
    bad.write_text(MSCCL.read_text().replace(' coll=', ' maxbytes="10" coll=', 1))
    return bad


def _wrong(tmp):
    """The MSCCL ring with one receive reading the wrong chunk: FIFO order fails."""
    bad = tmp / "wrong.xml"
    bad.write_text(MSCCL.read_text().replace('type="rrs" srcbuf="i" srcoff="3"', 'type="rrs" srcbuf="i" srcoff="2"', 1))
    return bad


CASES = [
    # id, argv (a callable of the tmp folder for files made there), env, status, what the output says
    ("ok", ["check", RING_XML], {}, 0, "OK"),
    ("compile-output-folder-missing", ["compile", RING_PY, "4", "-o", "/nonexistent/dir/o.xml"], {}, 2,
     "folder /nonexistent/dir does not exist"),
    ("simulate-fused-size-mismatch", ["simulate", FUSED, "--size", "1MiB"], {}, 2, "SizeError"),
    ("size-beyond-1TiB", ["simulate", RING_XML, "--size", "2TiB"], {}, 2, "MAX_BYTES"),
    ("size-1TiB-reads-but-is-too-much-to-simulate", ["simulate", RING_XML, "--size", "1TiB"], {}, 2,
     "needs about"),
    ("sim-limit-setting-unreadable", ["simulate", RING_XML], {"GC3_SIM_MAX_BYTES": "lots"}, 2,
     "GC3_SIM_MAX_BYTES='lots'"),
    ("unknown-attribute", lambda t: ["check", _typo(t)], {}, 2, "did you mean `maxBytes`?"),
    ("check-a-program-file", ["check", RING_PY], {}, 2, "compile it first"),
    ("algorithm-library-moved", ["compile", "algorithms/nope.py", "-o", "x.xml"], {}, 2,
     "the package gc3.algorithms"),
    ("wrong-program", lambda t: ["check", _wrong(t)], {}, 1, "FifoOrderError"),
    ("custom-without-postcondition-check", ["check", ALLTONEXT], {}, 3, "PostconditionUnprovableError"),
    ("custom-without-postcondition-run", ["run", ALLTONEXT], {}, 3, "--unproven"),
    ("custom-unproven-simulate", ["simulate", ALLTONEXT, "--unproven", "--size", "64K"], {}, 0, "NOT PROVEN"),
    pytest.param("run-without-cupy", ["run", RING_XML], {}, 2, "needs a CUDA GPU and cupy",
                 marks=pytest.mark.skipif(_has_cupy(), reason="cupy is installed here")),
    pytest.param("bench-without-cupy", ["bench", "-b", "1K", "-e", "4K"], {}, 2, "needs cupy",
                 marks=pytest.mark.skipif(_has_cupy(), reason="cupy is installed here")),
]


@pytest.mark.parametrize("name, argv, env, status, needle", CASES, ids=[
    c.values[0] if hasattr(c, "values") else c[0] for c in CASES])
def test_exit_status_is_the_documented_one(name, argv, env, status, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if callable(argv):
        argv = argv(tmp_path)
    res = CliRunner().invoke(main, [str(a) for a in argv] + ["-q"] * (argv[0] in ("simulate", "check")), env=env)
    assert res.exit_code == status, res.output
    assert needle in res.output, res.output
    assert "Traceback" not in res.output
    if status == 2 and res.exception is not None:
        assert isinstance(res.exception, SystemExit), repr(res.exception)


def test_tune_without_an_algorithm_library_says_where_it_comes_from(monkeypatch, tmp_path):
    from runtime_cuda.nccl import library

    monkeypatch.setattr(library, "ALGORITHMS", {})
    monkeypatch.setattr(library, "ALGORITHMS_DIR", tmp_path / "site-packages" / "gc3" / "algorithms")
    res = CliRunner().invoke(main, ["tune", "--model-only", "--ranks", "2", "-o", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "no algorithm library at" in res.output and "gc3.algorithms" in res.output, \
        res.output
