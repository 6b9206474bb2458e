"""int8, uint32 and uint64 next to the older types: the dtype tables of gc3, the
kernel ABI and NCCL agree; the input generators (gc3.simulator.reference,
runtime_cuda.nccl.datacheck) give data every reduction of which is exact; the
interpreter, the small-message kernels and the avg pass compile for them.
The GPU runs are the every-dtype tests (test_runtime_virtual.py,
test_small_allreduce.py, test_epilogue.py), which take their lists from gc3.dtypes."""
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gc3.dtypes import DTYPES, OPS, TOLERANCES, dtype_info
from gc3.ir.epilogue import avg_divide
from gc3.simulator.reference import make_inputs
from runtime_cuda.core import abi, module
from runtime_cuda.nccl import constants, datacheck

NEW = ("int8", "uint32", "uint64")


def test_every_table_names_the_same_dtypes():
    assert set(NEW) <= set(DTYPES)
    assert set(abi.DTYPE) == set(DTYPES) == set(TOLERANCES) == set(constants.DTYPE_CODES)
    assert len(set(abi.DTYPE.values())) == len(abi.DTYPE)          # one kernel code per type
    for name, info in DTYPES.items():
        code = constants.DTYPE_CODES[name]
        assert info.nccl.lower() == "nccl" + name.lower(), name
        assert constants.ITEMSIZE[code] == info.np.itemsize, name
        assert constants.numpy_dtype(name) == info.np, name
        assert info.signed == (info.is_float or np.issubdtype(info.np, np.signedinteger)), name
        if not info.is_float:
            i = np.iinfo(info.np)
            assert info.exact == i.max and TOLERANCES[name] == (0.0, 0.0), name
            assert not info.signed or -info.exact >= i.min, name


_PY = {"sum": lambda x, y: x + y, "avg": lambda x, y: x + y, "prod": lambda x, y: x * y, "max": max, "min": min}


def _exact_reduce(arrays, op):
    """The reduction in Python integers, order 0..n-1, no wrap."""
    acc = arrays[0].tolist()
    for a in arrays[1:]:
        acc = [_PY[op](x, y) for x, y in zip(acc, a.tolist())]
    return acc


def _in_dtype(arrays, op, dtype):
    """The reduction as the kernel does it: in the type itself, wrapping."""
    ufunc = OPS[op]
    acc = arrays[0].astype(dtype_info(dtype).np)
    for a in arrays[1:]:
        acc = ufunc(acc, a.astype(acc.dtype))
    return avg_divide(acc, len(arrays)) if op == "avg" else acc


