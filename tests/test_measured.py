"""The measured data lives in measured/ at the repository root, outside the
packages: every path the docs, code and scripts name there exists, the defaults
that point into it come from one place (runtime_cuda.measured_file), and where
the folder is missing (an installed wheel) they say so, naming it."""
import itertools
import re
import subprocess
from pathlib import Path

import pytest

import runtime_cuda
from gc3.errors import GC3Error

ROOT = Path(__file__).resolve().parents[1]
OLD = "runtime_cuda/" + "measured"
# `measured/NAME`, `../measured/NAME` (a link from runtime_cuda/README.md); NAME may hold a
# glob (`fused_*_1xH100.txt`, `bench_x.*`) or a brace list (`{4,2}`).
NAMED = re.compile(r"(?<![\w.-])(\.\./)?measured/(\w[\w.*{},/-]*[\w*}/])")


def _tracked_text_files():
    out = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.sh", "*.json", "*.toml"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out if not p.startswith("measured/") and ROOT / p != Path(__file__).resolve()]


def _expand(name):
    """The brace lists of `name` expanded: `a{4,2}b` -> [a4b, a2b]."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def test_measured_sits_at_the_root_and_not_in_the_package():
    assert runtime_cuda.MEASURED_DIR == ROOT / "measured" and (ROOT / "measured" / "fuzz.txt").is_file()
    assert (ROOT / "measured" / "fused.txt").is_file() and not (ROOT / "runtime_cuda" / "measured").exists()


def test_every_named_measured_path_exists():
    missing, named = [], 0
    for path in _tracked_text_files():
        text = path.read_text()
        assert OLD not in text, f"{path.relative_to(ROOT)} still names {OLD}"
        for m in NAMED.finditer(text):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            base = path.parent if m.group(1) else ROOT
            if m.group(1):
                assert (base / "../measured").resolve() == ROOT / "measured", where
            for name in _expand(m.group(2)):
                named += 1
                if not list((ROOT / "measured").glob(name.rstrip("/"))):
                    missing.append(f"{where}: measured/{name}")
    assert named > 40 and not missing, missing


def test_a_missing_folder_is_named(tmp_path, monkeypatch):
    gone = tmp_path / "site-packages" / "measured"
    monkeypatch.setattr(runtime_cuda, "MEASURED_DIR", gone)
    with pytest.raises(GC3Error, match=re.escape(str(gone))):
        runtime_cuda.measured_file("fused.txt")
    from click.testing import CliRunner
    from runtime_cuda.commands import cli
    out = CliRunner().invoke(cli(), ["bench", "--fused", "--report"])
    assert out.exit_code == 2 and str(gone) in out.output.replace("\n", "") and "--record" in out.output


def test_the_fused_report_reads_the_committed_record_by_default():
    from click.testing import CliRunner
    from runtime_cuda.commands import cli
    out = CliRunner().invoke(cli(), ["bench", "--fused", "--report"])
    assert out.exit_code == 0, out.output
    assert out.output.count("\n| ") > 3
