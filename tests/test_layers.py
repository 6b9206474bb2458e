"""Import direction, read from the source (every import, those inside functions too): within
gc3 the stages import in pipeline order, ir -> dsl -> compiler -> verify -> toolchain (the
lowering users call, which needs the verifier) -> simulator -> cli (a module imports its own
stage or a lower one), gc3 never imports runtime_cuda, within runtime_cuda the layers import
core -> ranks -> nccl, fused -> torch_dist, commands, and no two top-level subpackages import
each other in a circle.  Today's exceptions are listed with their
reason, so that only a new one fails."""
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# gc3's stages, lowest first; the root modules (errors, limits, settings, units, ...) are shared
# facts below every stage, except gc3/toolchain.py (gc3.lower), which composes the compiler with
# the verifier and so sits above both; the simulator lowers the programs it is given through it.
# The algorithm library is DSL programs: above the DSL they are written in.
LAYER = {"": 0, "ir": 1, "dsl": 2, "algorithms": 3, "compiler": 3, "verify": 4, "toolchain": 5, "simulator": 6,
         "cli": 7, "benchmarks": 7}
# (importing module, imported stage): why it is allowed for now.
KNOWN_UPWARD = {
    ("gc3.collectives", "ir"): "the users' import path for the collective specifications, which live in ir/",
    ("gc3.topology", "dsl"): "the users' import path for dsl/topology.py",
    ("gc3.__main__", "cli"): "`python -m gc3` runs the command line",
}
# Circles of top-level subpackages that exist today, each with its reason.
KNOWN_CIRCLES = {}

# runtime_cuda's layers, lowest first: core/ (the kernel ABI and build, device tables,
# connections, the launch and the launch group's call path, streams) -> ranks/ (the ways ranks
# run on core's launch group: virtual, CUDA IPC, peer access, and the small-message kernels'
# group) -> nccl/ (the drop-in) and fused/ (the fused operators), which serve calls on ranks ->
# torch_dist/ (the torch.distributed backend), commands/ (the gc3 subcommands) and benchmarks/
# (the developers' benchmarks that scripts/ wraps), which use all of them.  kernels/ holds the
# CUDA sources, no Python.  A new subpackage must be placed here.
RUNTIME_LAYER = {"core": 1, "ranks": 2, "nccl": 3, "fused": 3, "torch_dist": 4, "commands": 4, "benchmarks": 4}
# The package's root, each module placed on its own (a new one must be placed here too).
RUNTIME_ROOT_LAYER = {
    "__init__": 0,      # the package root and measured/'s location: below everything
    "auto": 3,          # swaps runtime_cuda.nccl in under cupy.cuda.nccl: the drop-in's layer
    "candidates": 4,    # the sweep's program configurations, compiled through the drop-in's library
    "calibrate": 4,     # `gc3 calibrate`: fits the cost model to the sweeps of those candidates
    "startup": 4,       # the interpreter-start hook: installs auto and the torch hook
    "__main__": 4,      # `python -m runtime_cuda`: the gc3 command with the runtime's commands
}
# At most this many modules at runtime_cuda's root (not counting __init__ and __main__).
RUNTIME_ROOT_MAX = 8
# (importing module, imported layer's folder or root module): why it is allowed for now.
KNOWN_RUNTIME_UPWARD = {}


def modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        yield ".".join(parts), path, is_package


def imports(name: str, path: Path, is_package: bool):
    """The modules `name` imports, absolute, from its source (function-level imports included)."""
    base = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            stem = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(stem + ([node.module] if node.module else []))
            if node.module:
                yield target
            else:   # from . import x: x is a module of the package
                yield from (f"{target}.{a.name}" for a in node.names)


def edges(packages=("gc3", "runtime_cuda")):
    for package in packages:
        for name, path, is_package in modules(package):
            for target in imports(name, path, is_package):
                if target.split(".")[0] in ("gc3", "runtime_cuda"):
                    yield name, target


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYER) else ""


