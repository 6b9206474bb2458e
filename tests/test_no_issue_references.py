"""Code, tests and scripts say what they do, not which issue asked for it: a reader of the
repository has no issue tracker to look a number up in."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"\bissues? #?\d+|\(#\d+\)|\bthe issue's\b", re.I)
FOLDERS = ("gc3", "runtime_cuda", "scripts", "tests")
SUFFIXES = {".py", ".sh", ".md", ".cu", ".cuh"}


def references(root: Path = ROOT):
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.suffix not in SUFFIXES or path == Path(__file__).resolve():
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
                                           "# issued in order\n")
    assert [line.split(":")[1] for line in references(tmp_path)] == ["1", "2", "3", "4"]
