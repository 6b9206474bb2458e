"""The packages hold their code as source: no module of gc3 or runtime_cuda builds code from
strings (exec, eval, the compile builtin) or runs a file with runpy, apart from the places that
run a program file on purpose, listed with their reason.  Code made at import time hides from a
reader, from grep, from the linters and from a traceback's source lines."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gc3", "runtime_cuda")
BUILTINS = {"exec", "eval", "compile"}
# path -> why it runs a program file.
ALLOWED = {
    "gc3/dsl/program.py": "run_script: runs a gc3 DSL program file as __main__ (`gc3 trace FILE.py`, "
                          "`gc3 compile FILE.py`, and the algorithm library's files)",
    "runtime_cuda/auto.py": "`python -m runtime_cuda.auto SCRIPT`: runs the user's program under the drop-in",
    "runtime_cuda/fused/schedule.py": "runs the fused GEMM programs of the shipped algorithm library "
                                      "(algorithms/fused/*.py)",
    "runtime_cuda/fused/memory_bound.py": "runs the fused memory-bound programs of the shipped algorithm "
                                          "library (algorithms/fused/*.py)",
}


def dynamic_code(path: Path):
    """(line, what) of every exec/eval/compile call and every use of runpy in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILTINS:
            found.append((node.lineno, f"{node.func.id}()"))
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


def test_no_module_makes_code_from_strings_or_runs_files():
    assert offenders() == []


def test_the_allowed_places_still_run_files():
    # An entry that no longer needs its exception is dropped, so it cannot shelter a new use.
    assert [rel for rel in ALLOWED if not dynamic_code(ROOT / rel)] == []


def test_a_new_use_is_found(tmp_path):
    (tmp_path / "gc3").mkdir()
    (tmp_path / "runtime_cuda").mkdir()
    (tmp_path / "gc3" / "a.py").write_text("import re\nre.compile('x')\nexec(compile('1', 'f', 'exec'))\n")
    (tmp_path / "runtime_cuda" / "b.py").write_text("from runpy import run_path\nimport runpy\nx = eval('1')\n")
    assert offenders(tmp_path) == ["gc3/a.py:3: exec()", "gc3/a.py:3: compile()",
                                   "runtime_cuda/b.py:1: from runpy import", "runtime_cuda/b.py:2: import runpy",
                                   "runtime_cuda/b.py:3: eval()"]
