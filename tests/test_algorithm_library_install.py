"""The algorithm library is the package gc3.algorithms: a wheel ships it as code like any other
package of gc3, and gc3's own callers (the catalog builders, `gc3 tune`, the fused operators)
import its modules, so an installed gc3 can tune, build catalogs and run the fused operators'
programs with no checkout and nothing run by path.  (scripts/test.sh installs a wheel in a fresh
venv and compiles a fused program from it.)"""
import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import gc3.algorithms
from gc3 import algorithms
from gc3.errors import GC3Error, InputError

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "gc3" / "algorithms"


def _folders():
    return sorted({p.parent for p in LIBRARY.rglob("*.py") if "__pycache__" not in p.parts})


def test_every_folder_of_the_library_is_a_package_that_setuptools_finds(monkeypatch):
    """As setuptools itself reads pyproject.toml: each folder of the library is a package that
    packages.find includes, so the wheel carries its modules where `import` finds them."""
    config = pytest.importorskip("setuptools.config.pyprojecttoml")
    monkeypatch.chdir(ROOT)
    tool = config.read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]
    found = set(tool["packages"])       # packages.find, run
    for folder in _folders():
        assert (folder / "__init__.py").is_file(), f"{folder} is not a package"
        assert ".".join(folder.relative_to(ROOT).parts) in found, folder
    # Code, not data: nothing of the library is copied under share/ beside the package.
    data_files = tool.get("data-files", {})
    pairs = data_files.items() if isinstance(data_files, dict) else data_files
    assert not [dest for dest, files in pairs if "algorithms" in dest or any("algorithms" in f for f in files)]


def test_names_are_the_modules_of_the_package():
    assert algorithms.names() == sorted(p.stem for p in LIBRARY.glob("[!_]*.py"))
    assert algorithms.names("fused") == sorted(f"fused.{p.stem}" for p in (LIBRARY / "fused").glob("[!_]*.py"))
    assert "allreduce_ring" in algorithms.names() and "fused.gemm_allreduce" in algorithms.names("fused")


def test_the_catalog_library_reads_the_package():
    from runtime_cuda.nccl import library

    assert library.algorithms_dir() == Path(gc3.algorithms.__file__).resolve().parent == LIBRARY.resolve()
    assert list(library.ALGORITHMS) == algorithms.names()
    assert library.algorithm("allreduce_ring").params == ("ranks", "instances", "channels", "inplace")


def test_trace_and_builder_import_the_module():
    prog = algorithms.trace("allreduce_ring", (3, 1, 1, 0))
    assert prog.name == "allreduce_ring" and prog.num_ranks == 3
    assert algorithms.builder("fused.gemm_allreduce") is sys.modules["gc3.algorithms.fused.gemm_allreduce"].gemm_allreduce
    assert algorithms.trace("fused.gemv_allreduce").name == "gemv_allreduce_twoshot"    # its own defaults


@pytest.mark.parametrize("name, argv, needle", [
    ("nope", (), "no algorithm 'nope' in gc3.algorithms (known: allgather_direct"),
    ("fused.nope", (), "no algorithm 'fused.nope' in gc3.algorithms (known: fused.allgather_gemm"),
    ("nope.ring", (), "no algorithm 'nope.ring' in gc3.algorithms (known: allgather_direct"),
    ("../allreduce_ring", (), "names no algorithm"),
    ("fused", (), "gc3.algorithms.fused is not an algorithm"),
    ("allreduce_ring", ("four",), "argument ranks must be an int"),
    ("allreduce_ring", (4, 1, 1, 1, 9), "expected at most 4 arguments"),
    ("fused.gemv_allreduce", (2, 1, 16, 64, 2, 3), "gc3.algorithms.fused.gemv_allreduce 2 1 16 64 2 3: the program "
                                                   "raised ValueError: variant must be 1"),
])
def test_a_bad_name_or_argument_is_an_input_error(name, argv, needle):
    with pytest.raises(InputError) as err:
        algorithms.trace(name, argv)
    assert needle in str(err.value)


def test_an_error_in_a_library_program_names_its_own_line():
    """The library's files are DSL programs: an error names the line in them, as for a user's file,
    and not the line of gc3's caller."""
    with pytest.raises(GC3Error) as err:
        algorithms.trace("allreduce_ring", ("four",))
    where = str(err.value).split(": ")[0]
    assert where.startswith(str(LIBRARY / "allreduce_ring.py:")), err.value


def test_gc3s_own_callers_run_no_file_by_path(monkeypatch):
    """The catalog builders, the calibration points and the fused operators' programs come
    through import: with every way of running a file by path broken, they still compile."""
    import gc3.dsl.program
    from gc3.simulator.calibration import compile_spec
    from runtime_cuda import candidates
    from runtime_cuda.fused import programs, schedule
    from runtime_cuda.nccl import library, samples

    def refuse(*args, **kwargs):
        raise AssertionError(f"ran a file by path: {args}")

    monkeypatch.setattr(runpy, "run_path", refuse)
    monkeypatch.setattr(gc3.dsl.program, "run_script", refuse)
    schedule.compiled.cache_clear()
    programs.fused_program.cache_clear()
    _, prog = library.compile_program("allreduce_ring", (2,), instances=1)
    assert prog.coll == "allreduce" and prog.ngpus == 2
    assert samples.compile_fused("gemm_allreduce").fused
    assert candidates.compile_candidate(candidates.CANDIDATES[0]).ngpus == 2
    assert compile_spec("algorithms/allgather_direct.py 2 --instances 2 --protocol LL").proto == "LL"
    assert schedule.compiled("gemm_all_reduce", 2).fused
    assert programs.fused_program("gemv_allreduce", (2, 1, 16, 64, 2, 2), "float32").fused


@pytest.mark.slow
def test_a_built_wheel_carries_the_library_as_a_package(tmp_path):
    import importlib.util

    # setuptools builds wheels itself from 70.1; before that it needs the wheel package.
    if importlib.util.find_spec("setuptools") is None or (
            importlib.util.find_spec("setuptools.command.bdist_wheel") is None
            and importlib.util.find_spec("wheel") is None):
        pytest.skip("this environment cannot build a wheel (setuptools < 70.1 without the wheel package)")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in sorted(LIBRARY.rglob("*.py")):
        assert p.relative_to(ROOT).as_posix() in names, f"the wheel lacks {p.relative_to(ROOT)}"
    assert not [n for n in names if ".data/" in n and "algorithms" in n]
