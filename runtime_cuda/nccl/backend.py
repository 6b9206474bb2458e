"""The seam between the communicator and gc3's CUDA runtime.

A backend answers three questions for the dispatcher:

    check(candidate, call) -> None | reason   can the runtime run this at all?
    prepare(decision)      -> None | reason   collective set-up (IPC peers,
                                               scratch, tables); every rank
                                               learns every rank's outcome, so
                                               all take the same path
    run(decision)                             enqueue on the call's stream
    check_async_error(), close(), abandon()   NCCL's counterparts (abandon: after abort)

`make_backend` builds the real one when the runtime imports, and otherwise an
`Unavailable` backend whose reason shows up in the GC3_DEBUG=INFO log as the
`runtime` field of every candidate that matched everything else.
"""
from __future__ import annotations

from typing import Callable, Optional

from gc3.errors import CommunicatorError

from .call import Call
from .catalog import Candidate
from .selection import Decision


class Unavailable:
    """A backend that serves nothing, and says why."""

    def __init__(self, reason: str):
        self.reason = reason

    def check(self, candidate: Candidate, call: Call) -> Optional[str]:
        return self.reason

    def prepare(self, decision: Decision) -> Optional[str]:
        return self.reason

    def run(self, decision: Decision) -> None:
        raise CommunicatorError(f"gc3 runtime asked to run {decision.call.describe()} but {self.reason}")

    def check_async_error(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        pass


def unavailable_backend(reason: str) -> Callable:
    return lambda exchange, rank, size, device, catalog=None: Unavailable(reason)


def make_backend(exchange, rank: int, size: int, device: int, catalog=None):
    """`exchange`: the rendezvous between the ranks (rendezvous.NcclExchange or MpiExchange);
    `catalog`: what calls may select (it sizes the small-message kernels' scratch)."""
    try:
        from .gc3_backend import Gc3Backend
    except ImportError as exc:
        return Unavailable(f"gc3 CUDA runtime cannot load ({exc})")
    return Gc3Backend(exchange, rank, size, device, catalog)
