"""The one progress report of every command that can take more than a couple of
seconds: on stderr, a bar redrawn in place on a terminal, a line every
LOG_EVERY_S seconds in a log (a file, a pipe, CI), nothing with -q and nothing
at all for work that ends within SHOW_AFTER_S.

Work reports itself as phases ("executing"), each with an optional total
(steps) that `advance` counts towards; a phase without a total shows its
elapsed time.  A background thread draws, so that the work itself only
increments a counter, and a phase that spends its time in one long call
(numpy, the verifier) still shows it is alive.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional

import click

SHOW_AFTER_S = 2.0    # commands that finish sooner print nothing
LOG_EVERY_S = 10.0    # a log gets a line this often
REDRAW_S = 0.25       # a terminal's bar is redrawn this often
BAR_WIDTH = 24

_quiet = [False]


def quiet() -> bool:
    """Whether the running command was given -q (commands with a progress report of their own)."""
    return _quiet[0]


def _set_quiet(ctx, param, value):
    _quiet[0] = bool(value)
    return value


def quiet_option(f):
    """-q/--quiet for a command: no progress on stderr (results and errors still print)."""
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_quiet, is_eager=True,
                        help="Print no progress on stderr.")(f)


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


class Progress:
    """`with Progress("simulate") as p: p.phase("executing", total=n); p.advance()`."""

    def __init__(self, label: str, stream=None, quiet: Optional[bool] = None, tty: Optional[bool] = None):
        self.label = label
        self.stream = stream
        self.quiet = _quiet[0] if quiet is None else quiet
        self.tty = tty
        self.name = "starting"
        self.total: Optional[int] = None
        self.done = 0
        self.start = self.phase_start = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._drawn = False
        self._last_line = None

    # --- what the work calls -------------------------------------------------
    def phase(self, name: str, total: Optional[int] = None) -> None:
        self.name, self.total, self.done = name, total, 0
        self.phase_start = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done += n

    # --- drawing --------------------------------------------------------------
    def __enter__(self) -> "Progress":
        if not self.quiet:
            if self.stream is None:
                self.stream = sys.stderr
            if self.tty is None:
                self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
            self._thread = threading.Thread(target=self._run, name=f"gc3 progress: {self.label}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._drawn and self.tty:
                self._write("\r\033[K")     # the result lines start on a clean line
            elif not self._drawn and not self.tty and time.monotonic() - self.start >= SHOW_AFTER_S:
                self._write(self.text() + "\n")   # it ended between two of the thread's looks

    def text(self) -> str:
        """One status line: label, phase, fraction done, elapsed and estimated time left."""
        now = time.monotonic()
        elapsed = now - self.start
        line = f"{self.label}: {self.name}"
        if self.total:
            frac = min(self.done / self.total, 1.0)
            if self.tty:
                full = int(frac * BAR_WIDTH)
                line += f" [{'#' * full}{'.' * (BAR_WIDTH - full)}]"
            line += f" {frac:4.0%} ({self.done}/{self.total})"
            spent = now - self.phase_start
            if 0.05 < frac < 1 and spent > 1:
                line += f", about {_seconds(spent / frac - spent)} left"
        return line + f", {_seconds(elapsed)} elapsed"

    def _run(self) -> None:
        next_log = SHOW_AFTER_S
        while not self._stop.wait(REDRAW_S if self.tty else min(REDRAW_S * 4, LOG_EVERY_S)):
            elapsed = time.monotonic() - self.start
            if elapsed < SHOW_AFTER_S:
                continue
            if self.tty:
                self._write("\r\033[K" + self.text())
            elif elapsed >= next_log:
                self._write(self.text() + "\n")
                next_log = elapsed + LOG_EVERY_S
            self._drawn = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):      # a closed pipe must not kill the work
            self._stop.set()
