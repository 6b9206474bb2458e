"""CPU simulator of the XML IR: executes every rank's threadblocks over numpy
buffers exactly as the interpreter kernel will, checks the outputs against
the numpy reference, detects deadlocks and data races, and predicts the run
time with a tile-level cost model (calibrated for H200 NVLink)."""
from .driver import Mismatch, Result, TimedProgram, load_program, simulate

__all__ = ["Mismatch", "Result", "TimedProgram", "load_program", "simulate"]