def upward(pairs):
    found = {}
    for src, dst in pairs:
        if src.startswith("gc3.") and dst.startswith("gc3") and LAYER[stage(dst)] > LAYER[stage(src)]:
            found.setdefault((src, stage(dst)), dst)
    return found


def top(module: str) -> str:
    """The top-level subpackage (gc3.ir, runtime_cuda.nccl); a module at a package's root
    (gc3.errors, runtime_cuda.auto) stands for itself."""
    return ".".join(module.split(".")[:2])


def circles(pairs):
    """Strongly connected groups of more than one top-level subpackage or root module."""
    graph = defaultdict(set)
    for src, dst in pairs:
        if top(src) != top(dst):
            graph[top(src)].add(top(dst))
    nodes = set(graph) | {d for ds in graph.values() for d in ds}
    reach = {}
    for n in nodes:
        seen, todo = set(), [n]
        while todo:
            for d in graph[todo.pop()]:
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        reach[n] = seen
    groups = {frozenset({n} | {m for m in reach[n] if n in reach[m]}) for n in nodes}
    return {g for g in groups if len(g) > 1}


EDGES = list(edges())
RUNTIME_MODULES = {name for name, _, _ in modules("runtime_cuda")}


def runtime_place(module: str, known=None) -> str:
    """The folder (core, nccl, ...) or root module (auto, __init__) of a runtime_cuda module;
    a name a package binds (`from .. import KERNEL_DIR`) is its package's."""
    known = RUNTIME_MODULES if known is None else known
    while module not in known and "." in module:
        module = module.rsplit(".", 1)[0]
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def runtime_layer(module: str, known=None) -> int:
    place = runtime_place(module, known)
    return RUNTIME_LAYER[place] if place in RUNTIME_LAYER else RUNTIME_ROOT_LAYER[place]


def runtime_upward(pairs, known=None):
    found = {}
    for src, dst in pairs:
        if src.startswith("runtime_cuda") and dst.startswith("runtime_cuda") \
                and runtime_layer(dst, known) > runtime_layer(src, known):
            found.setdefault((src, runtime_place(dst, known)), dst)
    return found


def test_gc3_stages_import_in_pipeline_order():
    found = upward(EDGES)
    assert sorted(set(found) - set(KNOWN_UPWARD)) == []


def test_known_exceptions_still_exist():
    """An exception removed from the code is removed from the list, so the list stays the truth."""
    assert sorted(set(KNOWN_UPWARD) - set(upward(EDGES))) == []


def test_verify_imports_nothing_of_the_dsl():
    """The verifier proves an IR from any source (gc3's compiler, msccl-tools' XML): what a
    collective must compute comes from gc3.ir, never from the language that traced it."""
    assert sorted({(s, d) for s, d in EDGES if s.startswith("gc3.verify") and stage(d) == "dsl"}) == []


def test_gc3_imports_collectives_from_where_they_are_defined():
    """gc3.collectives and gc3.dsl.collectives are the users' import paths; gc3's own modules
    (other than those two re-exports) import gc3.ir.collectives."""
    reexports = {"gc3.collectives", "gc3.dsl.collectives"}
    assert sorted({(s, d) for s, d in EDGES if s.startswith("gc3") and s not in reexports
                   and d in reexports}) == []


def test_gc3_never_imports_runtime_cuda():
    assert [(s, d) for s, d in EDGES if s.startswith("gc3") and d.startswith("runtime_cuda")] == []


def test_no_circles_between_top_level_subpackages():
    assert {g for g in circles(EDGES) if g not in KNOWN_CIRCLES} == set()


def test_runtime_layers_import_downward():
    found = runtime_upward(EDGES)
    assert sorted(set(found) - set(KNOWN_RUNTIME_UPWARD)) == []


def test_known_runtime_exceptions_still_exist():
    assert sorted(set(KNOWN_RUNTIME_UPWARD) - set(runtime_upward(EDGES))) == []


