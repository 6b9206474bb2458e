"""No block of more than 10 lines is written twice in the package code or the scripts (tests
may repeat themselves for clarity): where the logic is the same, one piece of code serves.
Lines are compared stripped of indentation, with blank lines, comment-only lines and lines
of a lone bracket left out, so re-indenting a copy does not hide it."""
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("gc3", "runtime_cuda", "scripts", "examples")
WINDOW = 11
_TRIVIAL = re.compile(r"^(#.*|[\)\]\}],?:?|\"\"\"|else:|try:|finally:|pass|return|\)\s*->.*:)?$")


def _lines(path: Path):
    for number, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not _TRIVIAL.match(line):
            yield number, line


def repeated_blocks(files, window: int = WINDOW):
    """[(path:line, path:line)] for every run of `window` kept lines found twice, first places only."""
    seen, pairs = {}, []
    for path in files:
        kept = list(_lines(path))
        last_hit = defaultdict(lambda: -window)
        for i in range(len(kept) - window + 1):
            block = tuple(line for _, line in kept[i:i + window])
            where = (path, kept[i][0])
            first = seen.setdefault(block, where)
            if first is where:
                continue
            if first[0] == path and abs(first[1] - where[1]) < window:
                continue   # a run of the same line (a table) overlapping itself
            if i - last_hit[first[0]] >= window:   # report a long run once, at its start
                pairs.append((f"{first[0].relative_to(ROOT)}:{first[1]}", f"{path.relative_to(ROOT)}:{where[1]}"))
            last_hit[first[0]] = i
    return pairs


def _sources():
    for folder in SOURCE:
        yield from sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_block_of_more_than_ten_lines_is_written_twice():
    assert repeated_blocks(list(_sources())) == []


def test_the_check_finds_a_copied_block(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    body = "\n".join(f"    x{i} = compute({i}, y)" for i in range(12))
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(f"def f(y):\n{body}\n    return x0\n")
    b.write_text(f"def g(y):\n    # re-indented, with a comment in between\n" +
                 "\n".join("        " + line.strip() for line in body.splitlines()) + "\n")
    assert repeated_blocks([a, b]) == [("a.py:2", "b.py:3")]
    b.write_text("def g(y):\n" + "\n".join(body.splitlines()[:10]) + "\n")   # ten lines: allowed
    assert repeated_blocks([a, b]) == []
