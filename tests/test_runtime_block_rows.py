"""The per-block rows the kernel copies into shared memory (runtime_cuda/core/block_rows.py), no GPU needed:
every field the kernel reads must say what the host tables say."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gc3.errors import LimitError
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.ir.xml_io import read_xml
from runtime_cuda.core import abi, block_rows, connections, tables

DATA = Path(__file__).resolve().parent / "data" / "msccl"
RING = DATA / "allreduce_ring_4r_1i.xml"
A2A = DATA / "alltoall_two_step_2n_4g.xml"

C = abi.C
BK = lambda n: C[f"GC3_BK_{n}"]     # noqa: E731
BKQ = lambda n: C[f"GC3_BKQ_{n}"]   # noqa: E731
ST = lambda n: abi.field("ST", n)   # noqa: E731


def _records(prog, t):
    lays = {r: connections.rank_layout(prog, r, "Simple") for r in range(prog.ngpus)}
    fifo = {r: 1_000_000 * (r + 1) for r in range(prog.ngpus)}
    sync = {r: 1_000 * (r + 1) for r in range(prog.ngpus)}
    return connections.records(t, lays, fifo.get, sync.get)


def _steps_of(br, block):
    """The block's device steps as the kernel walks them: the row's, then the cold table's."""
    row = br.rows[block]
    hot = row[block_rows.HEADER:block_rows.HEADER + block_rows.DS * row[BK("NHOT")]].reshape(-1, block_rows.DS)
    start = row[BK("COLD_START")]
    cold = br.cold[start:start + row[BK("NSTEPS")] - row[BK("NHOT")]]
    return np.concatenate([hot, cold])


def test_rows_carry_each_blocks_connections_steps_and_inline_waits():
    prog = read_xml(A2A)
    t = tables.build(prog)
    sends, recvs = _records(prog, t)
    br = block_rows.build(t, sends, recvs)
    q = br.rows.view(np.uint64)
    F = lambda n: abi.field("CONN", n)  # noqa: E731
    assert br.rows.shape == (t.nblocks, br.row_words) and br.row_words % 4 == 0
    for b in range(t.nblocks):
        tb, row = t.tbs[b], br.rows[b]
        assert (row[BK("RANK")], row[BK("TB")]) == t.blocks[b]
        assert row[BK("RANK_SLOT")] == tb[abi.field("TB", "RANK_SLOT")]
        s, rv = tb[abi.field("TB", "SEND")], tb[abi.field("TB", "RECV")]
        if s >= 0:
            assert (row[BK("SPEER")], row[BK("SCHAN")]) == (sends[s][F("PEER")], sends[s][F("CHAN")])
            assert q[b, BKQ("SFIFO")] == sends[s][F("FIFO")] and q[b, BKQ("DATA_OUT")] == sends[s][F("TAIL")]
            assert q[b, BKQ("CREDIT_IN")] == sends[s][F("HEAD")]
        else:
            assert row[BK("SPEER")] == -1 and q[b, BKQ("SFIFO")] == 0
        if rv >= 0:
            assert (row[BK("RPEER")], row[BK("RCHAN")]) == (recvs[rv][F("PEER")], recvs[rv][F("CHAN")])
            assert q[b, BKQ("RFIFO")] == recvs[rv][F("FIFO")] and q[b, BKQ("DATA_IN")] == recvs[rv][F("TAIL")]
            assert q[b, BKQ("CREDIT_OUT")] == recvs[rv][F("HEAD")]
        else:
            assert row[BK("RPEER")] == -1
        for name in ("SENT", "RECVD", "EPOCH", "CREDIT_SEEN"):   # state starts at zero
            assert q[b, BKQ(name)] == 0
        start, n = tb[abi.field("TB", "STEP_START")], tb[abi.field("TB", "NSTEPS")]
        dev = _steps_of(br, b)
        assert dev.shape == (n, block_rows.DS)
        assert (dev[:, :abi.ST_NFIELDS] == t.steps[start:start + n]).all()
        for k in range(n):
            waits = t.deps[dev[k, ST("DEP_START")]:][:dev[k, ST("NDEPS")]]
            for d in range(block_rows.INLINE_DEPS):
                inline = tuple(dev[k, C["GC3_DS_DEP0"] + 2 * d:][:2])
                assert inline == (tuple(waits[d]) if d < len(waits) else (-1, -1))
    # The send of TB 7 waits on four steps: two inline, all four in P.deps.
    b7 = t.blocks.index((0, 7))
    (send,) = _steps_of(br, b7)
    assert send[ST("NDEPS")] == 4


def _long_tb_program(nsteps):
    long = Threadblock(id=0, steps=[Step(s=k, type="cpy", srcbuf="i", srcoff=k % 4, dstbuf="o", dstoff=k % 4)
                                    for k in range(nsteps)])
    short = Threadblock(id=1, steps=[Step(s=0, type="cpy", srcbuf="i", srcoff=0, dstbuf="s", dstoff=0)])
    return Program(name="long", proto="Simple", nchannels=1, nchunksperloop=4, ngpus=2, coll="allreduce",
                   inplace=False, gc3version="0.1",
                   gpus=[Gpu(0, 4, 4, 1, [long, short]), Gpu(1, 4, 4, 1, [])])


@pytest.mark.parametrize("nsteps", [block_rows.HOT_STEPS - 1, block_rows.HOT_STEPS, block_rows.HOT_STEPS + 47])
def test_a_long_threadblock_keeps_its_first_steps_in_the_row_and_the_rest_cold(nsteps):
    prog = _long_tb_program(nsteps)
    t = tables.build(prog, ranks=[0])
    sends, recvs = _records(prog, t)
    br = block_rows.build(t, sends, recvs)
    assert br.row_words <= C["GC3_HOT_WORDS"]
    long_row = br.rows[0]
    assert long_row[BK("NHOT")] == min(nsteps, block_rows.HOT_STEPS)
    assert len(br.cold) == max(nsteps - block_rows.HOT_STEPS, 1)   # never empty
    assert [int(x) for x in _steps_of(br, 0)[:, ST("ORIG")]] == list(range(nsteps))
    short = _steps_of(br, 1)
    assert len(short) == 1 and short[0][ST("OUT_BUF")] == abi.BUF["s"]


def test_a_launch_group_with_more_ranks_than_the_kernel_holds_buffers_for_is_refused():
    prog = read_xml(RING)
    t = tables.build(prog)
    sends, recvs = _records(prog, t)
    wide = dataclasses.replace(t, ranks=tuple(range(block_rows.MAX_GROUP_RANKS + 1)))
    with pytest.raises(LimitError, match="ranks in one launch"):
        block_rows.build(wide, sends, recvs)
    assert block_rows.build(t, sends, recvs).rows.shape[0] == t.nblocks
