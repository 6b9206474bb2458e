"""The `gc3` subcommands that need this runtime (`run`, `bench`, `catalog`, `tune`, `fuzz`,
`calibrate`), one module each.

pyproject.toml declares them under the entry-point group `gc3.commands`; the
`gc3` command line adds every command of that group when it starts, so gc3
itself never imports runtime_cuda."""


def cli():
    """gc3's command line with this runtime's commands added, also where the
    package metadata that carries the entry points is not installed (a source
    checkout on PYTHONPATH, as on the GPU machines): `python -m runtime_cuda
    run ...` is `gc3 run ...` there."""
    import pkgutil
    from importlib import import_module

    from gc3.cli import main

    for info in pkgutil.iter_modules(__path__):
        if info.name not in main.commands:
            main.add_command(import_module(f"{__name__}.{info.name}").command, info.name)
    return main
