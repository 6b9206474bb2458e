"""The CUDA interpreter on virtual ranks (all ranks of a schedule in one
launch on one GPU), data-checked against gc3.simulator.reference."""
import copy
from pathlib import Path

import numpy as np
import pytest

from gc3.dtypes import DTYPES
from gc3.errors import RuntimeTimeoutError
from gc3.ir.xml_io import read_xml

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
MSCCL = sorted((ROOT / "tests" / "data" / "msccl").glob("*.xml"))
IR_SAMPLES = sorted((ROOT / "ir_samples").glob("*.xml"))
# fused="1" samples compute their chunks from operator inputs a plain collective call does not
# give: tests/test_fused_gpu.py runs those the interpreter has opcodes for; the GEMM ones run
# outside it (runtime_cuda.fused.gemm) and the runtime must refuse them, below.
FUSED_XML = [p for p in IR_SAMPLES if 'fused="1"' in p.read_text()[:400]]
ALL_XML = MSCCL + [p for p in IR_SAMPLES if p not in FUSED_XML]
RING = ROOT / "tests" / "data" / "msccl" / "allreduce_ring_4r_1i.xml"
PAIRS = ROOT / "tests" / "data" / "msccl" / "allreduce_allpairs_2r_1i.xml"
A2A = ROOT / "tests" / "data" / "msccl" / "alltoall_two_step_2n_4g.xml"

_CACHE = {}


def ranks(path, proto=None, timeout=None):
    from runtime_cuda.ranks.virtual import VirtualRanks

    key = (str(path), proto, timeout)
    if key not in _CACHE:
        _CACHE[key] = VirtualRanks(read_xml(path), proto=proto, timeout=timeout)
    return _CACHE[key]


def sizes(prog):
    """Input element counts: 1 lane per chunk, short last chunks, empty last
    chunks, several tiles (> one FIFO slot per chunk)."""
    from runtime_cuda.core.checking import geometry

    bi, c = geometry(prog)
    return [bi * c, bi * (c + 1), bi * (2 * c - 1), bi * (c * 1000 + 3), bi * c * 70001, bi * (c * 300007 + c - 1)]


def check(path, in_elems, dtype="float32", op="sum", inplace=False, proto=None, repeat=1):
    from runtime_cuda.core.checking import run_checked

    res = run_checked(ranks(path, proto), in_elems, dtype, op, inplace, repeat=repeat)
    assert res.checked > 0
    assert res.wrong == 0, res.first


@pytest.mark.parametrize("path", FUSED_XML, ids=lambda p: p.name)
def test_a_fused_sample_without_device_opcodes_is_refused_by_name(path):
    from gc3.errors import NotOnDeviceError
    from gc3.ir.opcodes import OPCODES
    from gc3.ir.xml_io import from_xml

    prog = from_xml(path.read_text())
    if all(OPCODES[st.type].device or OPCODES[st.type].folded
           for g in prog.gpus for tb in g.threadblocks for st in tb.steps):
        pytest.skip(f"{path.name}: every step has an interpreter opcode (tests/test_fused_gpu.py runs it)")
    with pytest.raises(NotOnDeviceError, match="no opcode for yet"):
        ranks(path, None)


@pytest.mark.parametrize("inplace", [False, True], ids=["outofplace", "inplace"])
@pytest.mark.parametrize("path", ALL_XML, ids=lambda p: p.name)
def test_every_sample_every_size(path, inplace):
    prog = read_xml(path)
    for n in sizes(prog):
        check(path, n, inplace=inplace)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("path", [RING, PAIRS], ids=["ring_simple", "pairs_ll"])
def test_every_dtype_and_op(path, dtype, op):
    from runtime_cuda.core.checking import geometry

    bi, c = geometry(read_xml(path))
    for n in (bi * (c * 33 + 1), bi * c * 4099):
        check(path, n, dtype, op, inplace=True)
        check(path, n, dtype, op, inplace=False)


@pytest.mark.parametrize("proto", ["Simple", "LL"])
@pytest.mark.parametrize("path", MSCCL, ids=lambda p: p.name)
def test_both_protocols_run_every_sample(path, proto):
    prog = read_xml(path)
    for n in sizes(prog)[:5]:
        check(path, n, "bfloat16", "sum", proto=proto)


def test_repeated_calls_reuse_fifos_and_flags():
    from runtime_cuda.core.checking import geometry

    for path in MSCCL:
        bi, c = geometry(read_xml(path))
        check(path, bi * (c * 5000 + 1), "int32", "sum", repeat=5)


def test_recv_without_send_times_out_with_location():
    from runtime_cuda.ranks.virtual import VirtualRanks
    from runtime_cuda.core.checking import run_checked

    prog = read_xml(RING)
    broken = copy.deepcopy(prog)
    tb = broken.gpu(1).threadblocks[0]
    tb.steps = [s for s in tb.steps if s.type != "s"]       # rank 1 never sends its first chunk
    for k, s in enumerate(tb.steps):
        s.s = k
    vr = VirtualRanks(broken, timeout=0.5)
    with pytest.raises(RuntimeTimeoutError) as exc:
        run_checked(vr, 4096, "float32", "sum", inplace=True)
    msg = str(exc.value)
    assert "rank 2 TB 0" in msg and "from rank 1" in msg and "timed out" in msg, msg


@pytest.mark.slow
def test_stress_10000_back_to_back_calls():
    """Mixed algorithms and sizes, one device-side comparison per call, one
    synchronisation at the end: any wrong element or hang fails."""
    import cupy

    from runtime_cuda.core.checking import geometry, host_buffers, reference_case, storage_dtype
    from gc3.ir.layout import layout_for

    rng = np.random.default_rng(7)
    cases = []
    for path in MSCCL:
        prog = read_xml(path)
        bi, c = geometry(prog)
        for n in {bi * c, bi * (c + 1), bi * (c * 17 + 3), bi * c * 257, bi * (c * 4001 + 1)}:
            for dtype, op in (("float32", "sum"), ("int64", "max"), ("bfloat16", "sum")):
                inputs, expected = reference_case(prog, n, dtype, op, seed=n)
                st = storage_dtype(dtype)
                per_rank = []
                for r in range(prog.ngpus):
                    host, si, so = host_buffers(layout_for(prog, n, r), r, inputs[r], inplace=True)
                    master = cupy.asarray(host.view(st))
                    exp = None if expected[r] is None else cupy.asarray(expected[r].view(st))
                    per_rank.append((master, cupy.empty_like(master), si, so, exp))
                cases.append((path, dtype, op, per_rank))
    wrong = cupy.zeros((), dtype=cupy.int64)
    calls = 0
    for i in rng.integers(0, len(cases), size=10000):
        path, dtype, op, per_rank = cases[i]
        ins, outs = [], []
        for master, work, si, so, _ in per_rank:
            work[...] = master
            ins.append(work[si])
            outs.append(work[so])
        ranks(path)(ins, outs, op=op, dtype=dtype)
        for (_, work, si, so, exp), out in zip(per_rank, outs):
            if exp is not None:
                wrong += cupy.count_nonzero(out != exp)
        calls += 1
    for path in MSCCL:
        ranks(path).check()
    assert calls == 10000
    assert int(wrong) == 0
