"""Every error gc3 raises on purpose.

Each subclass exists so that callers (and tests) can tell failures apart; the
message always names *where* (user file:line, or rank/TB/step, or XML line)
and *what* (rank, buffer, index) went wrong.
"""


class GC3Error(Exception):
    """Base class of all gc3 errors."""


class InputError(GC3Error):
    """A file, attribute, option or environment variable gc3 cannot accept; the
    message names it and says what was expected."""


# Exit statuses of the command line, one meaning each.
EXIT_WRONG = 1        # the program was read and is wrong (verification, simulation)
EXIT_BAD_INPUT = 2    # the input could not be read or used (as click's usage errors)
EXIT_UNPROVABLE = 3   # a custom collective's IR with no postcondition: neither right nor wrong


def exit_status(exc: "GC3Error") -> int:
    if isinstance(exc, PostconditionUnprovableError):
        return EXIT_UNPROVABLE
    if isinstance(exc, (InputError, IRFormatError, TraceError)):
        return EXIT_BAD_INPUT
    return EXIT_WRONG


# --- tracing (DSL) -------------------------------------------------------
class TraceError(GC3Error):
    """A misuse of the DSL found while tracing a program."""


class UninitializedChunkError(TraceError):
    pass


class StaleReferenceError(TraceError):
    pass


class IndexOutOfRangeError(TraceError):
    pass


class CountMismatchError(TraceError):
    pass


class TopologyError(TraceError):
    pass


class PostconditionError(GC3Error):
    """The traced program does not implement its collective."""


# --- lowering / scheduling -----------------------------------------------
class LoweringError(GC3Error):
    pass


class ScheduleError(LoweringError):
    """An illegal manual channel/threadblock assignment or an impossible schedule."""


class TooManyThreadblocks(ScheduleError):
    """The schedule needs more threadblocks per rank than the runtime allows:
    `per_instance` of them times the instance count exceeds `max_tbs`."""

    def __init__(self, message: str, per_instance: int, max_tbs: int):
        super().__init__(message)
        self.per_instance, self.max_tbs = per_instance, max_tbs


# --- IR -------------------------------------------------------------------
class IRFormatError(InputError):
    """Malformed XML IR: names the element, attribute and line."""


class VerificationError(GC3Error):
    """A scheduled IR that is wrong or unsafe (deadlock, FIFO order, limits)."""


class DeadlockError(VerificationError):
    pass


class IRStructureError(VerificationError):
    """Ids, peers, dependencies or operands that cannot describe a runnable schedule."""


class UnmatchedTransferError(VerificationError):
    """A connection whose sends and receives do not pair up one to one."""


class FifoOrderError(VerificationError):
    """The k-th receive on a connection does not fit the k-th send (count or operands)."""


class LimitError(VerificationError):
    """A schedule beyond what the runtime is built for (`gc3.limits`)."""


class SemanticError(VerificationError):
    """The IR does not compute its collective's postcondition (names rank, chunk and writer)."""


class UnwrittenReadError(SemanticError):
    """A step reads a chunk slot that nothing has written."""


class DuplicateContributionError(SemanticError):
    """A reduction adds an input chunk into a value that already contains it."""


class RaceError(SemanticError):
    """Two accesses of one slot, at least one a write, that nothing orders."""


class PostconditionUnprovableError(VerificationError):
    """A custom collective's IR that carries no postcondition: nothing to prove it against."""


class NotOnDeviceError(InputError):
    """An IR with steps the runtime has no opcode for (a compute step); the simulator runs it."""


class LayoutError(InputError):
    """A call size that the IR's chunk layout cannot serve."""


# --- execution ------------------------------------------------------------
class SimulationError(GC3Error):
    pass


class SizeError(InputError, SimulationError, ValueError):
    """A byte size or element count that cannot be read or is beyond gc3.limits
    (a ValueError too, so that option parsers take it as a bad value)."""


class RuntimeTimeoutError(GC3Error):
    """A GPU wait exceeded GC3_TIMEOUT_S; the message names rank, TB, step and the wait."""


class CommunicatorError(GC3Error):
    """A communicator call gc3 cannot accept (unknown dtype/op code, bad count,
    root or buffer); the message names the rank and the call."""
