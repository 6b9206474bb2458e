"""The collectives users import (`from gc3.collectives import AllReduce`); defined in gc3/dsl/collectives.py."""
from .dsl.collectives import *  # noqa: F401,F403
from .dsl.collectives import __all__  # noqa: F401
