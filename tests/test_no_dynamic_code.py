"""The packages hold their code as source: no module of gc3 or runtime_cuda builds code from
strings (exec, eval, the compile builtin) or runs a file by its path (runpy, importlib's
spec_from_file_location), apart from the places that run a user's program file on purpose,
listed with their reason.  Code made at import time hides from a reader, from grep, from the
linters and from a traceback's source lines; gc3's own programs (the package gc3.algorithms)
are imported like any module."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gc3", "runtime_cuda")
BUILTINS = {"exec", "eval", "compile"}
FILE_LOADERS = {"spec_from_file_location", "SourceFileLoader"}
# path -> why it runs a program file.
ALLOWED = {
    "gc3/dsl/program.py": "run_script: runs a user's gc3 DSL program file as __main__ (`gc3 trace FILE.py`, "
                          "`gc3 compile FILE.py`, `gc3 show`, `gc3 simulate`)",
    "runtime_cuda/auto.py": "`python -m runtime_cuda.auto SCRIPT`: runs the user's program under the drop-in",
}
# run_script runs the file a user names on the command line: only the commands that take one call it.
RUN_SCRIPT_CALLERS = {"gc3/cli/compile.py", "gc3/cli/show.py", "gc3/cli/simulate.py", "gc3/cli/trace.py"}


def _read_name(node):
    """The name a Name or Attribute node reads (`x`, `a.b.x`: "x"); None for any other node."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        return node.attr
    return None


def dynamic_code(path: Path):
    """(line, what) of every exec/eval/compile call, every use of runpy and every load of a
    module from a file path in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILTINS:
            found.append((node.lineno, f"{node.func.id}()"))
        elif _read_name(node) in FILE_LOADERS:
            found.append((node.lineno, _read_name(node)))
        elif isinstance(node, ast.Import) and any(a.name == "runpy" for a in node.names):
            found.append((node.lineno, "import runpy"))
        elif isinstance(node, ast.ImportFrom) and node.module == "runpy":
            found.append((node.lineno, "from runpy import"))
    return found


def offenders(root: Path = ROOT):
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ALLOWED:
                continue
            out += [f"{rel}:{line}: {what}" for line, what in dynamic_code(path)]
    return out


def run_script_users(root: Path = ROOT):
    """The modules, besides its own, that name gc3.dsl.program.run_script."""
    out = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel != "gc3/dsl/program.py" and any(
                    _read_name(node) == "run_script" or isinstance(node, ast.alias) and node.name == "run_script"
                    for node in ast.walk(ast.parse(path.read_text(), str(path)))):
                out.add(rel)
    return out


def test_no_module_makes_code_from_strings_or_runs_files():
    assert offenders() == []


def test_only_the_commands_that_take_a_users_file_run_one():
    assert run_script_users() == RUN_SCRIPT_CALLERS


def test_the_allowed_places_still_run_files():
    # An entry that no longer needs its exception is dropped, so it cannot shelter a new use.
    assert [rel for rel in ALLOWED if not dynamic_code(ROOT / rel)] == []


def test_a_new_use_is_found(tmp_path):
    (tmp_path / "gc3").mkdir()
    (tmp_path / "runtime_cuda").mkdir()
    (tmp_path / "gc3" / "a.py").write_text("import re\nre.compile('x')\nexec(compile('1', 'f', 'exec'))\n")
    (tmp_path / "runtime_cuda" / "b.py").write_text("from runpy import run_path\nimport runpy\nx = eval('1')\n")
    (tmp_path / "runtime_cuda" / "c.py").write_text(
        "import importlib.util\nfrom gc3.dsl.program import run_script\n"
        "spec = importlib.util.spec_from_file_location('m', 'gc3/algorithms/m.py')\nrun_script('m.py')\n")
    assert offenders(tmp_path) == ["gc3/a.py:3: exec()", "gc3/a.py:3: compile()",
                                   "runtime_cuda/b.py:1: from runpy import", "runtime_cuda/b.py:2: import runpy",
                                   "runtime_cuda/b.py:3: eval()", "runtime_cuda/c.py:3: spec_from_file_location"]
    assert run_script_users(tmp_path) == {"runtime_cuda/c.py"}
