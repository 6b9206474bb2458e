"""GC3_TORCH=1: an unchanged script's backend="nccl" runs on gc3.

The startup hook must not import torch (most programs never use it, and it
takes seconds), so `install()` only puts a finder on sys.meta_path; when
torch.distributed.distributed_c10d is first imported, the finder lets it load
and then wraps `init_process_group` and `new_group` there and in
torch.distributed, and registers the gc3 backend.  A script that bound the
names before the hook ran (impossible from the startup hook) keeps torch's.
"""
from __future__ import annotations

import functools
import importlib.abc
import sys

from . import names

TARGET = "torch.distributed.distributed_c10d"
_PATCHED = ("init_process_group", "new_group")


def _swapped(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from . import register
        register()
        # backend is the first positional argument of init_process_group, and a
        # keyword of new_group (its first positional is ranks).
        if fn.__name__ == "init_process_group" and args:
            args = (names.swap_nccl(args[0]),) + args[1:]
        elif fn.__name__ == "init_process_group" or "backend" in kwargs:
            kwargs["backend"] = names.swap_nccl(kwargs.get("backend"))
        return fn(*args, **kwargs)

    wrapper._gc3_original = fn
    return wrapper


def patch(module=None) -> None:
    """Wrap the names in torch.distributed (idempotent)."""
    if module is None:
        import torch.distributed.distributed_c10d as module
    import torch.distributed as dist

    for name in _PATCHED:
        fn = getattr(module, name)
        if not hasattr(fn, "_gc3_original"):
            wrapped = _swapped(fn)
            setattr(module, name, wrapped)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, wrapped)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                run = loader.exec_module

                def exec_module(module, _run=run):
                    _run(module)
                    _after_load(module)

                loader.exec_module = exec_module
                return spec
        return None


def _after_load(module) -> None:
    # Runs while torch.distributed is still importing (it re-exports these
    # names right after this module loads, so it picks up the wrappers); gc3's
    # backend, which needs all of torch.distributed, registers at the first call.
    try:
        for name in _PATCHED:
            fn = getattr(module, name)
            if not hasattr(fn, "_gc3_original"):
                setattr(module, name, _swapped(fn))
        _remove()
    except Exception as exc:  # noqa: BLE001 -- the user's program must go on, on NCCL
        print(f"gc3: GC3_TORCH is set but the torch backend could not be installed "
              f"({type(exc).__name__}: {exc}); running on NCCL", file=sys.stderr)


def _remove() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def install() -> None:
    """Patch now if torch.distributed is loaded, else when it gets imported."""
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
