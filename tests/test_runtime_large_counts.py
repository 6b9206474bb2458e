"""Counts beyond 32-bit limits: more than 2**31 one-byte elements (and more
than 2**32), and calls of more than 2**31 bytes in wider types.

The host-side geometry (layout, tile shape, the kernel's argument block) is
checked on the CPU; the calls themselves run on one GPU with virtual ranks and
are checked exactly there, in windows (runtime_cuda.nccl.datacheck), because
copying several GiB per rank to the host would take longer than the calls.
uint8 stands for the one-byte types (int8 has the same byte offsets).
"""
from pathlib import Path

import numpy as np
import pytest

from gc3.dtypes import dtype_info
from gc3.ir.xml_io import read_xml

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "ir_samples"

GiB = 1 << 30
RING = "allreduce_ring_2r_inplace_Simple_i64_unfused.xml"   # 128 blocks, Simple: what serves these sizes
ONESHOT = "allreduce_oneshot_2r_LL_i16.xml"    # 32 blocks, LL protocol

# (sample, dtype, elements, in place); every case is past 2**31 bytes, the
# one-byte ones past 2**31 (and 2**32) elements, none a multiple of the
# program's chunk count, so the last chunk is short.
CASES = [
    (RING, "uint8", (1 << 31) + 3, False),
    (RING, "uint8", (1 << 32) + 5, True),
    (ONESHOT, "float32", (1 << 29) + 5, True),
    (RING, "bfloat16", (1 << 30) + 7, False),
]
IDS = [f"{d}-{n}-{'ip' if ip else 'oop'}-{s.split('_')[1]}" for s, d, n, ip in CASES]


def _int_fits(value, ctype):
    return ctype(value).value == value


@pytest.mark.parametrize("sample,dtype,count,inplace", CASES, ids=IDS)
def test_geometry_of_large_calls_fits_the_kernel_arguments(sample, dtype, count, inplace):
    from runtime_cuda.core import abi
    from runtime_cuda.core import tables as tables_mod
    from runtime_cuda.core.binding import bind, call_shape
    from runtime_cuda.core.launcher import _Args, runtime_protocol

    prog = read_xml(SAMPLES / sample)
    proto = runtime_protocol(prog.proto)
    itemsize = dtype_info(dtype).np.itemsize
    lay, sh = call_shape(prog, count, itemsize, proto, tables_mod.build(prog).max_cnt)
    assert lay.in_elems == count and sh.unit == count
    assert sh.cpb * sh.cs >= sh.unit > (sh.cpb - 1) * sh.cs        # the chunks cover the buffer, none empty
    assert sh.ntiles * sh.T >= sh.cs > (sh.ntiles - 1) * sh.T      # the tiles cover a chunk
    assert sh.ntiles < 1 << abi.TILE_BITS
    # ctypes truncates silently: every value must survive the kernel's argument block.
    args = _Args(0, 0, 0, 0, 0, 0, *sh.args())
    assert (args.unit, args.cs, args.cpb, args.T, args.ntiles) == sh.args()
    for name, ctype in _Args._fields_:
        if name in ("unit", "cs", "cpb", "T", "ntiles"):
            assert _int_fits(getattr(sh, name), ctype), name
    # Addresses past 4 GiB and buffers past 2**31 bytes bind without wrapping.
    base = 0x7F00_0000_0000
    for r in range(prog.ngpus):
        out = base if inplace else base + 8 * GiB
        b = bind(prog, lay, r, base, out, itemsize)
        assert (b.i, b.o) == (out, out)
        if not inplace:
            assert b.pre is not None and (b.pre.dst, b.pre.src, b.pre.nbytes) == (out, base, count * itemsize)


def _free_bytes():
    import cupy
    return cupy.cuda.runtime.memGetInfo()[0]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("sample,dtype,count,inplace", CASES, ids=IDS)
def test_large_allreduce_on_virtual_ranks(sample, dtype, count, inplace):
    import cupy

    from runtime_cuda.core.checking import storage_dtype
    from runtime_cuda.nccl import datacheck as dc
    from runtime_cuda.ranks.virtual import VirtualRanks

    window = 1 << 26
    prog = read_xml(SAMPLES / sample)
    n = prog.ngpus
    itemsize = dtype_info(dtype).np.itemsize
    nbytes = count * itemsize
    assert nbytes > 1 << 31
    need = nbytes * n * (1 if inplace else 2) + 8 * window * 8 + GiB
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    if _free_bytes() < need:
        pytest.skip(f"needs {need / GiB:.1f} GiB of free GPU memory, {_free_bytes() / GiB:.1f} GiB free")
    st = storage_dtype(dtype)
    vr = ins = outs = None
    try:
        vr = VirtualRanks(prog)
        ins = [cupy.empty(count, dtype=st) for _ in range(n)]
        outs = ins if inplace else [cupy.empty(count, dtype=st) for _ in range(n)]
        for r in range(n):
            if not inplace:
                outs[r].fill(np.iinfo(st).max if st.kind == "u" else np.nan)   # a missed write shows
            dc.fill_input(cupy, ins[r], 0, r, count, "sum", dtype, n, window)
        vr(ins, outs, op="sum", dtype=dtype)
        vr.check()
        for r in range(n):
            res = dc.check_output(cupy, "allreduce", r, n, count, "sum", dtype, 0, outs[r], 0, window)
            assert res.checked == count
            assert res.wrong == 0, res.describe(r)
    finally:
        del vr, ins, outs
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
