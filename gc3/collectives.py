"""The collectives users import (`from gc3.collectives import AllReduce`); defined in gc3/ir/collectives.py."""
from .ir.collectives import *  # noqa: F401,F403
from .ir.collectives import __all__  # noqa: F401
