"""Verification speed on an IR of realistic size: an 8-rank all-pairs AllReduce, 2 instances.

The program is written in msccl-tools' operand convention (remote operands in
send dst / receive src), so the operand cross-checks run on every pair too.
"""
import pytest

from gc3.errors import DeadlockError, FifoOrderError
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.verify import verify
from gc3.verify.deadlock import min_slots
from gc3.verify.model import build_model
from gc3.ir.xml_io import from_xml, to_xml


def _st(type_, src, dst, dep=(-1, -1), hasdep=False):
    return Step(s=0, type=type_, srcbuf=src[0], srcoff=src[1], dstbuf=dst[0], dstoff=dst[1], cnt=1,
                depid=dep[0], deps=dep[1], hasdep=hasdep)


def allpairs(n=8, instances=2, c=4) -> Program:
    """Reduce-scatter by sending block p to rank p's scratch, reduce there, then
    all-gather the reduced blocks; `c` chunks per block per instance.  Per
    instance, rank r has one TB per peer (send and recv that peer) and one TB
    that reduces the received contributions into r's own block."""
    blk = c * instances

    def chunk(block, inst, q):                  # input index
        return block * blk + inst * c + q

    def slot(owner, sender):                    # where `owner` keeps `sender`'s contribution
        return sender if sender < owner else sender - 1

    def scratch(owner, sender, inst, q):
        return (slot(owner, sender) * instances + inst) * c + q

    gpus = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        tbs = []
        for inst in range(instances):
            tb_of = {p: inst * n + slot(r, p) for p in peers}
            reducer = inst * n + n - 1
            red = []
            for q in range(c):
                for p in peers:  # wait for p's contribution (its TB's receive #q), then reduce it in
                    red.append(_st("re", ("s", scratch(r, p, inst, q)), ("i", chunk(r, inst, q)),
                                   dep=(tb_of[p], c + q), hasdep=(p == peers[-1])))
            last_re = {q: (q + 1) * len(peers) - 1 for q in range(c)}
            for p in peers:
                steps = [_st("s", ("i", chunk(p, inst, q)), ("s", scratch(p, r, inst, q))) for q in range(c)]
                steps += [_st("r", ("i", chunk(r, inst, q)), ("s", scratch(r, p, inst, q)), hasdep=True)
                          for q in range(c)]
                steps += [_st("s", ("i", chunk(r, inst, q)), ("i", chunk(r, inst, q)), dep=(reducer, last_re[q]))
                          for q in range(c)]
                steps += [_st("r", ("i", chunk(p, inst, q)), ("i", chunk(p, inst, q))) for q in range(c)]
                tbs.append(Threadblock(id=tb_of[p], send=p, recv=p, chan=inst, steps=steps))
            tbs.append(Threadblock(id=reducer, chan=inst, steps=red))
        for tb in tbs:
            for k, st_ in enumerate(tb.steps):
                st_.s = k
        gpus.append(Gpu(r, i_chunks=n * blk, o_chunks=0, s_chunks=(n - 1) * instances * c, threadblocks=tbs))
    return Program(name="allpairs", proto="Simple", nchannels=instances, nchunksperloop=n * blk, ngpus=n,
                   coll="allreduce", inplace=True, gpus=gpus)


@pytest.fixture(scope="module")
def big():
    text = to_xml(allpairs())
    return text, from_xml(text)


def test_the_benchmark_has_the_intended_size(big):
    text, prog = big
    assert 250_000 < len(text) < 400_000, len(text)
    assert sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks) == 8 * 2 * 7 * 5 * 4


def test_verify_large_program(big):
    # Its speed is measured by scripts/bench_verify.py, not asserted here.
    _, prog = big
    summary = verify(prog)
    assert summary.pairs == 8 * 7 * 2 * 2 * 4


def test_large_program_slot_threshold_and_a_planted_error(big):
    prog = from_xml(big[0])
    assert min_slots(build_model(prog)) == 4  # each TB sends its 4 chunks before receiving
    with pytest.raises(DeadlockError):
        verify(prog, slots=3)
    last = prog.gpus[7].threadblocks[-2].steps[-1]
    last.dstoff += 1
    with pytest.raises(FifoOrderError, match="rank 7 tb 14 step"):
        verify(prog)