def test_every_runtime_folder_and_root_module_has_a_layer():
    folders = {p.parent.name for p in (ROOT / "runtime_cuda").glob("*/__init__.py")}
    roots = {p.stem for p in (ROOT / "runtime_cuda").glob("*.py")}
    assert folders == set(RUNTIME_LAYER)
    assert roots == set(RUNTIME_ROOT_LAYER)
    assert max(RUNTIME_ROOT_LAYER.values()) <= max(RUNTIME_LAYER.values())


def test_runtime_root_holds_few_modules():
    roots = {p.stem for p in (ROOT / "runtime_cuda").glob("*.py")} - {"__init__", "__main__"}
    assert len(roots) <= RUNTIME_ROOT_MAX, sorted(roots)


def test_runtime_kernels_hold_no_python():
    """kernels/ is the CUDA sources, package data: the Python that builds them is core's."""
    assert sorted((ROOT / "runtime_cuda" / "kernels").rglob("*.py")) == []
    assert not (ROOT / "runtime_cuda" / "kernels" / "__init__.py").exists()


def test_a_new_runtime_violation_is_found():
    known = {"runtime_cuda", "runtime_cuda.core", "runtime_cuda.core.tables", "runtime_cuda.ranks",
             "runtime_cuda.ranks.ipc", "runtime_cuda.nccl", "runtime_cuda.nccl.catalog", "runtime_cuda.auto",
             "runtime_cuda.commands", "runtime_cuda.commands.run"}
    assert runtime_upward([("runtime_cuda.core.tables", "runtime_cuda.ranks.ipc")], known) == {
        ("runtime_cuda.core.tables", "ranks"): "runtime_cuda.ranks.ipc"}
    assert runtime_upward([("runtime_cuda.ranks.ipc", "runtime_cuda.auto")], known) == {
        ("runtime_cuda.ranks.ipc", "auto"): "runtime_cuda.auto"}
    assert runtime_upward([("runtime_cuda.nccl.catalog", "runtime_cuda.commands.run")], known)
    assert not runtime_upward([("runtime_cuda.commands.run", "runtime_cuda.nccl.catalog"),
                               ("runtime_cuda.core.tables", "runtime_cuda.KERNEL_DIR"),
                               ("runtime_cuda.ranks.ipc", "runtime_cuda.core.tables")], known)
    assert circles([("runtime_cuda.core.tables", "runtime_cuda.ranks.ipc"),
                    ("runtime_cuda.ranks.ipc", "runtime_cuda.core.abi")]) == {
        frozenset({"runtime_cuda.core", "runtime_cuda.ranks"})}


def test_a_new_violation_is_found():
    assert upward([("gc3.ir.program", "gc3.cli._common")]) == {("gc3.ir.program", "cli"): "gc3.cli._common"}
    assert upward([("gc3.ir.program", "gc3.dsl.program")]) and not upward([("gc3.cli.show", "gc3.ir")])
    assert circles([("gc3.ir.x", "gc3.verify.y"), ("gc3.verify.y", "gc3.ir.z")]) == {
        frozenset({"gc3.ir", "gc3.verify"})}


def test_imports_are_read_relative_and_inside_functions(tmp_path):
    (tmp_path / "m.py").write_text("from ..dsl import program\n\ndef f():\n    from . import layout\n"
                                   "    import gc3.cli\n")
    assert list(imports("gc3.ir.m", tmp_path / "m.py", False)) == ["gc3.dsl", "gc3.ir.layout", "gc3.cli"]


def test_every_launch_group_the_drop_in_serves_from_has_the_one_interface():
    """nccl/gc3_backend.py calls its groups through runtime_cuda.core.group.CollectiveGroup: each
    implementation defines every method of it, taking the Protocol's positional parameters
    first, in its order (further keyword parameters are each implementation's own)."""
    import inspect

    from runtime_cuda.core.group import CollectiveGroup
    from runtime_cuda.ranks.ipc import IpcRanks
    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    def positional(fn):
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    for impl in (IpcRanks, SmallAllreduce):
        for name in ("run_ptrs", "reissue", "close"):
            want, got = positional(getattr(CollectiveGroup, name)), positional(getattr(impl, name))
            assert got[:len(want)] == want, (impl.__name__, name, got, want)
