"""Property tests of the deadlock verdict against a brute-force search of every interleaving."""
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gc3.errors import DeadlockError
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.verify import verify as full_verify


def verify(prog, **options):
    """These schedules test the other passes and compute nothing in particular."""
    return full_verify(prog, semantics=False, **options)


SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _step(type_):
    return Step(s=0, type=type_, srcbuf="i", srcoff=0, dstbuf="i", dstoff=0, cnt=1)


def _program(ranks):
    for tbs in ranks:
        for tb in tbs:
            for k, s in enumerate(tb.steps):
                s.s = k
    nch = 1 + max(tb.chan for tbs in ranks for tb in tbs)
    return Program(name="p", proto="Simple", nchannels=nch, nchunksperloop=1, ngpus=len(ranks), coll="custom",
                   inplace=False, gc3version="0.1.0", gpus=[Gpu(r, 1, 1, 0, tbs) for r, tbs in enumerate(ranks)])


def brute_force_deadlocks(prog: Program, slots: int) -> bool:
    """Explore every interleaving of step completions; True if some reachable state is stuck."""
    tbs = [(g.id, tb) for g in prog.gpus for tb in g.threadblocks]
    pos = {(r, tb.id): k for k, (r, tb) in enumerate(tbs)}
    sender = {(r, tb.send, tb.chan): k for k, (r, tb) in enumerate(tbs) if tb.send >= 0}
    receiver = {(tb.recv, r, tb.chan): k for k, (r, tb) in enumerate(tbs) if tb.recv >= 0}

    def prefix(tb, kind):
        out = [0]
        for s in tb.steps:
            out.append(out[-1] + bool(getattr(s.info, kind)))
        return out

    sent = [prefix(tb, "send") for _, tb in tbs]
    got = [prefix(tb, "recv") for _, tb in tbs]

    def enabled(state, k):
        r, tb = tbs[k]
        i = state[k]
        if i == len(tb.steps):
            return False
        s = tb.steps[i]
        if s.depid >= 0 and state[pos[(r, s.depid)]] <= s.deps:
            return False
        if s.info.recv:
            c = (tb.recv, r, tb.chan)
            if c not in sender or sent[sender[c]][state[sender[c]]] - got[k][i] <= 0:
                return False
        if s.info.send:
            c = (r, tb.send, tb.chan)
            consumed = got[receiver[c]][state[receiver[c]]] if c in receiver else 0
            if sent[k][i] - consumed >= slots:
                return False
        return True

    final = tuple(len(tb.steps) for _, tb in tbs)
    start = (0,) * len(tbs)
    seen = {start}
    todo = deque([start])
    while todo:
        state = todo.popleft()
        moves = [k for k in range(len(tbs)) if enabled(state, k)]
        if not moves and state != final:
            return True
        for k in moves:
            nxt = state[:k] + (state[k] + 1,) + state[k + 1:]
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


@st.composite
def pipelines(draw):
    """Programs built from a global order of transfers, so they run with one slot.

    Every rank has, per channel, one TB per peer slot: TB i sends to the i-th
    peer of one random order and receives from the i-th of another, so every
    connection exists.  Each transfer appends a send to the sending TB and a
    receive to the TB on the other side; a receive immediately forwarded by
    the same TB may become an `rcs`; steps may depend on any earlier step of
    another TB of their rank.
    """
    n = draw(st.integers(2, 3))
    nch = draw(st.integers(1, 2)) if n == 2 else 1
    ranks = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        tbs = []
        for chan in range(nch):
            sends, recvs = draw(st.permutations(peers)), draw(st.permutations(peers))
            tbs += [Threadblock(id=len(tbs) + i, send=s, recv=v, chan=chan, steps=[])
                    for i, (s, v) in enumerate(zip(sends, recvs))]
        ranks.append(tbs)
    links = [(r, a, b.send, j) for r, tbs in enumerate(ranks) for a, b in enumerate(tbs)
             for j, c in enumerate(ranks[b.send]) if c.recv == r and c.chan == b.chan]

    def add(r, a, type_):
        s = _step(type_)
        others = [b for b in range(len(ranks[r])) if b != a and ranks[r][b].steps]
        if others and draw(st.booleans()):
            b = draw(st.sampled_from(others))
            k = draw(st.integers(0, len(ranks[r][b].steps) - 1))
            s.depid, s.deps = ranks[r][b].id, k
            ranks[r][b].steps[k].hasdep = True
        ranks[r][a].steps.append(s)

    last_recv = None
    for _ in range(draw(st.integers(2, 8))):
        if draw(st.integers(0, 5)) == 0:
            r = draw(st.integers(0, n - 1))
            add(r, draw(st.integers(0, len(ranks[r]) - 1)), "nop")
            last_recv = None
            continue
        forward = [x for x in links if x[:2] == last_recv]
        r, a, p, j = draw(st.sampled_from(forward if forward and draw(st.booleans()) else links))
        if last_recv == (r, a) and draw(st.booleans()):
            ranks[r][a].steps[-1].type = "rcs"
        else:
            add(r, a, "s")
        add(p, j, "r")
        last_recv = (p, j)
    return _program(ranks)


@st.composite
def shuffled(draw):
    """A pipeline whose TBs' steps are put in random orders; dependencies follow their steps."""
    prog = draw(pipelines())
    for g in prog.gpus:
        perms = {tb.id: draw(st.permutations(range(len(tb.steps)))) for tb in g.threadblocks}
        new_index = {tb.id: {old: new for new, old in enumerate(perms[tb.id])} for tb in g.threadblocks}
        for tb in g.threadblocks:
            tb.steps = [tb.steps[old] for old in perms[tb.id]]
            for k, s in enumerate(tb.steps):
                s.s = k
                if s.depid >= 0:
                    s.deps = new_index[s.depid][s.deps]
    return prog


@SETTINGS
@given(pipelines(), st.integers(1, 3))
def test_globally_ordered_pipelines_pass(prog, slots):
    assert not brute_force_deadlocks(prog, slots)
    summary = verify(prog, slots=slots)
    assert summary.steps == sum(len(tb.steps) for g in prog.gpus for tb in g.threadblocks)


@SETTINGS
@given(shuffled())
def test_random_orders_deadlock_exactly_when_some_interleaving_sticks(prog):
    # Compared at several FIFO depths, so the slot threshold itself is checked.
    for slots in (1, 2, 3):
        try:
            verify(prog, slots=slots)
            verdict = False
        except DeadlockError:
            verdict = True
        assert verdict == brute_force_deadlocks(prog, slots), f"slots={slots}"


@pytest.mark.parametrize("slots, stuck", [(1, True), (2, True), (3, False), (4, False)])
def test_brute_force_agrees_with_the_issue_case(slots, stuck):
    ops = ["s", "s", "s", "r", "r", "r"]
    prog = _program([[Threadblock(0, 1, 1, 0, [_step(o) for o in ops])],
                     [Threadblock(0, 0, 0, 0, [_step(o) for o in ops])]])
    assert brute_force_deadlocks(prog, slots) is stuck
    if stuck:
        with pytest.raises(DeadlockError):
            verify(prog, slots=slots)
    else:
        verify(prog, slots=slots)
