"""The benchmarks' exact data check (runtime_cuda.nccl.datacheck), run with numpy."""
import numpy as np
import pytest

from gc3.dtypes import dtype_info
from runtime_cuda.nccl import datacheck as dc
from runtime_cuda.nccl import perf

COLLS = ("allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall")


def reference_output(coll, rank, n, count, op, dtype, root):
    """This rank's output computed the obvious way from whole input arrays."""
    in_elems = count * n if coll in ("reducescatter", "alltoall") else count
    ins = [dc.generate(np, r, 0, in_elems, op, dtype, n).astype(np.float64) for r in range(n)]

    def red(arrays):
        f = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
        acc = arrays[0]
        for a in arrays[1:]:
            acc = f(acc, a)
        return acc / n if op == "avg" else acc

    if coll in ("allreduce", "reduce"):
        out = red(ins)
    elif coll == "broadcast":
        out = ins[root]
    elif coll == "allgather":
        out = np.concatenate(ins)
    elif coll == "reducescatter":
        out = red([a[rank * count:(rank + 1) * count] for a in ins])
    else:
        out = np.concatenate([a[rank * count:(rank + 1) * count] for a in ins])
    if not dtype_info(dtype).is_float:
        out = np.trunc(out).astype(np.int64)
    return out


def buffer_holding(values, dtype, pad=3):
    buf = np.full((values.size + 2 * pad) * dtype_info(dtype).np.itemsize, 0xFF, dtype=np.uint8)
    dc.store(np, buf, pad, values, dtype)
    return buf, pad


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bfloat16", "max"), ("int32", "prod"),
                                      ("uint8", "min"), ("float16", "avg"), ("int64", "avg")])
def test_right_output_passes_and_one_wrong_element_is_found(coll, dtype, op):
    n, count, root = 3, 11, 1
    rank = 0 if coll != "reduce" else root
    out = reference_output(coll, rank, n, count, op, dtype, root)
    buf, off = buffer_holding(out, dtype)
    # a window smaller than a segment, so windows and segment boundaries both matter
    res = dc.check_output(np, coll, rank, n, count, op, dtype, root, buf, off, window=4)
    assert (res.wrong, res.checked) == (0, out.size)
    assert res.describe(rank) == ""

    bad_at = out.size - 2
    wrong = out.copy()
    wrong[bad_at] += 1
    buf, off = buffer_holding(wrong, dtype)
    res = dc.check_output(np, coll, rank, n, count, op, dtype, root, buf, off, window=4)
    assert res.wrong == 1 and res.index == bad_at
    assert res.got == pytest.approx(float(wrong[bad_at]), rel=0.02) and res.want == pytest.approx(float(out[bad_at]))
    assert f"output[{bad_at}]" in res.describe(rank)


def test_missed_writes_count_as_wrong():
    out = reference_output("allreduce", 0, 2, 10, "sum", "float32", 0)
    buf, off = buffer_holding(out, "float32")
    buf.view(np.float32)[off + 4: off + 7] = np.nan          # never written
    res = dc.check_output(np, "allreduce", 0, 2, 10, "sum", "float32", 0, buf, off)
    assert (res.wrong, res.index) == (3, 4)


def test_reduce_output_off_the_root_is_not_checked():
    assert dc.segments("reduce", 1, 2, 5, 0) is None
    res = dc.check_output(np, "reduce", 1, 2, 5, "sum", "float32", 0, np.zeros(1, np.uint8))
    assert res.checked == 0 and res.wrong == 0


def test_input_windows_join_up():
    buf = np.zeros(40, np.float32)
    dc.fill_input(np, buf, 3, 2, 37, "sum", "float32", 4, window=5)
    assert np.array_equal(buf[3:], dc.generate(np, 2, 0, 37, "sum", "float32", 4).astype(np.float32))


@pytest.mark.parametrize("dtype,op,n", [("float32", "sum", 8), ("bfloat16", "sum", 8), ("int32", "prod", 4),
                                        ("uint8", "sum", 2)])
def test_values_stay_exact_beyond_32_bit_indices(dtype, op, n):
    start = (1 << 33) - 5
    v = dc.generate(np, 1, start, 10, op, dtype, n)
    bound = 2 if op == "prod" else dtype_info(dtype).exact // n
    assert np.all(np.abs(v) <= bound)
    if op != "prod":
        assert len(set(v.tolist())) > 1      # not collapsed by an overflow to one value


def test_wrong_rows_are_marked_and_explained():
    r = perf.Row("allreduce", 1024, 256, "float32", "sum", 0, 2)
    ok = perf.measure("allreduce", 1024, 2, 5.0, 0, "x.xml")
    r.results["gc3"] = {"oop": ok, "ip": perf.measure("allreduce", 1024, 2, 5.0, 2, "x.xml")}
    r.results["gc3"]["ip"].first_wrong = "rank 1 output[7] = 3.0, expected 4.0"
    assert perf.format_row(r, ("gc3",)).endswith("<- WRONG")
    assert perf.wrong_details(r) == ["#   gc3 in-place 1024 B: 2 wrong; first: rank 1 output[7] = 3.0, expected 4.0"]
    r.results["gc3"]["ip"] = ok
    assert "WRONG" not in perf.format_row(r, ("gc3",)) and perf.wrong_details(r) == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("n", [2, 3, 7, 8])
def test_float_avg_rounded_as_nccl_does_passes(dtype, n):
    # NCCL's float avg: every input scaled by 1/n in the element type, then summed in it.
    t = dtype_info(dtype).np
    count = 500
    acc = np.zeros(count, dtype=t)
    scale = t.type(1.0 / n)
    for r in range(n):
        acc = (acc + (dc.generate(np, r, 0, count, "avg", dtype, n).astype(t) * scale).astype(t)).astype(t)
    buf, off = buffer_holding(acc.astype(np.float64), dtype)
    res = dc.check_output(np, "allreduce", 0, n, count, "avg", dtype, 0, buf, off)
    assert res.wrong == 0, res.describe(0)
    assert dc.avg_bound(dtype, n) < 0.5
