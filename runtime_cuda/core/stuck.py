"""Ending a process whose GPU work will not finish, with a message saying what.

A kernel that never completes (a peer that never arrives, a library that
waits forever) leaves every host synchronization blocked, and nothing can
cancel it from the host, so the only way not to hang silently is a timer
thread that names what was running and ends the process.  The status is one
value for every gc3 tool, so scripts driving them under mpirun can tell a hang
from a failure.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_STUCK = 3


def end_process(message: str, stacks: bool = True) -> None:
    """Print `message` (and every thread's host stack), then exit with EXIT_STUCK
    without running cleanups: they would synchronize with the stuck GPU work."""
    print(message, file=sys.stderr, flush=True)
    if stacks:
        faulthandler.dump_traceback(all_threads=True)
    os._exit(EXIT_STUCK)


@contextmanager
def deadline(seconds: float, message: str) -> Iterator[None]:
    """Run the body; if it has not finished after `seconds`, end the process
    with `message`.  seconds <= 0: no deadline."""
    if seconds <= 0:
        yield
        return
    timer = threading.Timer(seconds, end_process, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
