"""The simulator executes IR correctly: MSCCL samples and hand-built gc3
programs, for many sizes (uneven ones and one element per chunk), dtypes,
ops, in place and out of place."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gc3.dtypes import DTYPES, OPS
from gc3.errors import LayoutError, SimulationError
from gc3.simulator import simulate
from gc3.units import parse_size
from gc3.ir.xml_io import read_xml, to_xml

from sim_programs import allpairs_allreduce, alltoall_via_scratch, edited, ring_allgather, ring_reducescatter

DATA = Path(__file__).parent / "data" / "msccl"
RING = DATA / "allreduce_ring_4r_1i.xml"
PAIRS = DATA / "allreduce_allpairs_2r_1i.xml"
A2A = DATA / "alltoall_two_step_2n_4g.xml"

# Element counts per sample: 1 element per chunk, uneven (short and empty
# last chunks), and larger.  alltoall needs multiples of its 8 blocks.
SIZES = {
    RING: [4, 0, 1, 2, 7, 1001, 4096],
    PAIRS: [4, 3, 6, 1001, 4096],
    A2A: [8, 16, 8 * 13, 8 * 1000],
}


@pytest.mark.parametrize("path,count", [(p, n) for p, ns in SIZES.items() for n in ns],
                         ids=lambda v: v.stem if isinstance(v, Path) else str(v))
def test_msccl_samples_correct_for_sizes(path, count):
    res = simulate(str(path), count=count)
    assert res.ok, res.summary()
    assert res.wrong == 0 and not res.races and not res.deadlock
    assert res.predicted_time > 0
    exp = res.expected
    assert all(np.array_equal(o, e) for o, e in zip(res.outputs, exp))


@pytest.mark.parametrize("path", list(SIZES), ids=lambda p: p.stem)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_msccl_samples_correct_for_dtypes_and_ops(path, dtype, op):
    count = {RING: 10, PAIRS: 10, A2A: 24}[path]    # uneven for the allreduces
    res = simulate(str(path), count=count, dtype=dtype, op=op, seed=3)
    assert res.ok, res.summary()
    assert res.outputs[0].dtype == DTYPES[dtype].np


def test_ring_sums_hand_made_inputs():
    inputs = [np.arange(6, dtype=np.int32) + 100 * r for r in range(4)]
    res = simulate(str(RING), count=6, dtype="int32", inputs=inputs)
    want = np.arange(6) * 4 + 600
    assert res.ok and all(o.tolist() == want.tolist() for o in res.outputs)


def test_in_place_program_called_out_of_place_keeps_caller_input():
    res = simulate(str(RING), count=9, inplace=False, dtype="float64")
    assert res.ok and res.aliased
    inputs = res.inputs
    assert not any(np.array_equal(i, o) for i, o in zip(inputs, res.outputs))


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("count", [1, 2, 5, 6, 101])
def test_ring_allgather_in_and_out_of_place(inplace, count):
    res = simulate(ring_allgather(4, chunks=2, inplace=inplace), count=count, dtype="int64")
    assert res.ok, res.summary()
    assert res.outputs[1].size == 4 * count
    assert not res.warnings


@pytest.mark.parametrize("count", [0, 4, 4 * 3, 4 * 5, 4 * 1000 + 4])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_ring_reducescatter_out_of_place_and_in_place_through_either_name(count, op):
    assert simulate(ring_reducescatter(4, 2), count=count, op=op).ok
    for name in ("o", "i"):
        res = simulate(ring_reducescatter(4, 2, inplace=True, write_as=name), count=count, op=op, dtype="float16")
        assert res.ok, res.summary()
    # Out of place, writing the result into the input's block leaves the output unset.
    if count:
        res = simulate(ring_reducescatter(4, 2, write_as="i"), count=count)
        assert not res.ok and res.wrong == count
        assert any("out-of-place call modified its input buffer" in w for w in res.warnings)


def test_in_place_allgather_input_is_a_view_of_the_output_block():
    # A program that only sends (the in-place ring skips the local copy) can
    # only succeed if rank r's input already sits in output block r.
    prog = ring_allgather(3, chunks=1, inplace=True)
    assert all(tb.steps[0].type == "s" for g in prog.gpus for tb in g.threadblocks)
    assert simulate(prog, count=4).ok
    out_of_place = ring_allgather(3, chunks=1, inplace=True)
    out_of_place.inplace = False        # same steps, but separate buffers now
    res = simulate(out_of_place, count=4)
    assert not res.ok and res.wrong > 0


@pytest.mark.parametrize("nranks,chunks,count", [(2, 2, 2), (2, 2, 6), (3, 2, 3 * 3), (3, 3, 3 * 5), (4, 2, 4 * 7)])
def test_cnt_spanning_blocks_with_short_chunks(nranks, chunks, count):
    # cpy of cnt = n*c crosses every block boundary; with unit % c != 0 the
    # chunks are short, so lanes must map chunk by chunk through the layout.
    res = simulate(alltoall_via_scratch(nranks, chunks), count=count, dtype="int32")
    assert res.ok, res.summary()
    assert not res.warnings


@pytest.mark.parametrize("nranks,instances,per_peer,count", [(3, 1, 2, 12), (4, 2, 1, 13), (8, 2, 4, 8 * 64 + 5)])
def test_generated_allpairs_allreduce(nranks, instances, per_peer, count):
    res = simulate(allpairs_allreduce(nranks, instances, per_peer), count=count, op="max")
    assert res.ok, res.summary()


def test_every_way_to_pass_a_program_gives_the_same_result():
    prog = read_xml(PAIRS)
    text = PAIRS.read_text()
    results = [simulate(x, count=12, seed=5) for x in (prog, text, text.encode(), str(PAIRS), PAIRS)]
    assert all(r.ok for r in results)
    for r in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(r.outputs, results[0].outputs))
    with pytest.raises(SimulationError, match="cannot simulate a int"):
        simulate(42)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 31), count=st.integers(1, 40))
def test_any_interleaving_of_a_race_free_program_gives_identical_outputs(seed, count):
    base = simulate(str(PAIRS), count=count)
    shuffled = simulate(str(PAIRS), count=count, interleave_seed=seed)
    assert shuffled.ok and not shuffled.races
    assert all(np.array_equal(a, b) for a, b in zip(base.outputs, shuffled.outputs))


def test_custom_collective_needs_and_uses_a_user_reference():
    prog = ring_allgather(3, chunks=1)
    prog.coll = "my_gather"
    res = simulate(prog, count=5)
    assert not res.ok and "no built-in reference for collective 'my_gather'" in res.errors[0]

    def gather(inputs, op, nranks):
        return [np.concatenate(inputs)] * nranks
    assert simulate(prog, count=5, reference=gather).ok
    wrong = simulate(prog, count=5, reference=lambda i, op, n: [np.concatenate(i[::-1])] * n)
    assert not wrong.ok and wrong.wrong > 0
    given = simulate(prog, count=5, reference=[None, None, np.concatenate(res.inputs)])
    assert given.ok


def test_reduce_checks_only_the_root(tmp_path):
    # The ring allreduce computes the sum everywhere, so as a "reduce" it is
    # right for any root; the check must ignore non-root ranks.
    prog = read_xml(RING)
    prog.coll = "reduce"
    for root in range(4):
        res = simulate(prog, count=8, root=root)
        assert res.ok and [e is None for e in res.expected] == [r != root for r in range(4)]


@pytest.mark.parametrize("text,nbytes", [("4096", 4096), ("64K", 65536), ("1MiB", 1 << 20), ("1.5MB", 1500000),
                                         (" 2 GiB ", 2 << 30), (12, 12)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


def test_bad_sizes_are_named_errors():
    with pytest.raises(SimulationError, match="cannot read size '1 parsec'"):
        simulate(str(RING), size="1 parsec")
    with pytest.raises(LayoutError, match="4-byte"):
        simulate(str(RING), size=1001)
    with pytest.raises(LayoutError, match="divisible by 8"):
        simulate(str(A2A), count=12)
    with pytest.raises(SimulationError, match="slots=0"):
        simulate(str(RING), count=4, slots=0)


def test_structural_faults_name_rank_tb_step():
    prog = read_xml(RING)
    res = simulate(edited(prog, 2, 0, 3, srcoff=9, dstoff=9), count=8)
    assert not res.ok and "rank 2 tb 0 step 3 (rrcs): chunks i[9:10] out of range" in res.errors[0]
    res = simulate(edited(prog, 1, 0, 2, depid=5, deps=0), count=8)
    assert "rank 1 tb 0 step 2 (rrs): depid=5 names no threadblock of rank 1" in res.errors[0]
    bad = read_xml(RING)
    bad.gpu(3).threadblocks[0].recv = -1
    res = simulate(bad, count=8)
    assert "rank 3 tb 0 step 1 (rrs): receives but the threadblock has recv=-1" in res.errors


def test_missing_hasdep_is_a_warning_not_a_failure():
    prog = edited(read_xml(PAIRS), 0, 1, 1, hasdep=False)
    res = simulate(prog, count=8)
    assert res.ok
    assert res.warnings == ["rank 0 tb 0 step 0 waits on tb 1 step 1, which has hasdep=0"]


def test_xml_round_trip_of_generated_program_simulates_identically():
    prog = allpairs_allreduce(4, 1, 2)
    from gc3.ir.xml_io import from_xml
    a = simulate(prog, count=64)
    b = simulate(from_xml(to_xml(prog)), count=64)
    assert a.ok and b.ok and all(np.array_equal(x, y) for x, y in zip(a.outputs, b.outputs))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 5), c=st.integers(1, 3), unit=st.integers(0, 9), inplace=st.booleans(),
       dtype=st.sampled_from(sorted(DTYPES)), op=st.sampled_from(sorted(OPS)))
def test_generated_collectives_for_any_shape_property(n, c, unit, inplace, dtype, op):
    for prog, count in ((ring_allgather(n, c, inplace=inplace), unit), (ring_reducescatter(n, c, inplace=inplace), n * unit),
                        (alltoall_via_scratch(n, c), n * unit)):
        res = simulate(prog, count=count, dtype=dtype, op=op)
        assert res.ok, res.summary()
