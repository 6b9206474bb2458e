"""CPU simulator of the XML IR: executes every rank's threadblocks over numpy
buffers exactly as the interpreter kernel will, checks the outputs against
the numpy reference, detects deadlocks and data races, and predicts the run
time with an (uncalibrated) alpha-beta cost model."""
from .driver import Mismatch, Result, load_program, parse_size, simulate

__all__ = ["Mismatch", "Result", "load_program", "parse_size", "simulate"]
