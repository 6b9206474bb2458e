"""One rank's buffers for a simulated call, laid out by gc3.ir.layout.

Steps move *tiles*: `cnt` chunks of `cs` lanes each, chunk by chunk through
`Layout.chunk_range` (blocks of a user buffer may leave short or empty chunks,
so consecutive chunk indices need not be consecutive in memory).  Reading a
lane past the end of a user chunk yields zero; writing one is dropped.  That
is the rule the CUDA runtime implements too (see gc3/ir/layout.py).

In-place calls alias the two user buffers with numpy views at
`Layout.inplace_offset`, so a write through one name is seen through the
other exactly as on the GPU.  `location()` names the memory a chunk really
occupies, which is what race detection must compare.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ..ir.layout import Layout


def poison_value(dtype: np.dtype):
    """What uninitialised memory holds: NaN for floats (visible in any
    reduction), the type's maximum for integers."""
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.nan


class RankMemory:
    def __init__(self, layout: Layout, rank: int, dtype: np.dtype, user_input: np.ndarray, aliased: bool):
        """`aliased`: input and output share memory, as in an in-place call or
        an in-place program called out of place (which, as in MSCCL, first
        copies the input into the output's aliased region).  The caller's
        `user_input` is copied, never modified."""
        self.layout = layout
        self.rank = rank
        L = layout
        poison = poison_value(dtype)
        self.user_input = user_input
        c = L.chunks_per_block
        self._nchunks = {"i": L.blocks_in * c, "o": L.blocks_out * c, "s": L.s_chunks}
        self._alias: Optional[Tuple[str, str, int]] = None  # (view buffer, base buffer, chunk shift)
        arrays: Dict[str, np.ndarray] = {}
        if aliased:
            base, off = L.inplace_offset(rank)
            other = "o" if base == "i" else "i"
            size = {"i": L.in_elems, "o": L.out_elems}
            arrays[base] = np.full(size[base], poison, dtype=dtype)
            arrays[other] = arrays[base][off:off + size[other]]
            arrays["i"][:] = user_input
            self._alias = (other, base, off // L.unit * c if L.unit else 0)
        else:
            arrays["i"] = user_input.copy()
            arrays["o"] = np.full(L.out_elems, poison, dtype=dtype)
        arrays["s"] = np.full(L.scratch_elems, poison, dtype=dtype)
        self.arrays = arrays
        self.compute_inputs: Optional[Dict[str, np.ndarray]] = None   # a fused program's x, w, ... of this rank
        self.epilogue_inputs: Optional[Dict[str, np.ndarray]] = None  # an epilogue's bias/residual of this rank
        self.cs = L.cs
        self.dtype = dtype
        # Every chunk of a user buffer is full and adjacent to the next one
        # when the block size divides evenly: then a tile is one slice.
        self._dense = L.unit == c * L.cs
        self._ranges: Dict[str, Tuple[List[int], List[int]]] = {}
        for buf in ("i", "o"):
            spans = [L.chunk_range(buf, j) for j in range(self._nchunks[buf])]
            self._ranges[buf] = ([a for a, _ in spans], [b - a for a, b in spans])

    def nchunks(self, buf: str) -> int:
        return self._nchunks[buf]

    def location(self, buf: str, index: int) -> Tuple[str, int]:
        """The (buffer, chunk) that chunk `index` of `buf` occupies in memory."""
        if self._alias and buf == self._alias[0]:
            return self._alias[1], index + self._alias[2]
        return buf, index

    def read(self, buf: str, off: int, cnt: int) -> np.ndarray:
        cs = self.cs
        arr = self.arrays[buf]
        if buf == "s" or self._dense:
            return arr[off * cs:(off + cnt) * cs].copy()
        tile = np.zeros(cnt * cs, dtype=self.dtype)
        starts, lens = self._ranges[buf]
        for k in range(cnt):
            a, n = starts[off + k], lens[off + k]
            tile[k * cs:k * cs + n] = arr[a:a + n]
        return tile

    def write(self, buf: str, off: int, cnt: int, tile: np.ndarray) -> None:
        cs = self.cs
        arr = self.arrays[buf]
        if buf == "s" or self._dense:
            arr[off * cs:(off + cnt) * cs] = tile
            return
        starts, lens = self._ranges[buf]
        for k in range(cnt):
            a, n = starts[off + k], lens[off + k]
            arr[a:a + n] = tile[k * cs:k * cs + n]

    def output_index(self, buf: str, off: int, cnt: int) -> Optional[np.ndarray]:
        """For each lane of a `cnt`-chunk tile stored at buf[off], the index in the
        output buffer of the element it lands on (lanes past a chunk's end: -1, not
        stored), or None if the chunks are not the output's memory (an epilogue's bias
        and residual are indexed by output element)."""
        if buf == "s":
            return None
        arr, out = self.arrays[buf], self.arrays["o"]
        shift = (arr.__array_interface__["data"][0] - out.__array_interface__["data"][0]) // arr.itemsize
        starts, lens = self._ranges[buf]
        idx = np.full(cnt * self.cs, -1, dtype=np.int64)
        for k in range(cnt):
            a, n = starts[off + k] + shift, lens[off + k]
            if n and not (0 <= a and a + n <= out.size):
                return None
            idx[k * self.cs:k * self.cs + n] = np.arange(a, a + n)
        return idx

    def output(self) -> np.ndarray:
        return self.arrays["o"]
