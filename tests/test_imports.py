"""Every module of gc3/ and runtime_cuda/ imports on a CPU machine without cupy
(the runtime imports cupy inside functions), so a broken import path fails here
and not on a GPU; and the compiler never names the runtime."""
import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gc3", "runtime_cuda")
# Modules that run something when imported, not only define it.
RUNS_ON_IMPORT = {"gc3.__main__", "runtime_cuda.__main__", "runtime_cuda.startup"}
# The torch.distributed process group (a torch subclass) and the torch functions import where torch does.
NEEDS_TORCH = {"runtime_cuda.torch_dist.process_group", "runtime_cuda.torch_dist.ops"}
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts)


MODULES = list(_modules())


def test_every_module_imports_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['cupy_backends'] = None\n"
            "import importlib\n"
            f"for m in {[m for m in MODULES if m not in RUNS_ON_IMPORT and (HAS_TORCH or m not in NEEDS_TORCH)]!r}: importlib.import_module(m)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("gc3")])
def test_gc3_never_names_runtime_cuda(module):
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    text = path.read_text()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "runtime_cuda" for a in node.names), module
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "runtime_cuda", module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # importlib / __import__ by name, or an entry point spelled in code
            assert not node.value.startswith("runtime_cuda"), (module, node.value)


# The facts every stage shares, and nothing else: a new module belongs in a stage's folder.
SHARED_ROOT_MODULES = {"dtypes", "errors", "limits", "settings", "units"}
# The users' import paths that are not a stage: gc3.collectives and gc3.topology re-export,
# gc3.toolchain holds gc3.lower (the compiler finished by the verifier, above both).
API_ROOT_MODULES = {"collectives", "topology", "toolchain"}


def test_gc3_root_holds_api_and_shared_facts_only():
    root = {p.stem for p in (ROOT / "gc3").glob("*.py") if p.stem not in ("__init__", "__main__")}
    want = SHARED_ROOT_MODULES | API_ROOT_MODULES
    assert root == want, root ^ want


def test_gc3_cli_lists_the_runtime_commands():
    main = importlib.import_module("gc3.cli").main
    assert {"compile", "check", "show", "simulate", "trace", "run", "bench", "catalog", "tune"} <= set(main.commands)


def test_readme_stage_table_matches_the_folders():
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## How it is built"):text.index("## Where a chunk goes")]
    named = {m.rstrip("/") for m in re.findall(r"^\| `((?:gc3|runtime_cuda)/\w*/?)`", table, re.M)}
    folders = {f"{pkg}/{p.parent.name}" for pkg in PACKAGES for p in (ROOT / pkg).glob("*/__init__.py")}
    assert named == folders | {"gc3", "runtime_cuda", "runtime_cuda/kernels"}


def test_readme_names_every_module_of_the_runtime_folders():
    """The stage table's rows for runtime_cuda/core/, runtime_cuda/ranks/ and runtime_cuda/ (root)
    name each module there, so the table is the tree."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## How it is built"):text.index("## Where a chunk goes")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(runtime_cuda/\w*/?)`[^|]*\|(.*)$", table, re.M)}
    for folder in ("runtime_cuda/core/", "runtime_cuda/ranks/", "runtime_cuda/"):
        files = {p.name for p in (ROOT / folder).glob("*.py")} - {"__init__.py"}
        assert sorted(f for f in files if f"`{f}`" not in rows[folder]) == [], folder


def test_runtime_commands_without_installed_metadata(monkeypatch):
    """On a GPU machine the checkout runs from PYTHONPATH, without the entry points
    pip installs: runtime_cuda.commands.cli() (what `python -m runtime_cuda` runs)
    adds run, bench, catalog and tune to gc3's CLI itself."""
    from gc3.cli import main
    from runtime_cuda.commands import cli

    for name in ("run", "bench", "catalog", "tune"):
        monkeypatch.delitem(main.commands, name, raising=False)
    assert "run" not in main.commands
    assert {"run", "bench", "catalog", "tune", "compile", "check"} <= set(cli().commands)


def test_pyproject_declares_every_runtime_command():
    """Each module of runtime_cuda/commands is a `gc3` subcommand of the same name, declared
    under the entry-point group `gc3.commands`, so that an installed gc3 has it too."""
    # (read as lines: tomllib is Python 3.11's, and gc3 supports 3.10)
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index('[project.entry-points."gc3.commands"]'):].split("\n\n")[0]
    declared = dict(re.findall(r'^(\w+) = "([\w.:]+)"$', section, re.M))
    modules = {p.stem for p in (ROOT / "runtime_cuda" / "commands").glob("*.py") if p.stem != "__init__"}
    assert declared == {m: f"runtime_cuda.commands.{m}:command" for m in modules}
