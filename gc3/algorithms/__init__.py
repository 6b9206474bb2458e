"""The algorithm library: gc3's own collective algorithms, one DSL program a module
(`fused`: those that fuse compute into the collective).

Module NAME defines NAME(...), which traces the program for its parameters, and
main(argv), which reads those parameters from command-line ints (the module's docstring lists
them with their defaults).  So each module is also a program file, as a user's is:
`python -m gc3.algorithms.allreduce_ring 4` traces and checks it, and from a checkout
`gc3 compile gc3/algorithms/allreduce_ring.py 4 -o ring.xml` lowers it.

gc3's own callers (the catalog builders, `gc3 tune`, the fused operators) import the modules
through `trace` and `builder`: only a user's file is run by path, so the library's code is what
a reader, a linter and a traceback see.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Callable, List, Sequence

from ..errors import GC3Error, InputError

if TYPE_CHECKING:
    from ..dsl.program import GC3Program


def names(package: str = "") -> List[str]:
    """The algorithms of the library, sorted; package "fused": the fused ones (as "fused.NAME")."""
    pkg = importlib.import_module(f"{__name__}.{package}" if package else __name__)
    prefix = f"{package}." if package else ""
    return sorted(prefix + m.name for m in pkgutil.iter_modules(pkg.__path__)
                  if not m.ispkg and not m.name.startswith("_"))


def module(name: str):
    """The module of algorithm `name`: "allreduce_ring", or "fused.gemm_allreduce"."""
    full = f"{__name__}.{name}"
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise InputError(f"{name!r} names no algorithm of {__name__}")
    try:
        found = importlib.import_module(full)
    except ModuleNotFoundError as exc:
        # Only the algorithm itself missing is the caller's mistake; a module it imports missing is not.
        if exc.name is None or not (full == exc.name or full.startswith(exc.name + ".")):
            raise
        try:
            known = names(name.rpartition(".")[0])
        except ModuleNotFoundError:
            known = names()
        raise InputError(f"no algorithm {name!r} in {__name__} (known: {', '.join(known)})") from None
    if not callable(getattr(found, "main", None)):
        raise InputError(f"{full} is not an algorithm (a module with main(argv))")
    return found


def builder(name: str) -> Callable[..., "GC3Program"]:
    """The function of algorithm `name` that traces its program from its parameters:
    `builder("fused.gemm_allreduce")(2, 4, 1, 1, 1)`."""
    return getattr(module(name), name.rpartition(".")[2])


def trace(name: str, argv: Sequence = ()) -> "GC3Program":
    """The program algorithm `name` traces for the command-line arguments `argv`, as
    `python -m gc3.algorithms.NAME ARGS` would.  Like a program file run by `gc3 trace`, an
    exception other than a GC3Error becomes an InputError that names the call."""
    args = [str(a) for a in argv]
    main = module(name).main
    try:
        return main(args)
    except GC3Error:
        raise
    except Exception as exc:
        call = " ".join([f"{__name__}.{name}", *args])
        raise InputError(f"{call}: the program raised {type(exc).__name__}: {exc}") from None
