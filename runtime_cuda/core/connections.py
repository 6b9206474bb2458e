"""Where FIFOs, credits and flags live, and the connection records that
point at them.

Each rank owns, for every connection *into* it, a FIFO of `nslots` slots and
a tail word (slots filled; the sender writes it), and for every connection
*out of* it a head word (slots consumed; the receiver writes it) -- so every
wait spins on local memory and every signal is one remote store.  Each end's
own running count lives in its block's row (block_rows.py).  All counts only
grow: nothing is reset between calls.  A launch group (all ranks for virtual ranks, one rank per
process) also owns a control area: its abort word, its error record and one
progress flag per block.

Every rank computes every rank's layout from the program alone, so peers only
exchange base pointers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import numpy as np

from gc3 import limits, settings
from gc3.errors import GC3Error
from gc3.ir import Program

from . import abi
from .tables import ConnKey, Tables, connections



def slot_bytes(proto: str) -> int:
    n = settings.get(f"GC3_SLOT_BYTES_{proto.upper()}")
    align = limits.slot_align(proto)
    if n <= 0 or n % align:
        raise GC3Error(f"GC3_SLOT_BYTES_{proto.upper()}={n}: must be a positive multiple of {align}")
    return n


@dataclass(frozen=True)
class TileSplit:
    """Cut each chunk into at least `tiles` tiles while a tile stays >= min_bytes."""
    tiles: int = 1
    min_bytes: int = 0


# No split by default: a tile is as large as a slot holds.
_TILE_SPLIT = {"Simple": TileSplit(), "LL": TileSplit(), "LL128": TileSplit()}


def tile_split(proto: str) -> TileSplit:
    """GC3_TILE_SPLIT_<PROTO>=TILES:MIN_BYTES overrides the default."""
    given = settings.get(f"GC3_TILE_SPLIT_{proto.upper()}")
    return _TILE_SPLIT[proto] if given is None else TileSplit(*given)


def nslots(proto: str) -> int:
    return limits.FIFO_SLOTS[proto]


def slot_data_bytes(proto: str) -> int:
    return limits.slot_data_bytes(proto, slot_bytes(proto))


@dataclass(frozen=True)
class RankLayout:
    """Offsets inside one rank's FIFO region (bytes) and sync region (u64 words)."""
    rank: int
    recvs: Tuple[ConnKey, ...]
    sends: Tuple[ConnKey, ...]
    fifo_bytes_per_conn: int

    @property
    def fifo_bytes(self) -> int:
        return max(len(self.recvs), 1) * self.fifo_bytes_per_conn

    @property
    def sync_words(self) -> int:
        return len(self.recvs) + len(self.sends) + 1

    def fifo_offset(self, key: ConnKey) -> int:
        return self.recvs.index(key) * self.fifo_bytes_per_conn

    def tail_word(self, key: ConnKey) -> int:
        return self.recvs.index(key)

    def head_word(self, key: ConnKey) -> int:
        return len(self.recvs) + self.sends.index(key)


def rank_layout(prog: Program, rank: int, proto: str) -> RankLayout:
    conns = connections(prog)
    return RankLayout(rank=rank,
                      recvs=tuple(k for k in conns if k[1] == rank),
                      sends=tuple(k for k in conns if k[0] == rank),
                      fifo_bytes_per_conn=nslots(proto) * slot_bytes(proto))


# Control area of a launch group, in u64 words: abort word, error record,
# then one progress flag per block.
CONTROL_ABORT = 0
CONTROL_ERR = 1
CONTROL_FLAGS = CONTROL_ERR + abi.ERR_NFIELDS // 2


def control_words(nblocks: int) -> int:
    return CONTROL_FLAGS + nblocks


def records(t: Tables, layouts: Dict[int, RankLayout], fifo_base: Callable[[int], int],
            sync_base: Callable[[int], int]) -> Tuple[np.ndarray, np.ndarray]:
    """Send- and receive-side connection records of the launch group `t`,
    given each rank's FIFO and sync base addresses as this process sees them."""
    def word(rank: int, index: int) -> int:
        return sync_base(rank) + 8 * index

    sends: List[List[int]] = []
    for key in t.sends:
        src, dst, chan = key
        sends.append([fifo_base(dst) + layouts[dst].fifo_offset(key), word(dst, layouts[dst].tail_word(key)),
                      word(src, layouts[src].head_word(key)), dst, chan])
    recvs: List[List[int]] = []
    for key in t.recvs:
        src, dst, chan = key
        recvs.append([fifo_base(dst) + layouts[dst].fifo_offset(key), word(dst, layouts[dst].tail_word(key)),
                      word(src, layouts[src].head_word(key)), src, chan])
    return _u64(sends), _u64(recvs)


def _u64(rows: List[List[int]]) -> np.ndarray:
    if not rows:
        return np.zeros((1, abi.CONN_NFIELDS), np.uint64)
    return np.asarray(rows, dtype=np.uint64).reshape(-1, abi.CONN_NFIELDS)
