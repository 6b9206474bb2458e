"""Tests for the four host-side mutants that survived the first mutation run (scripts/mutation_check.sh):
the NOP-wait `max` in runtime_cuda/tables.py, `_may_alias`, the `re` fan-in
chain in gc3/verify/runtime_limits.py and `count_multiple` in selection."""
import json

import pytest

from gc3 import limits
from gc3.errors import LimitError
from gc3.ir import Gpu, Program, Step, Threadblock
from gc3.verify import verify
from runtime_cuda import tables


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


def _re_chain(n, change=None):
    steps = [Step(s=k, type="re", srcbuf="s", srcoff=k, dstbuf="i", dstoff=0) for k in range(n)]
    waiter = Threadblock(id=1, steps=[Step(s=0, type="nop", srcbuf="i", srcoff=0, dstbuf="i", dstoff=0)])
    if change is not None:
        change(steps, waiter)
    gpu = Gpu(0, i_chunks=2, o_chunks=0, s_chunks=n, threadblocks=[Threadblock(id=0, steps=steps), waiter])
    return Program("chain", "Simple", 1, 2, 1, "custom", True, [gpu], gc3version="0.1.0")


def _hasdep_at(k):
    def change(steps, waiter):
        steps[k].hasdep = True
        waiter.steps[0].depid, waiter.steps[0].deps = 0, k
    return change


def _field_at(k, **fields):
    def change(steps, waiter):
        for name, value in fields.items():
            setattr(steps[k], name, value)
    return change


N = limits.MAX_REDUCE_FANIN + 1


@pytest.mark.parametrize("change, fused_too_far", [
    (None, True),
    (_hasdep_at(3), False),              # another TB waits on step 3: the pass ends there
    (_field_at(4, dstoff=1), False),     # another destination starts a new pass
    (_field_at(4, cnt=2, srcoff=0), False),   # another count too
    (_field_at(4, hasdep=False), True),
])
def test_fanin_chain_ends_where_the_runtime_ends_a_fused_pass(change, fused_too_far):
    prog = _re_chain(N, change)
    if fused_too_far:
        with pytest.raises(LimitError, match="consecutive 're' steps"):
            verify(prog, semantics=False)
    else:
        verify(prog, semantics=False)


def test_count_multiple_is_exact(tmp_path):
    from test_nccl_selection import PAIRS, decide, make_call, only_rejection
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"algorithms": [{"file": str(PAIRS), "count_multiple": 3}]}))
    env = {"GC3_CONFIG": str(cfg)}
    assert decide(env, make_call(count=3 * 341)).uses_gc3
    for count in (1024, 3 * 341 + 1, 2):
        assert only_rejection(env, make_call(count=count)).field == "count"
    cfg.write_text(json.dumps({"algorithms": [{"file": str(PAIRS), "count_multiple": 0}]}))
    assert not decide(env, make_call(count=1024)).uses_gc3
