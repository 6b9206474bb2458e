"""Every import of gc3 and runtime_cuda names something that exists, read from the source, so
that a moved or renamed module fails here, on a CPU, and not on a GPU machine: many imports
of the runtime sit inside functions that only a GPU runs, and GPU test programs
(tests/gpu_programs/) never run here at all.

Checked in every .py file of gc3/, runtime_cuda/, tests/ (gpu_programs/ too), scripts/ and
examples/, at module level and inside functions alike:
- `import gc3.x.y`, `from gc3.x import y` and every relative import resolve to a module or
  package of the checkout, and each name taken by `from X import name` is a submodule of X or
  a name X binds at module level (def, class, assignment, import, `global` in a function,
  `__all__`; names X serves lazily through a module `__getattr__` are listed below);
- a dotted reference to gc3 or runtime_cuda in code or in a string (`runtime_cuda.ranks.ipc.IpcRanks`,
  `pytest.importorskip("runtime_cuda.core.tables")`, `__import__("runtime_cuda.core.launcher").launcher.f`)
  names a module, and its next part a name that module binds;
- every `-m gc3...` / `-m runtime_cuda...` in .py, .sh, .md and .toml files, and the startup
  hook's import in gc3_nccl_hook.pth, name a module (a package only with a __main__.py);
- the entry points of pyproject.toml name a module and a name it binds;
- a path `gc3/...` or `runtime_cuda/...` named in a source file or a README exists.
Prose in docstrings, comments and READMEs is held to the same rule as code, so that the
documentation of a module names where it is."""
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gc3", "runtime_cuda")
SOURCE_DIRS = ("gc3", "runtime_cuda", "tests", "scripts", "examples")
TEXT_SUFFIXES = (".py", ".sh", ".md", ".toml")
# Modules that serve names through a module-level __getattr__ (PEP 562): the dict whose keys
# are the names served, or the names themselves.  A new module __getattr__ must be listed here.
LAZY_NAMES = {
    "gc3": "_EXPORTS",                    # the public API, imported on first use
    "runtime_cuda.nccl": "_LAZY",         # the communicator's names, without importing it
    "runtime_cuda.nccl.communicator": ("NcclError",),   # cupy's, imported when asked for
}
# Modules that bind module-level names through globals(): none today; one would be listed here
# with the names it binds.
GLOBALS_NAMES = {}
# Dotted names that are no module, wherever they are written: text -> why.
NOT_MODULES_ANYWHERE = {
    "gc3.commands": "the entry-point group of the runtime's subcommands",
    "gc3.nccl": "the drop-in's logger name",
}
# Dotted names and paths that name no module or file on purpose, in one file: (file, text) -> why.
NOT_MODULES = {
    ("gc3/simulator/calibration.py", "gc3.algorithms.x"): "x stands for any algorithm",
    ("tests/test_layers.py", "gc3.ir.x"): "a made-up module of the layer test's own example",
    ("tests/test_layers.py", "gc3.ir.z"): "a made-up module of the layer test's own example",
    ("tests/test_layers.py", "gc3.ir.m"): "a made-up module of the layer test's own example",
    ("tests/test_layers.py", "gc3.verify.y"): "a made-up module of the layer test's own example",
    ("tests/test_no_dynamic_code.py", "runtime_cuda/b.py"): "a file the test writes under tmp_path",
    ("tests/test_no_dynamic_code.py", "runtime_cuda/c.py"): "a file the test writes under tmp_path",
    ("tests/test_no_dynamic_code.py", "gc3/algorithms/m.py"): "a file the test writes under tmp_path",
    ("tests/test_no_dynamic_code.py", "gc3/a.py"): "a file the test writes under tmp_path",
    ("tests/test_no_issue_references.py", "gc3/x.py"): "a made-up file of the test's own example",
}
# This file: its own examples of what it finds name nothing, on purpose.
SELF = "tests/test_import_targets.py"
# What a path names when it is checked: a folder (ending in /) or a file of these kinds
# (`gc3/cuBLAS`, a ratio in prose, is no path).
PATH_SUFFIXES = (".py", ".cu", ".cuh", ".md", ".csv", ".txt", ".json", ".toml", ".sh", ".xml")
DUNDERS = {"__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__", "__path__",
           "__all__", "__builtins__", "__version__"}


