"""The `gc3` subcommands that need this runtime (`run`, `bench`, `catalog`).

pyproject.toml declares them under the entry-point group `gc3.commands`; the
`gc3` command line adds every command of that group when it starts, so gc3
itself never imports runtime_cuda."""
