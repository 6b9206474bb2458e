"""`ChunkRef`: a reference to `count` contiguous chunks of one rank's buffer.

A reference remembers the version of each slot it covers when it was made, so
that using it after another operation overwrote one of them is caught
(`StaleReferenceError`) instead of silently moving other data.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..errors import CountMismatchError, StaleReferenceError, TopologyError, TraceError
from ..units import as_int, user_location
from .ops import Slot
from .tracing import _tracing, canonical_buffer


def _schedule_hint(what: str, value, where: str) -> Optional[int]:
    # msccl-tools uses -1 for "let the compiler choose".
    if value is None or (isinstance(value, int) and value == -1):
        return None
    return as_int(value, what, 0, where)


class ChunkRef:
    __slots__ = ("prog", "rank", "buffer", "index", "count", "_versions", "made_at")

    def __init__(self, prog: "GC3Program", rank: int, buffer: str, index: int, count: int,
                 versions: Tuple[int, ...], made_at: str):
        self.prog = prog
        self.rank = rank
        self.buffer = buffer
        self.index = index
        self.count = count
        self._versions = versions
        self.made_at = made_at

    @property
    def size(self) -> int:
        """msccl-tools' name for `count`."""
        return self.count

    @property
    def slot(self) -> Slot:
        return Slot(self.rank, self.buffer, self.index, self.count)

    def __repr__(self) -> str:
        return f"ChunkRef{self.slot}"

    def __eq__(self, other) -> bool:
        return isinstance(other, ChunkRef) and other.prog is self.prog and other.slot == self.slot

    def __hash__(self) -> int:
        return hash(self.slot)

    # --- checks ----------------------------------------------------------------
    def _require_fresh(self, where: str) -> None:
        if _tracing.current is not self.prog:
            raise TraceError(f"{where}: reference {self.slot} belongs to program {self.prog.name!r}, "
                             f"which is not being traced")
        now = self.prog.versions(self.slot)
        if now != self._versions:
            i = next(k for k, (a, b) in enumerate(zip(now, self._versions)) if a != b)
            key = (self.rank, self.buffer, self.index + i)
            raise StaleReferenceError(
                f"{where}: stale reference: chunk (rank {key[0]}, {key[1]!r}, {key[2]}) was overwritten at "
                f"{self.prog.writer(key)} after this reference was made at {self.made_at}; "
                f"take a new chunk(...) or use the reference the overwriting operation returned")

    def _require_link(self, src: int, dst: int, where: str) -> None:
        if not self.prog.topology.link(src, dst):
            raise TopologyError(f"{where}: topology {self.prog.topology.name} has no link from rank {src} "
                                f"to rank {dst}")

    # --- operations ---------------------------------------------------------------
    def copy(self, rank, buffer=None, index=None, count: Optional[int] = None, ch=None, sendtb=None,
             recvtb=None) -> "ChunkRef":
        """Copy these chunks to (rank, buffer, index); return a reference to the copies."""
        where = user_location()
        self._require_fresh(where)
        ch, sendtb, recvtb = (_schedule_hint(n, v, where) for n, v in
                              (("ch", ch), ("sendtb", sendtb), ("recvtb", recvtb)))
        if count is not None and count != self.count:
            raise CountMismatchError(f"{where}: copy of {self.count} chunk(s) from {self.slot} given count={count!r}")
        prog = self.prog
        if index is None or index == -1:
            if buffer is None:
                buffer, index = self.buffer, self.index
            else:
                name = canonical_buffer(buffer, where)
                index = self.index if name in ("i", "o") else prog.next_scratch_index(prog.rank(rank, where), name)
        elif buffer is None:
            buffer = self.buffer
        r, buf, idx = prog.locate(rank, buffer, index, self.count, where)
        dst = Slot(r, buf, idx, self.count)
        src = self.slot
        prog.require_data(src, where, "copied")
        if dst == src:
            return prog.ref(dst, where)
        _require_disjoint(src, dst, where, "copy")
        self._require_link(src.rank, dst.rank, where)
        prog.record("copy", src, dst, ch, sendtb, recvtb, where)
        return prog.ref(dst, where)

    def reduce(self, other: "ChunkRef", ch=None, sendtb=None, recvtb=None) -> "ChunkRef":
        """Reduce `other` into these chunks (in place); return this reference, still valid."""
        where = user_location()
        if not isinstance(other, ChunkRef):
            raise TraceError(f"{where}: reduce() needs a chunk reference, got {other!r}")
        self._require_fresh(where)
        other._require_fresh(where)
        ch, sendtb, recvtb = (_schedule_hint(n, v, where) for n, v in
                              (("ch", ch), ("sendtb", sendtb), ("recvtb", recvtb)))
        if other.count != self.count:
            raise CountMismatchError(f"{where}: reduce of {other.count} chunk(s) {other.slot} into "
                                     f"{self.count} chunk(s) {self.slot}")
        prog = self.prog
        prog.require_data(self.slot, where, "reduced-into")
        prog.require_data(other.slot, where, "reduced")
        if other.slot != self.slot:
            _require_disjoint(other.slot, self.slot, where, "reduce")
        self._require_link(other.rank, self.rank, where)
        prog.record("reduce", other.slot, self.slot, ch, sendtb, recvtb, where)
        self._versions = prog.versions(self.slot)
        return self

    def split(self, n: int) -> List["ChunkRef"]:
        """`n` references of count/n chunks each, in order."""
        where = user_location()
        self._require_fresh(where)
        n = as_int(n, "split(n): n", 1, where)
        if self.count % n:
            raise CountMismatchError(f"{where}: cannot split {self.count} chunk(s) {self.slot} into {n} equal parts")
        part = self.count // n
        return [ChunkRef(self.prog, self.rank, self.buffer, self.index + k * part, part,
                         self._versions[k * part:(k + 1) * part], where) for k in range(n)]

    def group(self, other: "ChunkRef") -> "ChunkRef":
        """One reference over these chunks and the adjacent chunks of `other` (same rank and buffer)."""
        where = user_location()
        if not isinstance(other, ChunkRef):
            raise TraceError(f"{where}: group() needs a chunk reference, got {other!r}")
        self._require_fresh(where)
        other._require_fresh(where)
        if (other.rank, other.buffer) != (self.rank, self.buffer):
            raise TraceError(f"{where}: cannot group {self.slot} with {other.slot}: different rank or buffer")
        first, second = (self, other) if self.index <= other.index else (other, self)
        if first.index + first.count != second.index:
            raise TraceError(f"{where}: cannot group {self.slot} with {other.slot}: not adjacent")
        return ChunkRef(self.prog, self.rank, self.buffer, first.index, first.count + second.count,
                        first._versions + second._versions, where)


def _require_disjoint(src: Slot, dst: Slot, where: str, what: str) -> None:
    if (src.rank, src.buffer) == (dst.rank, dst.buffer) and \
            src.index < dst.index + dst.count and dst.index < src.index + src.count:
        raise TraceError(f"{where}: {what} from {src} to {dst}: source and destination partly overlap")