# -- the modules of the checkout ------------------------------------------------------------

def _module_index():
    index = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            index[".".join(parts)] = path
    return index


MODULES = _module_index()


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def source_files():
    for folder in SOURCE_DIRS:
        yield from sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def text_files():
    seen = set()
    for folder in SOURCE_DIRS + (".ci",):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and (path.suffix in TEXT_SUFFIXES or folder == ".ci") and "__pycache__" not in path.parts:
                seen.add(path)
    seen |= {p for p in ROOT.glob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + (".pth",)}
    return sorted(seen)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@functools.lru_cache(maxsize=None)
def tree_of(path: Path):
    return ast.parse(path.read_text(), str(path))


def _targets(node):
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _module_level(body):
    """The statements run at module level: into if/try/with/for/while, not into defs or classes."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _module_level(getattr(node, field, []) or [])
        for handler in getattr(node, "handlers", []) or []:
            if handler.name:
                yield ast.Name(id=handler.name)
            yield from _module_level(handler.body)


@functools.lru_cache(maxsize=None)
def names_of(module: str) -> frozenset:
    """The names `module` binds at module level (its submodules not included)."""
    path = MODULES[module]
    tree = tree_of(path)
    names = set(DUNDERS)
    for node in _module_level(tree.body):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(_targets(target))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets) \
                    and isinstance(node.value, (ast.List, ast.Tuple)):
                names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            names.update(_targets(node.target))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            names.update(_targets(node.target))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    names.update(_targets(item.optional_vars))
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    target = resolve_from(module, path, node)
                    if target in MODULES:
                        names.update(n for n in names_of(target) if not n.startswith("_"))
                else:
                    names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    lazy = LAZY_NAMES.get(module, ())
    if isinstance(lazy, str):
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == lazy for t in node.targets):
                names.update(k.value for k in node.value.keys)
    else:
        names.update(lazy)
    names.update(GLOBALS_NAMES.get(module, ()))
    return frozenset(names)


def module_of(path: Path):
    """(module name, is a package) of a file of gc3/ or runtime_cuda/; (None, False) elsewhere."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] not in PACKAGES:
        return None, False
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def resolve_from(module, path: Path, node: ast.ImportFrom):
    """The absolute module a `from ... import` reads from; None for a relative import outside a package."""
    if not node.level:
        return node.module
    name, package = module_of(path)
    if name is None:
        return None
    base = name.split(".") if package else name.split(".")[:-1]
    if node.level - 1 > len(base) - 1:
        return None
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def ours(name) -> bool:
    return bool(name) and name.split(".")[0] in PACKAGES


def check_reference(dotted: str):
    """None when `dotted` (a.b.c) names a module of the checkout, or a module and then a name it
    binds; else what is wrong.  Parts after the first name are attributes of it, not checked."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in MODULES:
            if n == len(parts) or parts[n] in names_of(head):
                return None
            return f"{head} has no module or name {parts[n]!r}"
    return f"no module {parts[0]!r}"


# -- imports ----------------------------------------------------------------------------------

def import_problems(path: Path, tree=None):
    module, _ = module_of(path)
    for node in ast.walk(tree or tree_of(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name) and alias.name not in MODULES:
                    yield node.lineno, f"import {alias.name}: no such module"
        elif isinstance(node, ast.ImportFrom):
            target = resolve_from(module, path, node)
            shown = "." * node.level + (node.module or "")
            if node.level and target is None:
                yield node.lineno, f"from {shown} import: a relative import outside a package"
                continue
            if not ours(target):
                continue
            if target not in MODULES:
                yield node.lineno, f"from {shown} import: no module {target}"
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                sub = f"{target}.{alias.name}"
                if sub not in MODULES and alias.name not in names_of(target):
                    yield node.lineno, f"from {shown} import {alias.name}: {target} has no module or name {alias.name!r}"


def _dotted(node):
    """`a.b.c` for an attribute chain read from a name, or from __import__("a.b") (which returns a)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
          and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        parts.append(node.args[0].value.split(".")[0])
    else:
        return None
    return ".".join(reversed(parts))


