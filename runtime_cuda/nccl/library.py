"""The algorithm library (the package gc3.algorithms) as the catalog builders see it:
every algorithm there, the collective it implements (its name's first word), what
its positional arguments are, and which need a power-of-two rank count.

Each module's docstring documents its arguments and the `int_args(...)` call of its main()
reads them; their names and order are read from that call in the module's source
(`Algorithm.params`), so `gc3 catalog build` and `gc3 tune` build argument lists by name and
never by position, and a module that changes its arguments changes them here.  Arguments
not given take the defaults written in that same call.

Argument names: ranks N; nodes and gpus (N x G programs: ranks = nodes * gpus);
chunks C (files that say chunk_factor); root; inplace (0/1); instances,
channels (`gc3.lower(instances=)` overrides instances anyway).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, Optional, Tuple

import gc3.algorithms
from gc3.errors import InputError


def algorithms_dir() -> Path:
    """The algorithm library's source folder, a checkout's or an installed wheel's alike: its
    modules' arguments are read from their source, which is parsed there, never run."""
    return Path(gc3.algorithms.__file__).resolve().parent


ALGORITHMS_DIR = algorithms_dir()

PARAMS = ("ranks", "nodes", "gpus", "chunks", "root", "inplace", "instances", "channels")
_SPELLINGS = {"chunk_factor": "chunks"}     # one name per meaning across the files


@lru_cache(maxsize=None)
def _int_args(path: Path) -> Tuple[Tuple[str, int], ...]:
    """(name, default) of each keyword of the `int_args(...)` call in `path`, in order."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as exc:
        raise InputError(f"{path}: cannot read its arguments: {exc}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "int_args":
            names = tuple(_SPELLINGS.get(k.arg, k.arg) for k in node.keywords)
            unknown = [n for n in names if n not in PARAMS]
            if unknown:
                raise InputError(f"{path}: int_args names {', '.join(unknown)}, which the catalog builders do not "
                                 f"know (runtime_cuda/nccl/library.py PARAMS: {', '.join(PARAMS)})")
            defaults = [k.value.value if isinstance(k.value, ast.Constant) and type(k.value.value) is int else None
                        for k in node.keywords]
            odd = [n for n, d in zip(names, defaults) if d is None]
            if odd:
                raise InputError(f"{path}: int_args gives {', '.join(odd)} a default that is not a literal int")
            return tuple(zip(names, defaults))
    raise InputError(f"{path}: no int_args(...) call, so its arguments are unknown")


POWER_OF_TWO = frozenset({"allreduce_recursive_doubling", "allgather_recursive_doubling",
                          "reducescatter_recursive_halving"})
PIPELINED = frozenset({"broadcast_ring", "broadcast_tree", "reduce_ring"})   # chunks fill a pipeline: tune them


@dataclass(frozen=True)
class Algorithm:
    name: str                      # gc3.algorithms.<name>

    @property
    def collective(self) -> str:
        """As the IR's coll names it: the files are named <collective>_<how>.py."""
        return self.name.split("_")[0]

    @property
    def power_of_two(self) -> bool:
        return self.name in POWER_OF_TWO

    @property
    def pipelined(self) -> bool:
        return self.name in PIPELINED

    @property
    def params(self) -> Tuple[str, ...]:
        """Its positional arguments, in order (names from PARAMS)."""
        if not self.path.is_file():
            raise InputError(f"{self.path}: the source of gc3.algorithms.{self.name} is not there, and its "
                             "arguments are read from it")
        return tuple(name for name, _ in _int_args(self.path))

    @property
    def multinode(self) -> bool:
        return self.params[:2] == ("nodes", "gpus")

    @property
    def path(self) -> Path:
        return ALGORITHMS_DIR / f"{self.name}.py"

    def argv(self, **values: int) -> Tuple[int, ...]:
        """The positional arguments for `values` by name: the shortest prefix of
        `params` that holds every given value, the file's own defaults filling gaps."""
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            raise InputError(f"{self.name} takes {', '.join(self.params)}; not {', '.join(unknown)}")
        last = max((self.params.index(k) for k in values), default=-1)
        return tuple(int(values.get(name, default)) for name, default in _int_args(self.path)[:last + 1])

    def fits(self, ranks: int, nodes: int = 1) -> bool:
        """Whether the program exists for `ranks` ranks on `nodes` nodes."""
        if ranks < 2 or ranks % nodes:
            return False
        if self.multinode:
            return nodes > 1
        return not self.power_of_two or ranks & (ranks - 1) == 0


# Every algorithm of gc3.algorithms (not its fused ones) is in the library; its collective is its
# name's first word.
ALGORITHMS: Dict[str, Algorithm] = {name: Algorithm(name) for name in gc3.algorithms.names()}


def algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise InputError(f"no algorithm {name!r} in the library (known: {', '.join(ALGORITHMS)})") from None


def args(name: str, **values: int) -> Tuple[str, Tuple[int, ...]]:
    """(name, positional arguments): `args("reducescatter_ring", ranks=4, chunks=1, inplace=1)`."""
    return name, algorithm(name).argv(**values)


def compile_program(name: str, argv: Tuple[int, ...], instances: Optional[int] = None,
                    protocol: Optional[str] = None, fusion: Optional[bool] = None):
    """(traced GC3Program, lowered ir.Program) of gc3.algorithms.<name> with command-line
    arguments `argv`, through gc3's public entry points; GC3Error when it does not trace or lower.
    `fusion` False compiles without instruction fusion (gc3.lower's instr_fusion)."""
    from gc3 import lower

    traced = gc3.algorithms.trace(algorithm(name).name, argv)
    return traced, lower(traced, instances=instances, protocol=protocol, instr_fusion=fusion)
