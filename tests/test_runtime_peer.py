"""One process driving two GPUs through peer access (runtime_cuda.ranks.peer),
data-checked against gc3.simulator.reference: every 2-rank sample, sampled dtypes and
ops, in and out of place, 256 MiB per rank, and a broken program ending in
the timeout error.  The device choice and `gc3 run --mode` are checked on
the CPU too."""
import copy
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import cli
from gc3.errors import GC3Error, RuntimeTimeoutError
from gc3.ir.xml_io import read_xml

main = cli()   # gc3's CLI with the runtime's commands, installed or not

ROOT = Path(__file__).resolve().parent.parent
TWO_RANK = [p for p in sorted((ROOT / "tests" / "data" / "msccl").glob("*.xml")) + sorted((ROOT / "ir_samples").glob("*.xml"))
            if read_xml(p).ngpus == 2]
RING = ROOT / "ir_samples" / "allreduce_ring_2r_inplace_Simple_i64_unfused.xml"
ONESHOT = ROOT / "ir_samples" / "allreduce_oneshot_2r_LL_i16.xml"
PAIRS = ROOT / "tests" / "data" / "msccl" / "allreduce_allpairs_2r_1i.xml"

_GROUPS = {}


def group(path, proto=None):
    from runtime_cuda.ranks.peer import PeerRanks

    key = (str(path), proto)
    if key not in _GROUPS:
        _GROUPS[key] = PeerRanks(read_xml(path), proto=proto)
    return _GROUPS[key]


def check(g, n, dtype="float32", op="sum", inplace=False, repeat=1):
    from runtime_cuda.core.checking import run_checked

    res = run_checked(g, n, dtype, op, inplace, repeat=repeat)
    assert res.checked > 0, (g.prog.name, n, dtype, op, inplace)
    assert res.wrong == 0, res.first


@pytest.fixture(scope="module")
def alltoall_xml(tmp_path_factory) -> Path:
    """A 2-rank alltoall (no shipped sample has one), compiled from the DSL."""
    from gc3.compiler.pipeline import lower
    from gc3.dsl.program import run_script
    from gc3.ir.xml_io import write_xml

    out = tmp_path_factory.mktemp("a2a") / "alltoall_direct_2r_Simple_i8.xml"
    write_xml(lower(run_script(str(ROOT / "gc3" / "algorithms" / "alltoall_direct.py"), ["2"]), instances=8,
                    protocol="Simple"), out)
    return out


# -- CPU: where ranks go, and how gc3 run picks a mode ---------------------------

def test_two_rank_samples_found():
    names = {p.name for p in TWO_RANK}
    assert {RING.name, ONESHOT.name, PAIRS.name} <= names, names


def test_device_choice():
    from runtime_cuda.ranks.peer import choose_devices

    yes = lambda a, b: True  # noqa: E731
    assert choose_devices(2, None, 2, yes) == [0, 1]
    assert choose_devices(2, None, 8, yes) == [0, 1]
    assert choose_devices(2, [3, 1], 4, yes) == [3, 1]