def _shadowed(tree):
    """Whether the file binds the name gc3 or runtime_cuda to something other than the package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.alias) and node.asname in PACKAGES:
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in PACKAGES:
            return True
        if isinstance(node, ast.arg) and node.arg in PACKAGES:
            return True
    return False


STRING_REF = re.compile(r"^((?:gc3|runtime_cuda)(?:\.[A-Za-z_]\w*)+)(?::(\w+))?$")


def not_a_module(path: Path, text: str) -> bool:
    return text in NOT_MODULES_ANYWHERE or (rel(path), text) in NOT_MODULES


def code_reference_problems(path: Path):
    """Attribute chains (`runtime_cuda.core.streams.current`) and dotted strings
    (`"runtime_cuda.core.tables"`, `"pkg.mod:attr"`) of a Python file."""
    if rel(path) == SELF:
        return
    tree = tree_of(path)
    shadowed = _shadowed(tree)
    seen = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not shadowed:
            dotted = _dotted(node)
            if dotted and ours(dotted) and dotted not in seen:
                # a chain is checked once, from its longest form
                seen.update(".".join(dotted.split(".")[:n]) for n in range(1, dotted.count(".") + 2))
                problem = check_reference(dotted)
                if problem:
                    yield node.lineno, f"{dotted}: {problem}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = STRING_REF.match(node.value)
            if m and not not_a_module(path, m.group(1)):
                problem = check_reference(m.group(1) + (f".{m.group(2)}" if m.group(2) else ""))
                if problem:
                    yield node.lineno, f"{node.value!r}: {problem}"


def test_every_import_resolves():
    found = [f"{rel(p)}:{line}: {what}" for p in source_files() for line, what in import_problems(p)]
    assert found == []


def test_every_dotted_reference_in_code_resolves():
    found = [f"{rel(p)}:{line}: {what}" for p in source_files() for line, what in code_reference_problems(p)]
    assert found == []


# -- text: -m, entry points, prose --------------------------------------------------------------

RUN_MODULE = re.compile(r"""-m["']?\s*,?\s*["']?((?:gc3|runtime_cuda)(?:\.\w+)*)""")
PROSE_REF = re.compile(r"(?<![\w./-])((?:gc3|runtime_cuda)(?:\.[A-Za-z_]\w*)+)")
PATH_REF = re.compile(r"(?<![\w./-])((?:gc3|runtime_cuda)/[\w./*-]*)")


def _placeholder(dotted: str) -> bool:
    """`gc3.algorithms.NAME`: a part in capitals stands for any module."""
    return any(p.isupper() for p in dotted.split("."))


def run_module_problems(path: Path):
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        for m in RUN_MODULE.finditer(line):
            name = m.group(1)
            if _placeholder(name):
                continue
            if name not in MODULES:
                yield lineno, f"-m {name}: no such module"
            elif is_package(name) and f"{name}.__main__" not in MODULES:
                yield lineno, f"-m {name}: a package without __main__.py"


def test_every_run_module_resolves():
    found = [f"{rel(p)}:{line}: {what}" for p in text_files() for line, what in run_module_problems(p)]
    assert found == []


def test_the_startup_hook_imports_a_module():
    text = (ROOT / "gc3_nccl_hook.pth").read_text()
    named = re.findall(r"""__import__\(["']([\w.]+)["']\)""", text)
    assert named and [n for n in named if n not in MODULES] == []


def test_every_entry_point_resolves():
    text = (ROOT / "pyproject.toml").read_text()
    points = []
    for section in re.split(r"^\[", text, flags=re.M):
        header = section.split("]")[0]
        if header == "project.scripts" or header.startswith("project.entry-points"):
            points += re.findall(r'^\S+\s*=\s*"([\w.]+):(\w+)"', section, re.M)
    assert len(points) >= 7
    assert [f"{m}:{a}" for m, a in points if m not in MODULES or a not in names_of(m)] == []


def prose_problems(path: Path):
    """Dotted module references and gc3/, runtime_cuda/ paths in any text (docstrings, comments,
    READMEs, shell scripts)."""
    if rel(path) == SELF:
        return
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        for m in PROSE_REF.finditer(line):
            dotted = m.group(1).rstrip(".")
            if _placeholder(dotted) or not_a_module(path, dotted):
                continue
            problem = check_reference(dotted)
            if problem:
                yield lineno, f"{dotted}: {problem}"
        for m in PATH_REF.finditer(line):
            named = m.group(1).rstrip(".")
            if not_a_module(path, named) or "*" in named or "NAME" in named \
                    or not (named.endswith("/") or named.endswith(PATH_SUFFIXES)):
                continue
            if not (ROOT / named).exists():
                yield lineno, f"{named}: no such file or folder"


def test_every_module_and_path_named_in_text_exists():
    found = [f"{rel(p)}:{line}: {what}" for p in text_files() for line, what in prose_problems(p)]
    assert found == []


# -- the checks find what they are for ----------------------------------------------------------

def test_a_module_getattr_or_globals_binding_is_listed():
    found = set()
    for module, path in MODULES.items():
        tree = tree_of(path)
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            found.add((module, "__getattr__"))
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "globals"
               for n in ast.walk(tree)):
            found.add((module, "globals"))
    listed = {(m, "__getattr__") for m in LAZY_NAMES} | {(m, "globals") for m in GLOBALS_NAMES}
    assert found == listed


