"""`python -m runtime_cuda ARGS` = `gc3 ARGS` with the runtime's commands, installed or not."""
from .commands import cli

cli()(prog_name="gc3")