def _check_exact(arrays, op, dtype, where):
    info = dtype_info(dtype)
    lo = -info.exact if info.signed else 0
    for r, a in enumerate(arrays):
        assert a.min() >= lo and a.max() <= info.exact, f"{where}: rank {r} input out of range"
    exact = _exact_reduce(arrays, op)
    assert all(lo <= v <= info.exact for v in exact), f"{where}: a reduction leaves the exact range"
    got = _in_dtype(arrays, op, dtype)
    if op == "avg":      # NCCL's integer rule on the exact sum: truncation toward zero
        exact = [abs(v) // len(arrays) * (1 if v >= 0 else -1) for v in exact]
    assert got.tolist() == exact, where
    if op != "prod":     # not all one value: a misplaced chunk would show
        assert len(set(exact)) > 1, f"{where}: the reduced data do not vary"


@pytest.mark.parametrize("dtype", NEW)
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("n", range(2, 9))
def test_make_inputs_reduce_exactly(dtype, op, n):
    xs = make_inputs("allreduce", n, 301, dtype, seed=n, op=op)
    assert all(x.dtype == dtype_info(dtype).np for x in xs)
    _check_exact(xs, op, dtype, f"make_inputs {dtype} {op} n={n}")


@pytest.mark.parametrize("dtype", NEW)
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("n", range(2, 9))
def test_datacheck_inputs_reduce_exactly_and_check(dtype, op, n):
    count = 301
    start = (1 << 33) - 7           # beyond 32-bit indices too
    vals = [datacheck.generate(np, r, start, count, op, dtype, n) for r in range(n)]
    xs = [v.astype(dtype_info(dtype).np) for v in vals]
    assert all(np.array_equal(x.astype(np.int64), v) for x, v in zip(xs, vals)), "values do not fit the type"
    _check_exact(xs, op, dtype, f"datacheck {dtype} {op} n={n}")
    # and the checker accepts the in-type reduction and refuses it one unit off
    out = _in_dtype([datacheck.generate(np, r, 0, count, op, dtype, n).astype(xs[0].dtype) for r in range(n)],
                    op, dtype)
    buf = np.zeros(count * out.itemsize, np.uint8)
    buf.view(out.dtype)[:] = out
    assert datacheck.check_output(np, "allreduce", 0, n, count, op, dtype, 0, buf).wrong == 0
    buf.view(out.dtype)[5] ^= 1
    assert datacheck.check_output(np, "allreduce", 0, n, count, op, dtype, 0, buf).wrong == 1


def test_unsigned_inputs_have_no_negatives_and_int8_sums_stay_in_range():
    for n in range(2, 9):
        for dtype in ("uint32", "uint64"):
            for op in OPS:
                assert all(x.min() >= 0 for x in make_inputs("allreduce", n, 500, dtype, seed=1, op=op))
                assert all(datacheck.generate(np, r, 0, 500, op, dtype, n).min() >= 0 for r in range(n))
        sums = np.sum([x.astype(np.int64) for x in make_inputs("allreduce", n, 500, "int8", seed=1)], axis=0)
        assert np.abs(sums).max() <= 127


def _nvcc(src, opts):
    r = subprocess.run(["nvcc", "-std=c++17", "--ptx", "-arch=sm_90", *opts, str(src), "-o", "/dev/null"],
                       capture_output=True, text=True, timeout=300)
    return f"{' '.join(opts)}:\n{r.stderr[-2000:]}" if r.returncode else ""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc; the GPU tests compile with NVRTC")
def test_kernels_compile_for_every_new_dtype_op_and_protocol(tmp_path):
    """The op only selects red() and the protocol only the data path around it, so
    every op on one protocol and every protocol with sum (and with the epilogue's
    avg_divide) covers each piece a type can break; test_runtime_tables compiles
    max on every protocol for every dtype.  The whole op x protocol x epilogue
    product costs a minute of nvcc for nothing more."""
    def opts(*args, **kw):
        return [o for o in module.options(*args, **kw) if o.startswith("-D")]

    srcs = {}
    for name in ("interpreter.cu", "small_allreduce.cu", "avg_pass.cu"):
        srcs[name] = tmp_path / name
        srcs[name].write_text(module.source() if name == "interpreter.cu" else module.source(name))
    jobs = []
    for dtype in NEW:
        variants = {(op, "LL", False) for op in abi.REDOP} | {("sum", p, True) for p in abi.PROTO}
        jobs += [(srcs["interpreter.cu"], opts(dtype, op, p, epilogue=e)) for op, p, e in sorted(variants)]
        jobs += [(srcs["small_allreduce.cu"], opts(dtype, op, "LL")) for op in abi.REDOP]
        jobs.append((srcs["avg_pass.cu"], [f"-DGC3_DTYPE={abi.DTYPE[dtype]}"]))
    with ThreadPoolExecutor(4) as pool:
        errors = [e for e in pool.map(lambda j: _nvcc(*j), jobs) if e]
    assert not errors, "\n".join(errors[:3])


def test_an_unknown_dtype_code_does_not_compile(tmp_path):
    """The compile test above can fail: a code with no typedef stops at #error."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    src = tmp_path / "avg_pass.cu"
    src.write_text(module.source("avg_pass.cu"))
    assert "unknown GC3_DTYPE" in _nvcc(src, [f"-DGC3_DTYPE={max(abi.DTYPE.values()) + 1}"])


class _OneProcess:
    """The few mpi4py calls HostStagedNccl's constructor makes."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2


def test_host_staged_stand_in_averages_the_new_types_as_nccl():
    from runtime_cuda.nccl.hoststaged import HostStagedNccl

    host = HostStagedNccl(_OneProcess(), 0)
    for dtype in NEW:
        t = dtype_info(dtype).np
        lo = -100 if dtype_info(dtype).signed else 0
        parts = [np.array([lo, 7, 9], t), np.array([lo, 0, np.iinfo(t).max - 20], t)]
        wrapped = parts[0] + parts[1]
        got = host._reduce(parts, constants.NCCL_AVG)
        assert got.dtype == t and got.tolist() == avg_divide(wrapped, 2).tolist(), dtype
    # int8: -100 + -100 wraps to 56, halved to 28; 9 + 107 wraps to -140 + 256 = 116 -> 58
    got = host._reduce([np.array([-100, 9], np.int8), np.array([-100, 107], np.int8)], constants.NCCL_AVG)
    assert got.tolist() == [28, 58]
    got = host._reduce([np.array([-128, -7], np.int8), np.array([0, 0], np.int8)], constants.NCCL_AVG)
    assert got.tolist() == [-64, -3]      # |-128| as an int8 is -128: a naive abs() would give 64 here
