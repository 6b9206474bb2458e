"""The collectives a program traces (`from gc3.dsl.collectives import AllReduce`); defined in
gc3/ir/collectives.py, below the DSL, so that the verifier reads them without the DSL."""
from ..ir.collectives import *  # noqa: F401,F403
from ..ir.collectives import __all__  # noqa: F401