@pytest.mark.parametrize("nranks, devices, ndev, access, words", [
    (2, None, 1, True, ["needs 2 GPUs", "has 1"]),
    (4, None, 2, True, ["needs 4 GPUs", "has 2"]),
    (2, [0], 2, True, ["1 devices given", "2-rank"]),
    (2, [0, 2], 2, True, ["[2] do not exist", "0..1"]),
    (2, [1, 1], 2, True, ["GPU twice"]),
    (2, None, 2, False, ["GPU 0 cannot access GPU 1", "mpirun"]),
])
def test_device_choice_refusals_say_why(nranks, devices, ndev, access, words):
    from runtime_cuda.ranks.peer import choose_devices

    with pytest.raises(GC3Error) as exc:
        choose_devices(nranks, devices, ndev, lambda a, b: access)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_large_cases_are_256mib_and_an_uneven_count_near_it():
    from runtime_cuda.core.checking import LARGE_BYTES, geometry, large_cases, recommended_max_bytes
    from runtime_cuda.core.perf import nbytes_of

    assert recommended_max_bytes(ONESHOT) == 256 << 10
    assert recommended_max_bytes(RING) is None          # no upper bound in the catalog
    assert recommended_max_bytes(PAIRS) is None         # not in any catalog
    for path in TWO_RANK:
        prog = read_xml(path)
        bi, c = geometry(prog)
        nbytes = recommended_max_bytes(path) or LARGE_BYTES
        (even, d1, ip1), (uneven, d2, ip2) = large_cases(prog, nbytes)
        assert (d1, d2) == ("float32", "bfloat16") and ip1 != ip2
        assert nbytes_of(prog, even, 4) == nbytes and even % (bi * c) == 0
        assert uneven % bi == 0 and (uneven // bi) % c != 0 or c == 1
        assert 0.99 * nbytes < nbytes_of(prog, uneven, 2) < nbytes
        assert (uneven // bi) % 2 == 1 or c > 1


def test_compare_counts_exactly_what_differs():
    import numpy as np

    from runtime_cuda.core.checking import compare

    x = np.arange(1000, dtype=np.float32)
    assert compare(0, x.copy(), x, "float32").wrong == 0
    y = x.copy()
    y[17] += 1
    res = compare(1, y, x, "float32")
    assert (res.checked, res.wrong) == (1000, 1) and "rank 1 output[17]" in res.first
    z = x.copy()
    z[3] = np.nextafter(z[3], np.float32(1e9))    # within the float tolerance: not wrong
    assert compare(0, z, x, "float32").wrong == 0


def test_run_mode_must_match_how_the_process_started(monkeypatch):
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    for var in ("PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    r = CliRunner().invoke(main, ["run", str(RING), "--mode", "ipc"])
    assert r.exit_code != 0 and "mpirun -np N" in r.output, r.output
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    r = CliRunner().invoke(main, ["run", str(RING), "--mode", "peer"])
    assert r.exit_code != 0 and "without mpirun" in r.output, r.output
    r = CliRunner().invoke(main, ["run", str(RING), "--mode", "bogus"])
    assert r.exit_code != 0 and "bogus" in r.output, r.output


# -- GPUs: two GPUs, one process ----------------------------------------------------


def sizes(prog):
    """1 lane per chunk, short and empty last chunks, several tiles per chunk."""
    from runtime_cuda.core.checking import geometry

    bi, c = geometry(prog)
    return [bi * c, bi * (c + 1), bi * (2 * c - 1), bi * (c * 1000 + 3), bi * (c * 70001 + c - 1)]


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("path", TWO_RANK, ids=lambda p: p.name)
def test_every_two_rank_sample_in_and_out_of_place(path):
    g = group(path)
    assert [d for d in g.devices] == [0, 1]
    for n in sizes(g.prog):
        check(g, n, inplace=False)
        check(g, n, inplace=True)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_alltoall(alltoall_xml):
    g = group(alltoall_xml)
    for n in sizes(g.prog):
        check(g, n, "bfloat16", inplace=bool(n % 2))


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("dtype, op", [("float16", "prod"), ("bfloat16", "max"), ("float64", "min"),
                                       ("int32", "sum"), ("int64", "max"), ("uint8", "min")])
@pytest.mark.parametrize("path", [RING, PAIRS], ids=["ring_simple", "allpairs_ll"])
def test_sampled_dtypes_and_ops(path, dtype, op):
    from runtime_cuda.core.checking import geometry

    g = group(path)
    bi, c = geometry(g.prog)
    check(g, bi * (c * 33 + 1), dtype, op, inplace=True)
    check(g, bi * c * 4099, dtype, op, inplace=False)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_other_protocol_and_repeated_calls():
    """The ring on LL and the one-shot on Simple; FIFO counters and flags carry over between calls."""
    for path, proto in ((RING, "LL"), (ONESHOT, "Simple")):
        g = group(path, proto)
        for n in sizes(g.prog)[:4]:
            check(g, n, "float32", inplace=True, repeat=3)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_large_sizes_256mib_per_rank(alltoall_xml):
    """256 MiB per rank (the one-shot LL program at the most its catalog entry
    recommends) in float32, and an uneven count near it in bfloat16."""
    from runtime_cuda.core.checking import LARGE_BYTES, large_cases, recommended_max_bytes
    from runtime_cuda.core.perf import nbytes_of

    assert recommended_max_bytes(ONESHOT) == 256 << 10
    for path in (RING, ONESHOT, alltoall_xml):
        g = group(path)
        cases = large_cases(g.prog, recommended_max_bytes(path) or LARGE_BYTES)
        if path != ONESHOT:
            assert nbytes_of(g.prog, cases[0][0], 4) == LARGE_BYTES
        for n, dtype, inplace in large_cases(g.prog, recommended_max_bytes(path) or LARGE_BYTES):
            check(g, n, dtype, "sum", inplace)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_array_streams_per_gpu():
    """Calls on explicit per-GPU streams; a single stream for two GPUs is refused."""
    import cupy

    from runtime_cuda.core.checking import device_buffers, reference_case

    g = group(RING)
    n = 128 * 999
    inputs, expected = reference_case(g.prog, n, "float32", "sum")
    streams = []
    for d in g.devices:
        with cupy.cuda.Device(d):
            streams.append(cupy.cuda.Stream())
    ins, outs = device_buffers(g, inputs, n, "float32", inplace=True)
    g(ins, outs, op="sum", stream=streams)
    for s in streams:
        s.synchronize()
    g.check()
    for r, out in enumerate(outs):
        with cupy.cuda.Device(g.devices[r]):
            assert (out.get() == expected[r]).all()
    with pytest.raises(GC3Error, match="one stream per GPU"):
        g(ins, outs, op="sum", stream=streams[0])


@pytest.mark.gpu
@pytest.mark.multigpu
def test_recv_without_send_times_out_with_location():
    from runtime_cuda.core.launcher import CommunicatorBroken
    from runtime_cuda.ranks.peer import PeerRanks

    broken = copy.deepcopy(read_xml(PAIRS))
    tb = next(t for t in broken.gpu(0).threadblocks if any(s.type == "s" for s in t.steps))
    k = next(i for i, s in enumerate(tb.steps) if s.type == "s")
    tb.steps[k].type = "nop"                       # rank 0 never sends: rank 1 waits for it
    tb.steps[k].depid = tb.steps[k].deps = -1
    g = PeerRanks(broken, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(RuntimeTimeoutError) as exc:
        check(g, 4096, "float32", "sum", inplace=True)
    assert time.monotonic() - t0 < 60
    msg = str(exc.value)
    # rank 1 waits for the missing data; rank 0 may time out too (on what rank 1 never
    # sends back) and stop rank 1 first: either way the record names rank, TB and step
    assert "timed out" in msg and re.search(r"rank [01] TB \d+ step \d+ \(\w+\), tile \d+", msg), msg
    assert "from rank" in msg, msg
    with pytest.raises((CommunicatorBroken, RuntimeTimeoutError)):
        check(g, 4096, "float32", "sum", inplace=True)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_gc3_run_peer_mode():
    r = CliRunner().invoke(main, ["run", str(RING), "--mode", "peer", "--size", "4MiB", "--iters", "3",
                                  "--warmup", "1"])
    assert r.exit_code == 0, r.output
    assert "GPUs 0, 1 in one process" in r.output and "check: 0 wrong of" in r.output, r.output
