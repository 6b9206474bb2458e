"""The algorithm library outside a checkout: a wheel carries algorithms/ (pyproject's
data-files) and runtime_cuda.nccl.library finds it under sys.prefix, so a non-editable
install can still tune, build catalogs and run the fused operators' programs."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_ships_every_folder_of_the_library():
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    folders = sorted({p.parent for p in (ROOT / "algorithms").rglob("*.py")})
    assert folders, "no algorithm library in this checkout"
    for folder in folders:
        rel = folder.relative_to(ROOT).as_posix()
        assert f'"share/gc3/{rel}" = ["{rel}/*.py"]' in lines, f"pyproject.toml's data-files lacks {rel}"


def test_setuptools_reads_the_data_files_as_covering_every_algorithm(monkeypatch):
    """As setuptools itself reads pyproject.toml (globs expanded): every algorithm file is
    installed under share/gc3/ at its path relative to the checkout."""
    config = pytest.importorskip("setuptools.config.pyprojecttoml")
    monkeypatch.chdir(ROOT)
    data_files = config.read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["data-files"]
    pairs = data_files.items() if isinstance(data_files, dict) else data_files
    installed = {f"{dest}/{Path(f).name}" for dest, files in pairs for f in files}
    for p in sorted((ROOT / "algorithms").rglob("*.py")):
        assert f"share/gc3/{p.relative_to(ROOT).as_posix()}" in installed, p


def test_the_library_is_found_under_the_prefix_outside_a_checkout(tmp_path, monkeypatch):
    """With no algorithms/ beside the sources, the copy a wheel installs under sys.prefix serves."""
    from runtime_cuda.nccl import library

    share = tmp_path / "share" / "gc3" / "algorithms"
    shutil.copytree(ROOT / "algorithms", share)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    real_is_dir = Path.is_dir
    checkout = (ROOT / "algorithms").resolve()
    monkeypatch.setattr(Path, "is_dir", lambda self: False if self.resolve() == checkout else real_is_dir(self))
    assert library.algorithms_dir() == share
    monkeypatch.undo()
    assert library.algorithms_dir() == checkout == library.ALGORITHMS_DIR.resolve()


@pytest.mark.slow
def test_a_built_wheel_carries_the_library(tmp_path):
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
    names = zipfile.ZipFile(wheel).namelist()
    for p in sorted((ROOT / "algorithms").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        assert any(n.endswith(f".data/data/share/gc3/{rel}") for n in names), f"the wheel lacks {rel}"
