"""Data-race detection with vector clocks (happens-before, FastTrack style).

Each threadblock is a thread with a vector clock.  Its own entry is the epoch
`step + 1` of the step it is executing; it joins another clock when a step
waits on a dependency (the clock that step had when it completed) and when it
receives a message (the clock of the matched send).  Two accesses to one
memory chunk race when at least one writes and neither happens before the
other.  Flow-control back-pressure of the FIFOs is not counted as ordering:
a schedule that relies on it for memory safety is fragile on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

Location = Tuple[int, str, int]  # (rank, buffer, chunk) as the memory really is


@dataclass(frozen=True)
class Access:
    tid: int        # global threadblock index
    clock: int      # its epoch (step + 1)
    where: str      # "rank R tb T step S (type)"


@dataclass(frozen=True)
class Race:
    location: Location
    kind: str       # "write/write" or "read/write"
    first: str
    second: str

    def __str__(self) -> str:
        r, b, i = self.location
        return (f"{self.kind} race on rank {r} buffer {b!r} chunk {i}: {self.first} and {self.second} "
                "are not ordered by program order, dependencies or send/recv")


class _Cell:
    __slots__ = ("write", "reads")

    def __init__(self):
        self.write: Access = None
        self.reads: Dict[int, Access] = {}


class RaceDetector:
    def __init__(self, max_reports: int = 50):
        self.cells: Dict[Location, _Cell] = {}
        self.races: List[Race] = []
        self.max_reports = max_reports
        self.truncated = 0
        self._seen = set()

    def _report(self, loc: Location, kind: str, earlier: Access, later: Access) -> None:
        key = (loc, earlier.where, later.where)
        if key in self._seen:
            return
        self._seen.add(key)
        if len(self.races) >= self.max_reports:
            self.truncated += 1
            return
        self.races.append(Race(loc, kind, earlier.where, later.where))

    def _cell_after_write_check(self, loc: Location, acc: Access, vc: np.ndarray, kind: str) -> _Cell:
        """The cell of `loc`, reporting its last write if `acc` is not ordered after it."""
        cell = self.cells.get(loc)
        if cell is None:
            cell = self.cells[loc] = _Cell()
        w = cell.write
        if w is not None and w.tid != acc.tid and w.clock > vc[w.tid]:
            self._report(loc, kind, w, acc)
        return cell

    def read(self, loc: Location, acc: Access, vc: np.ndarray) -> None:
        cell = self._cell_after_write_check(loc, acc, vc, "read/write")
        cell.reads[acc.tid] = acc

    def write(self, loc: Location, acc: Access, vc: np.ndarray) -> None:
        cell = self._cell_after_write_check(loc, acc, vc, "write/write")
        for r in cell.reads.values():
            if r.tid != acc.tid and r.clock > vc[r.tid]:
                self._report(loc, "read/write", r, acc)
        cell.write = acc
        cell.reads = {}
