import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gc3.dtypes import DTYPES, OPS, DtypeError, dtype_info, mismatches, np_dtype, reduce_op
from gc3.simulator.reference import ReferenceError, make_inputs, reference

DT = sorted(DTYPES)


def _loop_reduce(inputs, op):
    """Element-by-element reduction in rank order, in Python: an independent oracle."""
    f = {"sum": lambda a, b: a + b, "avg": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": max,
         "min": min}[op]
    out = []
    for i in range(inputs[0].size):
        acc = inputs[0][i].item()
        for x in inputs[1:]:
            acc = f(acc, x[i].item())
        out.append(acc)
    return out


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_allreduce_matches_python_loop_and_is_exact(dtype, op, nranks):
    inputs = make_inputs("allreduce", nranks, 37, dtype, seed=1, op=op)
    assert all(x.dtype == np_dtype(dtype) and x.shape == (37,) for x in inputs)
    outs = reference("allreduce", inputs, op, nranks)
    expected = _loop_reduce(inputs, op)
    if op == "avg":   # NCCL: integers truncate toward zero, floats scale by 1/n
        n = nranks
        expected = [(abs(v) // n) * (1 if v >= 0 else -1) if isinstance(v, int) else
                    np_dtype(dtype).type(v * (1.0 / n)).item() for v in expected]
    for o in outs:
        assert [v.item() for v in o] == expected      # exact, not merely close


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_inputs_vary_enough_to_expose_misplaced_chunks(dtype):
    x = make_inputs("allreduce", 8, 1000, dtype, seed=0, op="sum")[0].astype(np.float64)
    assert len(np.unique(x)) >= 10
    p = make_inputs("allreduce", 8, 1000, dtype, seed=0, op="prod")[0].astype(np.float64)
    assert set(np.unique(p)) == {-2.0, -1.0, 1.0, 2.0}


def test_allgather_alltoall_reducescatter_layouts():
    n = 3
    inputs = [np.arange(6, dtype=np.int32) + 10 * r for r in range(n)]
    ag = reference("allgather", inputs, "sum", n)
    assert ag[2].tolist() == [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 24, 25]
    a2a = reference("alltoall", inputs, "sum", n)
    assert a2a[1].tolist() == [2, 3, 12, 13, 22, 23]
    rs = reference("reducescatter", inputs, "sum", n)
    assert rs[2].tolist() == [4 + 14 + 24, 5 + 15 + 25]


def test_rooted_and_pipeline_collectives_leave_unspecified_ranks_none():
    n = 4
    inputs = [np.full(4, r + 1, dtype=np.float32) for r in range(n)]
    red = reference("reduce", inputs, "max", n, root=2)
    assert [o is None for o in red] == [True, True, False, True]
    assert red[2].tolist() == [4.0] * 4
    bc = reference("broadcast", inputs, "sum", n, root=3)
    assert all(o.tolist() == [4.0] * 4 for o in bc)
    nxt = reference("alltonext", inputs, "sum", n)
    assert nxt[0] is None and [o[0] for o in nxt[1:]] == [1.0, 2.0, 3.0]


def test_bad_arguments_raise_named_errors():
    x = [np.zeros(4, np.float32)] * 2
    with pytest.raises(ReferenceError, match="custom_thing"):
        reference("custom_thing", x, "sum", 2)
    with pytest.raises(ReferenceError, match="3 ranks"):
        reference("allreduce", x, "sum", 3)
    with pytest.raises(ReferenceError, match="root 5"):
        reference("reduce", x, "sum", 2, root=5)
    with pytest.raises(ReferenceError, match="3 equal blocks"):
        reference("alltoall", [np.zeros(4)] * 3, "sum", 3)
    with pytest.raises(DtypeError, match="float8"):
        dtype_info("float8")
    with pytest.raises(DtypeError, match="mean"):
        reduce_op("mean")


def test_mismatches_respects_dtype_tolerance():
    e = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert mismatches(e * (1 + 1e-7), e, "float32").size == 0
    assert mismatches(e + np.array([0, 0.01, 0], np.float32), e, "float32").tolist() == [1]
    i = np.array([1, 2, 3], dtype=np.int32)
    assert mismatches(i + np.array([0, 0, 1], np.int32), i, "int32").tolist() == [2]
    assert mismatches(np.array([np.nan]), np.array([np.nan]), "float64").size == 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), per=st.integers(0, 5), seed=st.integers(0, 10))
def test_alltoall_is_an_involution_property(n, per, seed):
    inputs = make_inputs("alltoall", n, n * per, "int32", seed)
    back = reference("alltoall", reference("alltoall", inputs, "sum", n), "sum", n)
    for a, b in zip(inputs, back):
        assert np.array_equal(a, b)
