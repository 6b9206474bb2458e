"""gc3.settings: every GC3_* environment variable the code reads is declared there once, the
README's table is `gc3 env --markdown`, and a bad value is an InputError naming the variable."""
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3 import settings
from gc3.cli import main
from gc3.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
# A name, not a prefix that an f-string completes (GC3_SLOT_BYTES_{proto}).
NAME = re.compile(r"\bGC3_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_{])")
# Names the tests make up to see a check refuse them.
MADE_UP = {"GC3_UNROLL"}


def _names(paths):
    found = {}
    for path in paths:
        for name in NAME.findall(path.read_text(errors="replace")):
            found.setdefault(name, path.relative_to(ROOT))
    return found


def kernel_macros():
    """GC3_* macros of the kernels, which are not environment variables (except the gemv
    tunables, which are both)."""
    return set(_names((ROOT / "runtime_cuda").rglob("*.cu*")))


def undeclared(paths):
    macros = kernel_macros()
    return {name: where for name, where in _names(paths).items()
            if name not in settings.SETTINGS and name not in macros and name not in MADE_UP}


def code_files():
    """Code, scripts and tests; not this file, whose names are made up to be refused."""
    for folder in ("gc3", "runtime_cuda", "scripts", "tests"):
        for pattern in ("*.py", "*.sh"):
            yield from (p for p in (ROOT / folder).rglob(pattern) if p != Path(__file__).resolve())


def test_every_gc3_variable_in_the_code_is_declared():
    assert undeclared(code_files()) == {}


def test_an_undeclared_variable_is_found(tmp_path):
    made = ROOT / "tests" / "_undeclared_probe.py"
    try:
        made.write_text('import os\nos.environ.get("GC3_NOT_DECLARED_ANYWHERE")\n')
        assert "GC3_NOT_DECLARED_ANYWHERE" in undeclared(code_files())
    finally:
        made.unlink()


def test_every_declared_setting_is_read_somewhere():
    """By name, or by a prefix an f-string completes (f"GC3_TILE_SPLIT_{proto.upper()}")."""
    text = "\n".join(p.read_text() for p in code_files() if p.name != "settings.py")
    assert [name for name in settings.SETTINGS
            if name not in text and name.rsplit("_", 1)[0] + "_{" not in text] == []


def readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Settings"):]
    return "\n".join(line for line in section.split("\n## ")[0].splitlines() if line.startswith("|"))


def test_readme_table_is_gc3_env_markdown():
    r = CliRunner().invoke(main, ["env", "--markdown"])
    assert r.exit_code == 0, r.output
    assert readme_table() == r.output.strip()
    assert len(readme_table().splitlines()) == len(settings.SETTINGS) + 2


def test_gc3_env_shows_value_and_where_it_came_from(monkeypatch):
    monkeypatch.setenv("GC3_TIMEOUT_S", "2.5")
    monkeypatch.setenv("GC3_FUSED_MIN_ROWS", "lots")
    monkeypatch.delenv("GC3_AUTOTUNE_S", raising=False)
    r = CliRunner().invoke(main, ["env"])
    assert r.exit_code == 0, r.output
    lines = {line.split()[0]: line for line in r.output.splitlines()}
    assert set(lines) == set(settings.SETTINGS)
    assert lines["GC3_TIMEOUT_S"].split()[1:] == ["2.5", "(environment)"]
    assert lines["GC3_AUTOTUNE_S"].split()[1:] == ["300", "(default)"]
    assert "invalid" in lines["GC3_FUSED_MIN_ROWS"] and "'lots'" in lines["GC3_FUSED_MIN_ROWS"]


@pytest.mark.parametrize("name, raw", [
    ("GC3_SIM_MAX_BYTES", "8 apples"), ("GC3_TIMEOUT_S", "nan"), ("GC3_TIMEOUT_S", "-3"),
    ("GC3_CACHE_ENTRIES", "0"), ("GC3_CACHE_ENTRIES", " "), ("GC3_SLOT_BYTES_LL", "1e9"),
    ("GC3_TILE_SPLIT_SIMPLE", "4"), ("GC3_TILE_SPLIT_LL", "0:5"), ("GC3_CMP_INFLIGHT", "100"),
    ("GC3_AUTOTUNE_S", "soon"), ("GC3_AUTOTUNE_MAX_BYTES", "lots"), ("GC3_FUSED", "maybe"),
    ("GC3_FUSED_RELEASE", "cpu"), ("GC3_FUSED_TRACE", "yes"), ("GC3_FUSED_TIMEOUT", "inf"),
    ("GC3_FUSED_MIN_ROWS", "-1"), ("GC3_FUSED_COMPUTE_TBS", "x"),
])
def test_a_bad_value_is_an_input_error_naming_variable_and_value(name, raw):
    with pytest.raises(InputError) as err:
        settings.get(name, {name: raw})
    assert f"environment variable {name}={raw!r}: " in str(err.value)


@pytest.mark.parametrize("name, raw, value", [
    ("GC3_TIMEOUT_S", "2.5", 2.5), ("GC3_SIM_MAX_BYTES", "1GiB", 1 << 30), ("GC3_TILE_SPLIT_LL", "4:65536", (4, 65536)),
    ("GC3_TRACE", "yes", True), ("GC3_TRACE", " ", True), ("GC3_TRACE", "0", False), ("GC3_TRACE", "", False),
    ("GC3_COOPERATIVE", "0", False), ("GC3_COOPERATIVE", "", True), ("GC3_NCCL", " On ", True),
    ("GC3_NCCL", "2", False), ("GC3_TORCH_FALLBACK", "off", False), ("GC3_TORCH_FALLBACK", "", True),
    ("GC3_FUSED", " sequential ", False), ("GC3_FUSED", "auto", None), ("GC3_FUSED", "  ", None),
    ("GC3_FUSED_RELEASE", "Kernel", "kernel"), ("GC3_FUSED_WAIT", "", "kernel"), ("GC3_CMP_MMA_WIDE", "1", 1),
])
def test_values_read_as_declared(name, raw, value):
    assert settings.get(name, {name: raw}) == value


def test_unset_is_the_default_and_an_undeclared_name_is_refused():
    assert all(settings.get(name, {}) == s.default for name, s in settings.SETTINGS.items())
    with pytest.raises(KeyError):
        settings.get("GC3_NOT_DECLARED", {})
