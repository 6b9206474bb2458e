"""Code, tests, scripts and the READMEs say what they do, not which issue asked for it: a reader of the
repository has no issue tracker to look a number up in."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"\bissues? #?\d+|\(#\d+\)|\bthe issue's\b|\b(?:see|fixes|closes|PR|pull request) #\d+"
                       r"|/(?:issues|pull)/\d+", re.I)
FOLDERS = ("gc3", "runtime_cuda", "scripts", "tests", "examples", ".ci")
FILES = ("README.md", "pyproject.toml", "setup.py")
SUFFIXES = {".py", ".sh", ".md", ".cu", ".cuh", ".toml", ""}


def _files(root: Path):
    for folder in FOLDERS:
        yield from sorted(p for p in (root / folder).rglob("*") if p.is_file())
    yield from (root / name for name in FILES if (root / name).is_file())


def references(root: Path = ROOT):
    found = []
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        if path.suffix not in SUFFIXES or path == Path(__file__).resolve() or "__pycache__" in path.parts:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if REFERENCE.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_issue_references():
    assert references() == []


def test_a_reference_is_found(tmp_path):
    (tmp_path / "gc3").mkdir()
    (tmp_path / "gc3" / "x.py").write_text("# as issue 7 asked\n# see (#12)\n# Issue #3\n# the issue's shapes\n"
                                           "# issued in order\n# see #4\n# send #1 on 0->1\n"
                                           "# github.com/o/r/pull/9\n")
    (tmp_path / "README.md").write_text("Fused programs (issue 16): ...\n")
    assert [":".join(line.split(":")[:2]) for line in references(tmp_path)] == [
        "gc3/x.py:1", "gc3/x.py:2", "gc3/x.py:3", "gc3/x.py:4", "gc3/x.py:6", "gc3/x.py:8", "README.md:1"]
