"""Host side of the CUDA runtime, no GPU needed: device tables (nop folding,
waits, re fusion), the kernel ABI, call geometry and buffer binding."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gc3 import limits
from gc3.errors import FifoOrderError, LayoutError
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.ir.layout import layout_for
from gc3.ir.xml_io import read_xml
from runtime_cuda.core import abi, binding, connections, module, tables

DATA = Path(__file__).resolve().parent / "data" / "msccl"
RING = DATA / "allreduce_ring_4r_1i.xml"
PAIRS = DATA / "allreduce_allpairs_2r_1i.xml"
A2A = DATA / "alltoall_two_step_2n_4g.xml"


def step(k, t, sb="s", so=0, db="s", do=0, cnt=1, depid=-1, deps=-1, hasdep=False):
    return Step(s=k, type=t, srcbuf=sb, srcoff=so, dstbuf=db, dstoff=do, cnt=cnt, depid=depid, deps=deps,
                hasdep=hasdep)


def one_rank(*tbs, s_chunks=16):
    """A 2-rank allreduce shell whose rank 0 runs `tbs` (GC3 convention); rank 1 is idle."""
    return Program(name="t", proto="Simple", nchannels=1, nchunksperloop=4, ngpus=2, coll="allreduce",
                   inplace=False, gc3version="0.1",
                   gpus=[Gpu(0, 4, 4, s_chunks, list(tbs)), Gpu(1, 4, 4, s_chunks, [])])


def rows(t, block):
    tb = t.tbs[block]
    return t.steps[tb[abi.field("TB", "STEP_START")]:][:tb[abi.field("TB", "NSTEPS")]]


def col(name):
    return abi.field("ST", name)


def test_abi_constants_cover_every_opcode_and_the_plan_struct():
    from gc3.ir import STEP_TYPES
    from gc3.ir.opcodes import NOT_ON_DEVICE

    # nop is folded away; compute steps the kernel lacks make tables.build refuse the IR
    assert set(abi.OPCODE) == set(STEP_TYPES) - {"nop"} - NOT_ON_DEVICE and "s" in abi.OPCODE
    assert len(set(abi.OPCODE.values())) == len(abi.OPCODE)
    assert abi.PLAN_FIELDS[:3] == ("cold", "deps", "extras")
    assert abi.PLAN_FIELDS[-3:] == ("nslots", "slot_bytes", "trace")
    assert len(abi.PLAN_FIELDS) == abi.C["GC3_PLAN_WORDS"]
    assert abi.ST_NFIELDS == 12 and abi.TB_NFIELDS == 8
    # The device step starts with the table's step fields; rows keep u64 fields 8-byte aligned
    # and steps 16-byte aligned (the kernel copies rows as uint4).
    assert abi.C["GC3_DS_DEP0"] == abi.ST_NFIELDS and abi.C["GC3_DS_NFIELDS"] % 4 == 0
    assert abi.C["GC3_BK_HEADER_WORDS"] % 4 == 0 and abi.C["GC3_HOT_WORDS"] % 4 == 0
    qfields = [v for k, v in abi.C.items() if k.startswith("GC3_BKQ_")]
    ifields = [v for k, v in abi.C.items() if k.startswith("GC3_BK_") and k != "GC3_BK_HEADER_WORDS"]
    assert max(ifields) < 2 * min(qfields) and 2 * max(qfields) + 2 <= abi.C["GC3_BK_HEADER_WORDS"]
    assert len(set(qfields)) == len(qfields) and len(set(ifields)) == len(ifields)


def test_nops_fold_into_the_next_real_step_as_waits():
    t = tables.build(read_xml(A2A), ranks=[0])
    tb7 = t.blocks.index((0, 7))
    (send,) = rows(t, tb7)       # three nops + one send become one device step
    assert send[col("OP")] == abi.OPCODE["s"] and send[col("ORIG")] == 3
    deps = t.deps[send[col("DEP_START")]:][:send[col("NDEPS")]]
    assert sorted(map(tuple, deps)) == [(0, 0), (1, 0), (2, 0), (4, 1)]
    for blk, dstep in deps:      # each waited-on step publishes its progress
        assert rows(t, blk)[dstep][col("FLAGS")] & abi.C["GC3_F_SIGNAL"]
    unsignalled = rows(t, t.blocks.index((0, 4)))[0]
    assert not unsignalled[col("FLAGS")] & abi.C["GC3_F_SIGNAL"]


def test_a_wait_on_a_nop_becomes_a_wait_on_what_it_stands_for():
    a = Threadblock(id=0, steps=[step(0, "cpy", "i", 0, "s", 0, hasdep=True), step(1, "nop", hasdep=True)])
    b = Threadblock(id=1, steps=[step(0, "cpy", "i", 1, "s", 1, hasdep=True)])
    a.steps[1].depid, a.steps[1].deps = 1, 0
    c = Threadblock(id=2, steps=[step(0, "cpy", "s", 0, "o", 0, depid=0, deps=1)])
    t = tables.build(one_rank(a, b, c))
    (row,) = rows(t, 2)
    deps = sorted(map(tuple, t.deps[row[col("DEP_START")]:][:row[col("NDEPS")]]))
    assert deps == [(0, 0), (1, 0)]


def test_re_runs_fuse_up_to_the_fanin_limit_and_not_across_waits():
    n = limits.MAX_REDUCE_FANIN + 2
    steps = [step(k, "re", "s", 1 + k, "o", 0) for k in range(n)]
    t = tables.build(one_rank(Threadblock(id=0, steps=steps)))
    r = rows(t, 0)
    assert [x[col("NEXTRA")] for x in r] == [limits.MAX_REDUCE_FANIN - 1, 1]
    extras = t.extras[r[0][col("EXTRA_START")]:][:r[0][col("NEXTRA")]]
    assert [tuple(e) for e in extras] == [(abi.BUF["s"], 2 + k) for k in range(limits.MAX_REDUCE_FANIN - 1)]

    other = Threadblock(id=1, steps=[step(0, "cpy", "i", 0, "s", 5, hasdep=True)])
    waits = [step(0, "re", "s", 1, "o", 0), step(1, "re", "s", 5, "o", 0, depid=1, deps=0)]
    t = tables.build(one_rank(Threadblock(id=0, steps=waits), other))
    assert [x[col("NEXTRA")] for x in rows(t, 0)] == [0, 0]


def test_re_into_an_operand_it_also_reads_is_not_fused():
    steps = [step(0, "re", "s", 1, "s", 0), step(1, "re", "s", 0, "s", 0)]
    t = tables.build(one_rank(Threadblock(id=0, steps=steps)))
    assert len(rows(t, 0)) == 2


def test_operands_follow_the_convention():
    t = tables.build(read_xml(RING))
    r = rows(t, 0)            # msccl: rrs reduces into its own dst, sends, writes nothing
    rrs = r[1]
    assert rrs[col("OP")] == abi.OPCODE["rrs"]
    assert (rrs[col("IN_BUF")], rrs[col("IN_OFF")], rrs[col("OUT_BUF")]) == (abi.BUF["i"], 3, abi.BUF[None])
    s = r[0]
    assert (s[col("IN_BUF")], s[col("OUT_BUF")]) == (abi.BUF["i"], abi.BUF[None])


def test_transfer_count_mismatch_is_refused_before_launch():
    prog = read_xml(RING)
    prog.gpu(2).threadblocks[0].steps[1].cnt = 2
    with pytest.raises(FifoOrderError, match="rank 1 -> rank 2"):
        tables.build(prog)


def test_connection_records_point_into_the_right_ranks_memory():
    prog = read_xml(RING)
    t = tables.build(prog)
    lays = {r: connections.rank_layout(prog, r, "Simple") for r in range(4)}
    fifo = {r: 1_000_000 * (r + 1) for r in range(4)}
    sync = {r: 1_000 * (r + 1) for r in range(4)}
    sends, recvs = connections.records(t, lays, fifo.get, sync.get)
    F = lambda n: abi.field("CONN", n)  # noqa: E731
    k = t.sends.index((0, 1, 0))
    assert sends[k][F("FIFO")] == fifo[1] and sync[1] <= sends[k][F("TAIL")] < sync[1] + 8 * lays[1].sync_words
    assert sync[0] <= sends[k][F("HEAD")] < sync[0] + 8 * lays[0].sync_words
    j = t.recvs.index((0, 1, 0))
    assert recvs[j][F("TAIL")] == sends[k][F("TAIL")] and recvs[j][F("HEAD")] == sends[k][F("HEAD")]
    assert recvs[j][F("PEER")] == 0 and sends[k][F("PEER")] == 1
    words = [int(x) for x in np.concatenate([sends[:, 1:3].ravel(), recvs[:, 1:3].ravel()])]
    assert len(set(words)) == len(words) // 2 == 2 * len(t.sends)   # each tail/head word shared by both ends only


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("proto", ["Simple", "LL", "LL128"])
@pytest.mark.parametrize("cs", [1, 7, 1000, 1 << 20, (1 << 26) + 3])
def test_tiles_fit_slots_and_cover_the_chunk(cs, proto, itemsize):
    from gc3 import limits

    max_cnt = 4
    T = binding.tile_lanes(cs, itemsize, proto, max_cnt)
    g = limits.tile_granule_bytes(proto) // itemsize
    assert T * itemsize % 16 == 0 and T % g == 0
    assert T * itemsize * max_cnt <= connections.slot_data_bytes(proto)
    if proto == "LL128":   # whole lines per chunk-tile, and max_cnt tiles' lines within the slot
        assert T * itemsize % limits.LL128_LINE_DATA_BYTES == 0
        assert max_cnt * T * itemsize // limits.LL128_LINE_DATA_BYTES * limits.LL128_LINE_BYTES \
            <= connections.slot_bytes(proto)
    assert -(-cs // T) * T >= cs and (T < cs or T - cs < g or T == g)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("cs", [1, 1000, 1 << 16, 1 << 20, (1 << 24) + 5])
@pytest.mark.parametrize("tiles,min_bytes", [(4, 65536), (8, 0), (3, 1 << 20)])
def test_tile_split_pipelines_a_chunk_but_keeps_tiles_large(cs, itemsize, tiles, min_bytes):
    split = connections.TileSplit(tiles, min_bytes)
    T = binding.tile_lanes(cs, itemsize, "Simple", 1, split)
    whole = binding.tile_lanes(cs, itemsize, "Simple", 1)
    g = 16 // itemsize
    assert T % g == 0 and T <= whole and T * itemsize <= connections.slot_data_bytes("Simple")
    if T < whole:   # split: as many tiles as asked, none below min_bytes unless the chunk is smaller
        assert -(-cs // T) >= tiles or T * itemsize >= min_bytes
        assert T * itemsize >= min(min_bytes, -(-cs // g) * g * itemsize) - 16
    assert -(-cs // T) * T >= cs


def test_tile_split_comes_from_the_environment(monkeypatch):
    from gc3.errors import GC3Error

    monkeypatch.setenv("GC3_TILE_SPLIT_SIMPLE", "4:65536")
    assert connections.tile_split("Simple") == connections.TileSplit(4, 65536)
    n = 4 * (1 << 17)                                                # 4 chunks of 512 KiB (float32)
    lay, shape = binding.call_shape(read_xml(RING), n, 4, "Simple", 1)
    assert shape.ntiles == 4 and shape.T * 4 == 128 << 10           # 4 tiles of 128 KiB
    monkeypatch.delenv("GC3_TILE_SPLIT_SIMPLE")
    lay, shape = binding.call_shape(read_xml(RING), n, 4, "Simple", 1)
    assert shape.ntiles == 2 and shape.T * 4 == connections.slot_data_bytes("Simple")
    for bad in ("4", "x:1", "0:10"):
        monkeypatch.setenv("GC3_TILE_SPLIT_LL", bad)
        with pytest.raises(GC3Error, match="GC3_TILE_SPLIT_LL"):
            connections.tile_split("LL")


def test_ranks_must_agree_on_chunk_geometry():
    prog = read_xml(RING)
    prog.gpu(3).i_chunks = 8
    with pytest.raises(LayoutError, match="disagree"):
        binding.rank_layouts(prog, 8 * 100)


def test_binding_of_an_inplace_program_called_out_of_place():
    ring = read_xml(RING)
    L = layout_for(ring, 1000, 0)
    b = binding.bind(ring, L, 0, 10_000, 50_000, 4)
    assert (b.i, b.o) == (50_000, 50_000) and b.pre == binding.Copy(50_000, 10_000, 4000) and b.post is None
    assert binding.bind(ring, L, 0, 10_000, 10_000, 4) == binding.Binding(10_000, 10_000)

    ag = Program(name="ag", proto="Simple", nchannels=1, nchunksperloop=2, ngpus=2, coll="allgather", inplace=True,
                 gpus=[Gpu(0, 1, 2, 0), Gpu(1, 1, 2, 0)])
    L = layout_for(ag, 100, 1)
    b = binding.bind(ag, L, 1, 10_000, 50_000, 4)
    assert (b.i, b.o) == (50_400, 50_000) and b.pre == binding.Copy(50_400, 10_000, 400)
    assert binding.is_inplace_call(L, 1, 50_400, 50_000, 4)

    rs = Program(name="rs", proto="Simple", nchannels=1, nchunksperloop=2, ngpus=2, coll="reducescatter",
                 inplace=True, gpus=[Gpu(0, 2, 1, 0), Gpu(1, 2, 1, 0)])
    L = layout_for(rs, 200, 1)
    ask = binding.bind(rs, L, 1, 10_000, 50_000, 4)
    assert ask.temp_bytes == 800
    b = binding.bind(rs, L, 1, 10_000, 50_000, 4, temp_ptr=90_000)
    assert (b.i, b.o) == (90_000, 90_400)
    assert b.pre == binding.Copy(90_000, 10_000, 800) and b.post == binding.Copy(50_000, 90_400, 400)


def test_out_of_place_program_binds_buffers_as_given_and_reads_a_copy_in_place():
    prog = read_xml(A2A)
    L = layout_for(prog, 800, 3)
    assert binding.bind(prog, L, 3, 1, 2, 4) == binding.Binding(1, 2)
    assert binding.bind(prog, L, 3, 5000, 5000, 4).temp_bytes == 3200
    b = binding.bind(prog, L, 3, 5000, 5000, 4, temp_ptr=90_000)
    assert (b.i, b.o, b.pre) == (90_000, 5000, binding.Copy(90_000, 5000, 3200))


def test_kernel_source_is_self_contained_and_compiles_for_every_variant(tmp_path):
    src = module.source()
    assert "#include \"" not in src and "gc3_interpreter" in src
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed; the GPU tests compile the kernel with NVRTC")
    path = tmp_path / "gc3_interpreter_check.cu"     # not a shared /tmp name: checkouts run the suite side by side
    path.write_text(src)
    for dtype in abi.DTYPE:
        for proto in abi.PROTO:
            opts = [o for o in module.options(dtype, "max", proto) if o.startswith("-D")]
            r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-ptx", *opts, str(path), "-o", "/dev/null"],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr


def test_a_thousand_nops_in_a_row_resolve_without_recursion():
    n = limits.MAX_STEPS_PER_TB - 1
    a = Threadblock(id=0, steps=[step(k, "nop", hasdep=(k == n - 1)) for k in range(n)])
    b = Threadblock(id=1, steps=[step(0, "cpy", "i", 0, "s", 0, depid=0, deps=n - 1)])
    t = tables.build(one_rank(a, b))
    assert len(rows(t, 1)) == 1


def test_nop_dependencies_in_a_cycle_are_refused():
    from gc3.errors import IRStructureError
    a = Threadblock(id=0, steps=[step(0, "nop", depid=1, deps=0, hasdep=True), step(1, "cpy", "i", 0, "s", 0)])
    b = Threadblock(id=1, steps=[step(0, "nop", depid=0, deps=0, hasdep=True), step(1, "cpy", "i", 0, "s", 1,
                                                                                     depid=0, deps=0)])
    with pytest.raises(IRStructureError, match="nop dependencies form a cycle"):
        tables.build(one_rank(a, b))


def test_latest_keeps_the_latest_wait_per_threadblock():
    # Waiting for step 5 of TB 1 covers step 2 (program order); the earliest would be too weak.
    assert tables._latest([(1, 2), (1, 5), (2, 0), (0, 9)], own_tb=0) == {1: 5, 2: 0}
    assert tables._latest([(1, 5), (1, 2)], own_tb=0) == {1: 5}


@pytest.mark.parametrize("a, b, cnt, alias", [
    (("i", 0), ("o", 7), 1, True),      # one allocation when called in place
    (("o", 3), ("i", 0), 1, True),
    (("s", 0), ("s", 0), 1, True),
    (("s", 0), ("s", 1), 2, True),      # [0,2) and [1,3) overlap
    (("s", 1), ("s", 0), 2, True),
    (("s", 0), ("s", 2), 2, False),     # [0,2) and [2,4) touch, do not overlap
    (("s", 2), ("s", 0), 2, False),
    (("s", 0), ("i", 0), 4, False),     # scratch is its own allocation
    (("i", 0), ("i", 1), 1, False),
])
def test_may_alias(a, b, cnt, alias):
    assert tables._may_alias(a, b, cnt) is alias
