"""One call's geometry and buffer binding, independent of how ranks run.

`call_shape` turns (program, element count, element size, protocol) into the
kernel's scalars: gc3.ir.layout's unit/cs/chunks-per-block plus the tile size.
`bind` decides which addresses the kernel uses for the i and o buffers of a
rank, including the copies an in-place program needs when called out of
place (as in MSCCL: the input is first copied into the output's aliased
region, gc3.ir.layout.Layout.inplace_offset), and the private input copy an
out-of-place program reads when called in place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from gc3 import limits
from gc3.errors import LayoutError, LimitError
from gc3.ir import Program
from gc3.ir.layout import Layout, layout_for

from . import abi
from .connections import TileSplit, slot_data_bytes, tile_split


@dataclass(frozen=True)
class Shape:
    unit: int
    cs: int
    cpb: int
    T: int          # lanes per tile
    ntiles: int

    def args(self):
        return (self.unit, self.cs, self.cpb, self.T, self.ntiles)


def rank_layouts(prog: Program, in_elems: int):
    """Every rank's layout; they must agree on the chunk size (one tiling for all)."""
    lays = [layout_for(prog, in_elems, g.id) for g in prog.gpus]
    if len({(L.cs, L.unit, L.chunks_per_block) for L in lays}) > 1:
        raise LayoutError(f"{prog.name}: ranks disagree on chunk geometry for {in_elems} elements "
                          f"({sorted({(L.cs, L.chunks_per_block) for L in lays})}); the runtime needs one")
    return lays


def tile_lanes(cs: int, itemsize: int, proto: str, max_cnt: int, split: Optional[TileSplit] = None) -> int:
    """Lanes per tile: as many as a slot holds for the largest transfer, in
    whole granules (limits.tile_granule_bytes), and no more than the chunk needs -- or, with a
    `split`, small enough that a chunk makes `split.tiles` tiles (so that the
    steps of one chunk pipeline across FIFO slots) but no smaller than
    `split.min_bytes`."""
    split = split or TileSplit()
    granule = limits.tile_granule_bytes(proto)
    lanes = limits.tile_elems(cs, itemsize, slot_data_bytes(proto), max_cnt, split.tiles, split.min_bytes, granule)
    if lanes == 0:
        g = max(granule // itemsize, 1)
        raise LimitError(f"a FIFO slot of {slot_data_bytes(proto)} data bytes cannot hold {max_cnt} chunks of "
                         f"{g} x {itemsize}-byte elements; raise GC3_SLOT_BYTES_{proto.upper()}")
    return lanes


def call_shape(prog: Program, in_elems: int, itemsize: int, proto: str, max_cnt: int,
               split: Optional[TileSplit] = None) -> Tuple[Layout, Shape]:
    """`split` defaults to the protocol's `tile_split` (environment)."""
    lay = rank_layouts(prog, in_elems)[0]
    if lay.cs == 0:
        return lay, Shape(lay.unit, 0, max(lay.chunks_per_block, 1), 16, 0)
    T = tile_lanes(lay.cs, itemsize, proto, max_cnt, tile_split(proto) if split is None else split)
    ntiles = math.ceil(lay.cs / T)
    if ntiles >= 1 << abi.TILE_BITS:
        raise LimitError(f"{ntiles} tiles per chunk (chunk of {lay.cs} elements, tile {T}); "
                         f"the runtime counts at most {(1 << abi.TILE_BITS) - 1}: raise GC3_SLOT_BYTES_{proto.upper()}")
    return lay, Shape(lay.unit, lay.cs, lay.chunks_per_block, T, ntiles)


@dataclass(frozen=True)
class Copy:
    dst: int
    src: int
    nbytes: int


@dataclass(frozen=True)
class Binding:
    i: int                       # address the kernel uses for buffer i
    o: int                       # ... for buffer o
    pre: Optional[Copy] = None   # before the launch
    post: Optional[Copy] = None  # after it
    temp_bytes: int = 0          # the caller must pass a temp buffer this large


def is_inplace_call(lay: Layout, rank: int, in_ptr: int, out_ptr: int, itemsize: int) -> bool:
    base, off = lay.inplace_offset(rank)
    if base == "i":
        return out_ptr == in_ptr + off * itemsize
    return in_ptr == out_ptr + off * itemsize


def bind(prog: Program, lay: Layout, rank: int, in_ptr: int, out_ptr: int, itemsize: int,
         temp_ptr: int = 0) -> Binding:
    """Addresses of i and o for one rank's call; `temp_ptr` is used only when
    `bind(...).temp_bytes` (ask first with temp_ptr=0)."""
    base, off = lay.inplace_offset(rank)
    in_bytes, out_bytes = lay.in_elems * itemsize, lay.out_elems * itemsize
    if is_inplace_call(lay, rank, in_ptr, out_ptr, itemsize):
        if prog.inplace or in_bytes == 0:
            return Binding(in_ptr, out_ptr)
        # An out-of-place schedule may overwrite input that it (or a peer,
        # through this rank) still has to read: it reads a private copy.
        if not temp_ptr:
            return Binding(0, 0, temp_bytes=in_bytes)
        return Binding(temp_ptr, out_ptr, pre=Copy(temp_ptr, in_ptr, in_bytes), temp_bytes=in_bytes)
    if not prog.inplace:
        return Binding(in_ptr, out_ptr)
    if base == "o":
        view = out_ptr + off * itemsize
        return Binding(view, out_ptr, pre=Copy(view, in_ptr, in_bytes))
    if off == 0 and in_bytes <= out_bytes:
        return Binding(out_ptr, out_ptr, pre=Copy(out_ptr, in_ptr, in_bytes))
    if not temp_ptr:
        return Binding(0, 0, temp_bytes=in_bytes)
    view = temp_ptr + off * itemsize
    return Binding(temp_ptr, view, pre=Copy(temp_ptr, in_ptr, in_bytes), post=Copy(out_ptr, view, out_bytes),
                   temp_bytes=in_bytes)