def test_a_missing_module_or_name_is_found():
    here = ROOT / "runtime_cuda" / "nccl" / "made_up.py"
    tree = ast.parse("import runtime_cuda.no_such\nfrom runtime_cuda.nccl import constants, no_such_name\n"
                     "def f():\n    from ..nccl import no_such_either\n    from . import catalog\n"
                     "    from .. import measured_file\n    from ...x import y\n")
    assert [what for _, what in import_problems(here, tree)] == [
        "import runtime_cuda.no_such: no such module",
        "from runtime_cuda.nccl import no_such_name: runtime_cuda.nccl has no module or name 'no_such_name'",
        "from ..nccl import no_such_either: runtime_cuda.nccl has no module or name 'no_such_either'",
        "from ...x import: a relative import outside a package"]


def test_a_stale_reference_is_found():
    assert check_reference("runtime_cuda.nccl.catalog") is None
    assert check_reference("runtime_cuda.measured_file") is None
    assert check_reference("gc3.lower") is None           # served by gc3's __getattr__
    assert check_reference("runtime_cuda.nccl.no_such") == "runtime_cuda.nccl has no module or name 'no_such'"
    assert check_reference("runtime_cuda_x.y") == "no module 'runtime_cuda_x'"
    assert RUN_MODULE.findall('x -m runtime_cuda.auto y, [sys.executable, "-m", "runtime_cuda.commands.fuzz"]') == [
        "runtime_cuda.auto", "runtime_cuda.commands.fuzz"]


@pytest.mark.parametrize("dotted", ["gc3.ir", "gc3.dsl.program", "runtime_cuda.nccl", "runtime_cuda.__main__"])
def test_the_index_knows_the_packages(dotted):
    assert dotted in MODULES


def test_every_kernel_source_runtime_cuda_names_is_in_its_kernel_folder():
    """The CUDA files runtime_cuda's modules read (`source("avg_pass.cu")`, "common.cuh") are
    found through runtime_cuda.KERNEL_DIR wherever the module sits."""
    from runtime_cuda import KERNEL_DIR

    named = {node.value for path in (ROOT / "runtime_cuda").rglob("*.py") for node in ast.walk(tree_of(path))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and re.fullmatch(r"\w+\.cuh?", node.value)}
    assert {"interpreter.cu", "common.cuh", "avg_pass.cu", "small_allreduce.cu"} <= named
    assert sorted(n for n in named if not (KERNEL_DIR / n).is_file()) == []


def test_no_module_of_runtime_cuda_locates_files_from_its_own_path():
    """Files are found from the package root that runtime_cuda/__init__.py names once (or from
    another package's __file__), so that a module can move between subpackages; the drop-in's
    catalog looks for the checkout's ir_samples/ beside its installed path on purpose (a test
    moves its __file__ to check that search)."""
    allowed = {"runtime_cuda/__init__.py", "runtime_cuda/nccl/catalog.py"}
    found = sorted(rel(path) for path in (ROOT / "runtime_cuda").rglob("*.py")
                   if any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(tree_of(path))))
    assert [f for f in found if f not in allowed] == []
