"""The one-shot and two-shot small-message allreduce kernels
(runtime_cuda/ranks/small_allreduce.py): catalog entries, selection, the drop-in's
runtime check and the cost model on the CPU; on a GPU, virtual ranks (2, 4, 8)
and 2 and 4 processes sharing the GPU (tests/gpu_programs/small_allreduce_ipc.py),
every result compared bit for bit with an exact reference."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gc3 import limits
from gc3.simulator.cost_config import preset
from gc3.simulator.small_allreduce import small_allreduce_seconds
from runtime_cuda.nccl.catalog import check_config, load_catalog
from runtime_cuda.nccl.constants import DTYPE_NAMES, NCCL_AVG, NCCL_FLOAT32, NCCL_INT64, NCCL_MAX, NCCL_SUM

from test_nccl_selection import PAIRS, make_call

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu_programs"))
import small_cases as cases  # noqa: E402

MAX = limits.SMALL_ALLREDUCE_MAX_BYTES          # the kernels' upper bound
KERNELS = limits.SMALL_ALLREDUCE_KERNELS
DEFAULT = limits.SMALL_ALLREDUCE_DEFAULT_BYTES  # an entry's max_bytes and a group's scratch when unsaid


def write_catalog(tmp_path, entries, name="c.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"version": 1, "algorithms": entries}))
    return path


# --- catalog entries ------------------------------------------------------------------

def test_kernel_entry_loads_with_its_defaults(tmp_path):
    good, problems = check_config(write_catalog(tmp_path, [{"kernel": "oneshot", "ranks": 4},
                                                           {"kernel": "twoshot", "collective": "allreduce",
                                                            "ranks": 4, "max_bytes": "64KiB", "inplace": False}]))
    assert problems == []
    one, two = good
    assert (one.kernel, one.collective, one.ranks, one.proto, one.program) == ("oneshot", "allreduce", 4, "LL", None)
    assert (one.min_bytes, one.max_bytes, one.serves_inplace, one.serves_outofplace) == (0, DEFAULT, True, True)
    assert one.name == "oneshot_allreduce_4r"
    assert (two.kernel, two.max_bytes, two.serves_inplace, two.serves_outofplace) == ("twoshot", 64 << 10, False, True)


def test_allgather_and_reducescatter_kernel_entries_size_the_scratch_by_a_rank_block(tmp_path):
    """Their sizes are nccl-tests' (the larger buffer): on 4 ranks a 1 MiB allgather or
    reducescatter moves blocks of 256 KiB, which is what the scratch must hold."""
    from runtime_cuda.nccl.catalog import load_catalog
    entries = [{"kernel": "oneshot", "collective": c, "ranks": 4, "max_bytes": "1MiB"}
               for c in ("allgather", "reducescatter")]
    good, problems = check_config(write_catalog(tmp_path, entries))
    assert problems == [] and [(c.collective, c.name) for c in good] == [
        ("allgather", "oneshot_allgather_4r"), ("reducescatter", "oneshot_reducescatter_4r")]
    cat = load_catalog({"GC3_CONFIG": str(tmp_path / "c.json")})
    assert cat.kernel_bytes(4) == 256 << 10


@pytest.mark.parametrize("entry, words", [
    ({"kernel": "threeshot", "ranks": 2}, "expected one of oneshot, oneshot_ll128, twoshot, twoshot_ll128"),
    ({"kernel": "oneshot"}, "needs 'ranks'"),
    ({"kernel": "oneshot", "ranks": 2, "max_bytes": "4MiB"}, "serves at most 2097152 bytes"),
    ({"kernel": "oneshot", "ranks": 2, "max_bytes": None}, "max_bytes=unbounded"),
    ({"kernel": "oneshot", "ranks": 2, "protocol": "Simple"}, "moves LL lines"),
    ({"kernel": "twoshot", "ranks": 2, "collective": "allgather"}, "no such kernel for collective='allgather'"),
    ({"kernel": "oneshot", "ranks": 2, "collective": "alltoall"}, "no such kernel for collective='alltoall'"),
    ({"kernel": "oneshot", "ranks": 2, "root": 0}, "has no root"),
    ({"kernel": "oneshot", "ranks": 2, "min_bytes": 4096, "max_bytes": 1024}, "serves no size"),
    ({"kernel": "oneshot", "ranks": 2, "inplace": False, "outofplace": False}, "serves no call"),
    ({"kernel": "oneshot", "file": "x.xml", "ranks": 2}, "'file' key (an IR) or a 'kernel' key"),
    ({"kernel": "oneshot", "ranks": 2, "speed": 3}, "unknown key(s) speed"),
])
def test_bad_kernel_entries_are_named_and_skipped(tmp_path, entry, words):
    good, problems = check_config(write_catalog(tmp_path, [entry, {"kernel": "twoshot", "ranks": 2}]))
    assert [c.kernel for c in good] == ["twoshot"]
    assert len(problems) == 1 and words in problems[0] and "algorithms[0]" in problems[0], problems


def test_catalog_check_command_lists_kernel_entries(tmp_path):
    from click.testing import CliRunner

    from runtime_cuda.commands import cli

    path = write_catalog(tmp_path, [{"kernel": "twoshot", "ranks": 8, "max_bytes": "128KiB"}])
    res = CliRunner().invoke(cli(), ["catalog", "check", str(path)])
    assert res.exit_code == 0, res.output
    assert "ok       twoshot_allreduce_8r: allreduce, 8 ranks, LL, 0..131072 bytes" in res.output


# --- selection ------------------------------------------------------------------------

@pytest.fixture
def kernel_catalog(tmp_path, monkeypatch):
    """oneshot up to 8 KiB, twoshot up to 256 KiB, then the all-pairs IR (in place, 2 ranks)."""
    monkeypatch.setenv("GC3_CACHE_DIR", str(tmp_path / "cache"))
    path = write_catalog(tmp_path, [{"kernel": "oneshot", "ranks": 2, "max_bytes": 8192},
                                    {"kernel": "twoshot", "ranks": 2},
                                    {"file": str(PAIRS), "ranks": 2}])
    return load_catalog({"GC3_CONFIG": str(path), "GC3_CACHE_DIR": str(tmp_path / "cache")})


@pytest.mark.parametrize("count, inplace, want", [
    (1, True, "oneshot_allreduce_2r"), (2047, False, "oneshot_allreduce_2r"), (2048, True, "oneshot_allreduce_2r"),
    (2049, True, "twoshot_allreduce_2r"), (65535, False, "twoshot_allreduce_2r"),
    (65536, True, "twoshot_allreduce_2r"), (65538, True, "allreduce_allpairs_2r_1i.xml")])
def test_selection_picks_the_kernel_its_catalog_names(kernel_catalog, count, inplace, want):
    from runtime_cuda.nccl.selection import select

    d = select(kernel_catalog, make_call(count=count, inplace=inplace))
    assert d.uses_gc3 and d.candidate.name == want, d.rejections


def test_kernels_serve_only_allreduce_on_their_rank_count(kernel_catalog):
    from runtime_cuda.nccl.selection import select

    d = select(kernel_catalog, make_call(count=16, nranks=4))
    assert not d.uses_gc3 and [r.field for r in d.rejections] == ["ranks"] * 3
    d = select(kernel_catalog, make_call(coll="allgather", count=16))
    assert not d.uses_gc3 and d.rejections[0].field == "collective"


def test_the_drop_in_runtime_check_of_a_kernel_candidate(kernel_catalog):
    from runtime_cuda.nccl.gc3_backend import Gc3Backend

    backend = Gc3Backend(None, 0, 2, 0)     # no catalog: scratch of the default size
    one = kernel_catalog.candidates[0]
    assert backend.check(one, make_call(count=7, dtype=NCCL_INT64, op=NCCL_MAX)) is None
    assert backend.check(one, make_call(count=7, op=NCCL_AVG)) is None        # the sum build, then the divide pass
    why = backend.check(one, make_call(count=DEFAULT // 4 + 1, op=NCCL_SUM, dtype=NCCL_FLOAT32))
    assert why and f"the scratch serves 1 element to {DEFAULT} B" in why
    for code in DTYPE_NAMES:        # every NCCL datatype has a build, int8/uint32/uint64 included
        assert backend.check(one, make_call(count=8, dtype=code, op=NCCL_MAX)) is None, DTYPE_NAMES[code]
    why = backend.check(one, make_call(count=DEFAULT + 1, dtype=0, op=NCCL_MAX))     # int8: 1-byte elements
    assert why and f"the scratch serves 1 element to {DEFAULT} B" in why


def test_the_drop_in_sizes_the_kernels_scratch_from_its_catalog(tmp_path):
    """The largest kernel entry for the communicator's size sets what the scratch holds;
    entries for other sizes do not count."""
    from runtime_cuda.nccl.gc3_backend import Gc3Backend

    cat = load_catalog({"GC3_CONFIG": str(write_catalog(tmp_path, [
        {"kernel": "oneshot", "ranks": 2, "max_bytes": "64KiB"},
        {"kernel": "twoshot", "ranks": 2, "min_bytes": "64KiB", "max_bytes": "1MiB"},
        {"kernel": "twoshot", "ranks": 4, "max_bytes": "2MiB"}]))})
    backend = Gc3Backend(None, 0, 2, 0, cat)
    one = cat.candidates[0]
    assert backend.check(one, make_call(count=(1 << 20) // 4, op=NCCL_SUM, dtype=NCCL_FLOAT32)) is None
    why = backend.check(one, make_call(count=(1 << 20) // 4 + 1, op=NCCL_SUM, dtype=NCCL_FLOAT32))
    assert why and f"the scratch serves 1 element to {1 << 20} B" in why


# --- cost model and tune ------------------------------------------------------------------

def test_cost_model_numbers_of_the_docstring():
    cfg = preset("h200")
    t = lambda kind, nbytes, n: round(small_allreduce_seconds(kind, nbytes, n, cfg) * 1e6, 1)  # noqa: E731
    assert (t("oneshot", 1024, 2), t("twoshot", 1024, 2)) == (5.3, 6.6)
    assert (t("oneshot", 256 << 10, 2), t("twoshot", 256 << 10, 2)) == (7.0, 8.2)
    assert (t("oneshot", MAX, 2), t("twoshot", MAX, 2)) == (18.6, 19.5)
    assert (t("oneshot", 256 << 10, 8), t("twoshot", 256 << 10, 8)) == (16.7, 9.4)
    assert small_allreduce_seconds("oneshot", MAX + 1, 2, cfg) is None
    # a second node makes every hop a network hop: slower
    two_nodes = preset("h200", gpus_per_node=4)
    assert small_allreduce_seconds("oneshot", 1024, 8, two_nodes) > small_allreduce_seconds("oneshot", 1024, 8, cfg)


def test_the_model_has_the_ll128_kernels_lose_small_and_win_large():
    """As measured on H100 (2026-11-27): the second read after each flag costs the LL128 forms
    their small sizes; their bytes win the large ones."""
    cfg = preset("h200")
    t = lambda kind, nbytes, n: small_allreduce_seconds(kind, nbytes, n, cfg)  # noqa: E731
    for n in (2, 4):
        assert t("oneshot_ll128", 1024, n) > t("oneshot", 1024, n)
        assert t("twoshot_ll128", 1024, n) > t("twoshot", 1024, n)
        assert t("oneshot_ll128", MAX, n) < t("oneshot", MAX, n)
        assert t("twoshot_ll128", MAX, n) < t("twoshot", MAX, n)


def test_model_timer_times_kernel_candidates_only_where_they_serve():
    from runtime_cuda.nccl import tune

    timer = tune.ModelTimer("h200", 4)
    one, two, *ll128 = tune.kernel_candidates("allreduce", 4, 1)
    assert [(c.kernel, c.protocol) for c in ll128] == [("oneshot_ll128", "LL128"), ("twoshot_ll128", "LL128")]
    assert tune.kernel_candidates("alltoall", 4, 1) == [] and tune.kernel_candidates("allreduce", 8, 2) == []
    ag, ag128 = tune.kernel_candidates("allgather", 4, 1)
    assert (ag.collective, ag.label, ag128.label) == ("allgather", "oneshot_allgather_4r", "oneshot_ll128_allgather_4r")
    # an allgather of nccl-tests size 4 KiB on 4 ranks moves 1 KiB blocks: the one-shot's time for 1 KiB
    assert timer.time(ag, 4096, True) == small_allreduce_seconds("oneshot", 1024, 4, timer.config)
    assert timer.time(ag, MAX + 1, True) is None
    assert timer.time(one, 1024, True) == small_allreduce_seconds("oneshot", 1024, 4, timer.config)
    assert timer.time(two, MAX * 4, False) is None
    ranges = tune.served_ranges(tune.choose([one, two], [1 << 10, 1 << 20, 1 << 23], timer, True, "allreduce"))
    # a range ends halfway (geometrically) to the next measured size, a kernel's at its limit at most
    assert [(lo, hi, c and c.kernel) for lo, hi, c in ranges] == [(0, 1 << 15, "oneshot"), ((1 << 15) + 1, MAX, "twoshot"),
                                                                 (MAX + 1, None, None)]


# --- kernel source ------------------------------------------------------------------------

def test_scratch_holds_both_kernels_largest_calls():
    from runtime_cuda.core import abi
    from runtime_cuda.ranks.small_allreduce import BLOCKS, HEADER_BYTES, scratch_shape

    C = abi.C
    assert 8 * (C["GC3_SA_COUNTERS"] + C["GC3_SA_MAX_BLOCKS"]) <= HEADER_BYTES
    assert C["GC3_SA_ERR"] + abi.ERR_NFIELDS // 2 <= C["GC3_SA_COUNTERS"] and BLOCKS <= C["GC3_SA_MAX_BLOCKS"]
    for n in range(1, 9):
        max_lines, region, nbytes = scratch_shape(n, MAX)
        slot = -(-max_lines // 15)     # 15 data words a 128-byte line: one-shot's n slots, two-shot's 2n halves
        assert nbytes == HEADER_BYTES + 2 * region * 16 + 2 * 128 * max(n * slot, 2 * n * -(-slot // n))
        assert HEADER_BYTES % 128 == 0 and region * 16 % 128 == 0   # the LL128 lines are whole lines
        for itemsize in (1, 2, 4, 8):
            count = MAX // itemsize
            lines = -(-count // (8 // itemsize))
            seg = -(-lines // n)
            S = -(-max_lines // n)
            assert lines <= max_lines and seg <= S
            assert n * max_lines <= region and 2 * n * S <= region   # one-shot slots; two-shot's two halves


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype, op", [("bfloat16", "sum"), ("uint8", "max"), ("float64", "min")])
def test_kernel_compiles(dtype, op, tmp_path):
    from runtime_cuda.core import module

    src = tmp_path / "k.cu"
    src.write_text(module.source("small_allreduce.cu"))
    opts = [o for o in module.options(dtype, op, "LL") if o.startswith("-D")]
    proc = subprocess.run(["nvcc", "-std=c++17", "--ptx", "-arch=sm_90", str(src), *opts, "-o", os.devnull],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("dtype, out_dtype, shift", [("bfloat16", None, False), ("float16", None, False),
                                                     ("float32", "bfloat16", False), ("bfloat16", "float32", True)])
def test_epilogue_build_compiles(dtype, out_dtype, shift, tmp_path):
    """The epilogue build (and its pass kernel), with a cast and with the shifted-peer test hook."""
    from runtime_cuda.core import module

    src = tmp_path / "k.cu"
    src.write_text(module.source("small_allreduce.cu"))
    opts = [o for o in module.options(dtype, "sum", "LL", epilogue=True, out_dtype=out_dtype) if o.startswith("-D")]
    opts += ["-DGC3_SA_SHIFT_PEERS"] if shift else []
    ptx = tmp_path / "k.ptx"
    proc = subprocess.run(["nvcc", "-std=c++17", "--ptx", "-arch=sm_90", str(src), *opts, "-o", str(ptx)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = ptx.read_text()
    assert all(f".entry {k}(" in text for k in ("gc3_small_allreduce", "gc3_small_allreduce_ll128", "gc3_epilogue_pass"))


# --- GPU: virtual ranks ---------------------------------------------------------------------

class Bufs:
    """Per rank an input and an output allocation with room for an offset of one element."""

    def __init__(self, n, dtype, count):
        import cupy

        st = cases.storage(np.zeros(1, dtype=cases.dtype_info(dtype).np)).dtype
        self.itemsize = st.itemsize
        self.ins = [cupy.zeros(count + 1, dtype=st) for _ in range(n)]
        self.outs = [cupy.zeros(count + 1, dtype=st) for _ in range(n)]
        cupy.cuda.Device().synchronize()    # zeroed on the legacy stream; the tests' streams do not wait for it

    def ptrs(self, inplace, off):
        ins = [a.data.ptr + off * self.itemsize for a in self.ins]
        return ins, (ins if inplace else [a.data.ptr + off * self.itemsize for a in self.outs])


def _issue_and_wait(group, in_ptrs, out_ptrs, in_elems, avg_elems, dtype, op, stream, **which):
    """One call through the group (avg: the sum kernel, then the division pass over
    `avg_elems` of each output, as the drop-in does), waited for and checked."""
    from runtime_cuda.core import avg

    group.run_ptrs(in_ptrs, out_ptrs, in_elems, dtype, "sum" if op == "avg" else op, stream, **which)
    if op == "avg":
        for p in out_ptrs:
            avg.divide(p, avg_elems, dtype, group.nranks, stream.ptr)
    stream.synchronize()
    group.check()


def _run_case(group, bufs, dtype, op, kind, count, inplace, off, seed, stream):
    import cupy

    n = group.nranks
    ins = cases.inputs(seed, n, count, dtype, op)
    for a, x in zip(bufs.ins, ins):
        a[off:off + count].set(cases.storage(x), stream=stream)
    if not inplace:
        for a in bufs.outs:      # poisoned, on the call's stream: a missed element shows
            cupy.cuda.runtime.memsetAsync(a.data.ptr, 0x55, a.nbytes, stream.ptr)
    in_ptrs, out_ptrs = bufs.ptrs(inplace, off)
    _issue_and_wait(group, in_ptrs, out_ptrs, count, count, dtype, op, stream, kind=kind)
    want = cases.expected(ins, op, dtype)
    for r in range(n):
        src = bufs.ins[r] if inplace else bufs.outs[r]
        got = src[off:off + count].get().view(want.dtype)
        bad = cases.first_wrong(got, want)
        if bad:
            return f"{n} ranks {kind} {dtype} {op} count={count} {'in' if inplace else 'out-of'}-place " \
                   f"offset={off} rank {r}: {bad}"
    return ""


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_virtual_every_dtype_op_count_and_placement(n, dtype):
    import cupy

    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    group = SmallAllreduce.virtual(n, timeout=10, max_bytes=MAX)
    s = cupy.cuda.Stream(non_blocking=True)
    wrong = []
    bufs = Bufs(n, dtype, max(cases.counts(dtype)))
    for op in cases.OPS:
        for kind in limits.SMALL_ALLREDUCE_KERNELS:
            for i, count in enumerate(cases.counts(dtype)):
                inplace, off = bool(i & 1), (i >> 1) & 1     # each count in one of the four placements
                seed = ((n * 10 + cases.DTYPES.index(dtype)) * 10 + cases.OPS.index(op)) * 100 + i
                why = _run_case(group, bufs, dtype, op, kind, count, inplace, off, seed, s)
                if why:
                    wrong.append(why)
    assert not wrong, "\n".join(wrong[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", limits.SMALL_ALLREDUCE_KERNELS)
def test_a_shifted_peer_fails_the_check(kind, monkeypatch):
    """The kernels' test hook (small_allreduce.SHIFT_PEERS) reduces peer p + 1's lines where
    p's belong: the check these tests use must reject what it gives, at one block and many."""
    import cupy

    from runtime_cuda.ranks import small_allreduce

    monkeypatch.setattr(small_allreduce, "SHIFT_PEERS", True)
    group = small_allreduce.SmallAllreduce.virtual(4, timeout=10)
    s = cupy.cuda.Stream(non_blocking=True)
    for count in (33, 20011):
        bufs = Bufs(4, "int32", count)
        assert _run_case(group, bufs, "int32", "sum", kind, count, False, 0, count, s), (kind, count)


@pytest.mark.gpu
def test_negative_zero_survives():
    import cupy

    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    group = SmallAllreduce.virtual(4, timeout=10)
    s = cupy.cuda.Stream(non_blocking=True)
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        info = cases.dtype_info(dtype)
        count = 1001
        bufs = Bufs(4, dtype, count)
        neg = np.full(count, -0.0, dtype=info.np)
        for kind in limits.SMALL_ALLREDUCE_KERNELS:
            for a in bufs.ins:
                a[:count].set(cases.storage(neg), stream=s)
            in_ptrs, out_ptrs = bufs.ptrs(False, 0)
            group.run_ptrs(in_ptrs, out_ptrs, count, dtype, "sum", s, kind=kind)
            s.synchronize()
            group.check()
            for o in bufs.outs:
                got = o[:count].get().view(info.np)
                assert not cases.first_wrong(got, neg), (dtype, kind, cases.first_wrong(got, neg))


@pytest.mark.gpu
def test_200_calls_back_to_back_with_changing_inputs_sizes_and_kernels():
    import cupy

    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    # Sizes that take 1 block, 3 and the most: every block of a call must agree on its number
    # whatever grid the calls before it had.
    n, calls, dtype = 4, 200, "float32"
    sizes = (2999, 17, 1201, MAX // 4 - 5)
    group = SmallAllreduce.virtual(n, timeout=10, max_bytes=MAX)
    s = cupy.cuda.Stream(non_blocking=True)
    srcs = [[cupy.asarray(x) for x in cases.inputs(1000 + i, n, sizes[i % len(sizes)], dtype, "sum")] for i in range(calls)]
    ins = [cupy.zeros(max(sizes), cupy.float32) for _ in range(n)]
    outs = [cupy.zeros(max(sizes), cupy.float32) for _ in range(n)]
    results = [[cupy.zeros(sizes[i % len(sizes)], cupy.float32) for _ in range(n)] for i in range(calls)]
    cupy.cuda.Device().synchronize()
    d2d = 3   # cudaMemcpyDeviceToDevice
    for i in range(calls):          # nothing waits for the host between calls
        count = sizes[i % len(sizes)]
        for r in range(n):
            cupy.cuda.runtime.memcpyAsync(ins[r].data.ptr, srcs[i][r].data.ptr, 4 * count, d2d, s.ptr)
        group.run_ptrs([a.data.ptr for a in ins], [a.data.ptr for a in outs], count, dtype, "sum", s,
                       kind=KERNELS[(i // 2) % len(KERNELS)])
        for r in range(n):
            cupy.cuda.runtime.memcpyAsync(results[i][r].data.ptr, outs[r].data.ptr, 4 * count, d2d, s.ptr)
    s.synchronize()
    group.check()
    for i in range(calls):
        want = cases.expected([x.get() for x in srcs[i]], "sum", dtype)
        for r in range(n):
            bad = cases.first_wrong(results[i][r].get(), want)
            assert not bad, f"call {i} rank {r}: {bad}"


def _counters(group, rank):
    from runtime_cuda.core import abi

    words = group._keep[rank][abi.C["GC3_SA_COUNTERS"]:abi.C["GC3_SA_COUNTERS"] + group._blocks].get()
    assert np.all(words == words[0]), "the blocks of one rank disagree on the call count"
    return int(words[0])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", limits.SMALL_ALLREDUCE_KERNELS)
def test_graph_replays_are_new_calls(kind):
    import cupy

    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    n, count, dtype = 4, 5003, "int32"
    group = SmallAllreduce.virtual(n, timeout=10)
    s = cupy.cuda.Stream(non_blocking=True)
    bufs = Bufs(n, dtype, count)
    in_ptrs, out_ptrs = bufs.ptrs(False, 1)
    cupy.cuda.Device().synchronize()
    s.begin_capture()               # before any eager call: the call's set-up happens during capture
    group.run_ptrs(in_ptrs, out_ptrs, count, dtype, "sum", s, kind=kind)
    graph = s.end_capture()
    for it in range(20):
        ins = cases.inputs(it, n, count, dtype, "sum")
        for a, x in zip(bufs.ins, ins):
            a[1:1 + count].set(x, stream=s)
        s.synchronize()
        before = _counters(group, 0)
        if it % 5 == 4:
            group.run_ptrs(in_ptrs, out_ptrs, count, dtype, "sum", s, kind=kind)
        else:
            graph.launch(stream=s)
        s.synchronize()
        group.check()
        assert all(_counters(group, r) == before + 1 for r in range(n)), "a call did not advance the epoch"
        want = cases.expected(ins, "sum", dtype)
        for r in range(n):
            bad = cases.first_wrong(bufs.outs[r][1:1 + count].get(), want)
            assert not bad, f"{'eager' if it % 5 == 4 else 'replay'} {it} rank {r}: {bad}"


class _Device:
    def __init__(self, cc):
        self.compute_capability = cc


def test_launches_are_marked_only_where_the_kernel_can_wait_for_its_predecessor(monkeypatch):
    """No mark below sm_90 (griddepcontrol is sm_90's), none under GC3_PDL=0, and none
    without cuda.bindings (CuPy's launch takes no attributes)."""
    import builtins
    import types

    from runtime_cuda.core import cudadriver, launcher

    head = (0, 1, 1, 1, 32, 1, 1, 0)
    assert launcher.pdl_launch(head, _Device("80")) is None
    monkeypatch.setenv("GC3_PDL", "0")
    assert launcher.pdl_launch(head, _Device("90")) is None
    monkeypatch.delenv("GC3_PDL")
    real_import = builtins.__import__

    def no_bindings(name, *args, **kw):
        if name.startswith("cuda.bindings") or (name == "cuda" and "bindings" in (args[2] or ())):
            raise ImportError(name)
        return real_import(name, *args, **kw)
    cudadriver.driver.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(builtins, "__import__", no_bindings)
        assert launcher.pdl_launch(head, _Device("90")) is None
    # A driver of CUDA 12.2 cannot capture a marked launch.
    old = types.SimpleNamespace(CUresult=types.SimpleNamespace(CUDA_SUCCESS=0),
                                cuDriverGetVersion=lambda: (0, 12020))
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = old
    cudadriver.driver.cache_clear()
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
        m.setitem(sys.modules, "cuda.bindings", bindings)
        m.setitem(sys.modules, "cuda.bindings.driver", old)
        assert launcher.pdl_launch(head, _Device("90")) is None
        cudadriver.driver.cache_clear()
        old.cuDriverGetVersion = lambda: (0, 12030)    # the control: the same fake, new enough
        assert cudadriver.driver(12030) is old
    cudadriver.driver.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["oneshot", "twoshot_ll128"])
def test_repeats_on_temporary_streams_are_ordered_by_the_count(kind):
    """The repeat path on streams passed by handle, each destroyed right after its call, each
    call in place summing what the one before stored, the one before held back by a busy
    kernel: the count its blocks bump (StreamOrder.counted) is the only mark each stream
    gets, and the next stream waits for it.  A captured call in between bumps nothing: the
    counter ends equal to the eager blocks the order counted."""
    import cupy

    from runtime_cuda.core import cudadriver
    from runtime_cuda.fused import gemm_signal
    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    n, count, dtype = 2, 4099, "int32"
    group = SmallAllreduce.virtual(n, timeout=10)
    order = group.executor.order
    bufs = Bufs(n, dtype, count)
    ptrs, _ = bufs.ptrs(True, 0)
    xs = [(np.arange(count) % 7 + r).astype(np.int32) for r in range(n)]
    first = cupy.cuda.Stream(non_blocking=True)
    for a, x in zip(bufs.ins, xs):
        a[:count].set(x, stream=first)
    group.run_ptrs(ptrs, ptrs, count, dtype, "sum", first, kind=kind)
    counts = order.counter() != 0
    assert counts == (cudadriver.driver() is not None)
    rep = group.reissue(ptrs, ptrs, count, dtype, "sum", kind=kind)
    assert rep is not None and (rep.launch.counting is not None) == counts
    total = sum(x.astype(np.int64) for x in xs)
    prev = first
    for i in range(12):
        if i == 6:   # a captured call on a stream of its own: replayed later, it counts nothing
            c = cupy.cuda.Stream(non_blocking=True)
            c.begin_capture()
            assert rep(c.ptr)
            graph = c.end_capture()
        s = cupy.cuda.Stream(non_blocking=True)
        gemm_signal.spin(s.ptr, 2e-4)      # this stream's call starts late; the next one must wait for it
        assert rep(s.ptr)
        total = total * n
        del prev                           # destroyed by its owner: the order must not touch it
        prev = s
    prev.synchronize()
    group.check()
    for r in range(n):
        got = bufs.ins[r][:count].get().astype(np.int64)
        bad = np.flatnonzero(got != total)
        assert bad.size == 0, f"{kind} rank {r}: element {bad[0]} is {got[bad[0]]}, want {total[bad[0]]}"
    graph.launch(stream=prev)
    prev.synchronize()
    group.check()
    if counts:
        word = int(cupy.asarray(order._counter_mem).get()[0])
        assert word == order.total % 2**32 and order.total > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", limits.SMALL_ALLREDUCE_KERNELS)
def test_a_graph_of_calls_that_each_read_the_last_ones_result(kind):
    """In-place calls chained in one graph, each summing what the one before stored, some
    after a plain kernel that changes rank 0's buffer.  The captured launches are marked for
    programmatic dependent launch (on sm_90 with cuda.bindings): a call that read its input
    or its call count before the kernel ahead of it had finished would sum stale values."""
    import cupy

    from runtime_cuda.core.launcher import pdl_launch
    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    n, count, dtype, calls = 2, 4099, "int32", 16
    group = SmallAllreduce.virtual(n, timeout=10)
    s = cupy.cuda.Stream(non_blocking=True)
    bufs = Bufs(n, dtype, count)
    ptrs, _ = bufs.ptrs(True, 0)
    x0 = [(np.arange(count) % 5 + r).astype(np.int32) for r in range(n)]
    bump = cupy.ElementwiseKernel("", "int32 x", "x += 1", "gc3_test_bump")
    cupy.cuda.Device().synchronize()
    s.begin_capture()
    for i in range(calls):
        group.run_ptrs(ptrs, ptrs, count, dtype, "sum", s, kind=kind)
        if i % 3 == 0:
            with s:
                bump(bufs.ins[0][:count])
    graph = s.end_capture()
    marked = pdl_launch((0, 1, 1, 1, 32, 1, 1, 0), cupy.cuda.Device()) is not None
    for replay in range(3):
        xs = [x.copy() for x in x0]
        for a, x in zip(bufs.ins, xs):
            a[:count].set(x, stream=s)
        graph.launch(stream=s)
        s.synchronize()
        group.check()
        for i in range(calls):
            total = sum(x.astype(np.int64) for x in xs)
            xs = [total.copy() for _ in range(n)]
            if i % 3 == 0:
                xs[0] += 1
        for r in range(n):
            got = bufs.ins[r][:count].get().astype(np.int64)
            bad = np.flatnonzero(got != xs[r])
            assert bad.size == 0, (f"{kind} replay {replay} rank {r} (launches marked: {marked}): element "
                                   f"{bad[0]} is {got[bad[0]]}, want {xs[r][bad[0]]}")


@pytest.mark.gpu
def test_a_rank_out_of_step_times_out_with_a_message_and_stops_the_group():
    import cupy

    from gc3.errors import RuntimeTimeoutError
    from runtime_cuda.core.launcher import CommunicatorBroken
    from runtime_cuda.ranks.small_allreduce import SmallAllreduce
    from runtime_cuda.core import abi

    group = SmallAllreduce.virtual(2, timeout=0.5)
    s = cupy.cuda.Stream(non_blocking=True)
    bufs = Bufs(2, "float32", 100)
    in_ptrs, out_ptrs = bufs.ptrs(False, 0)
    group.run_ptrs(in_ptrs, out_ptrs, 100, "float32", "sum", s)
    s.synchronize()
    group.check()
    # rank 1 believes it is one call further: its lines carry another flag, and neither rank's arrive
    c0 = abi.C["GC3_SA_COUNTERS"]
    group._keep[1][c0:c0 + abi.C["GC3_SA_MAX_BLOCKS"]] += 1
    cupy.cuda.Device().synchronize()
    group.run_ptrs(in_ptrs, out_ptrs, 100, "float32", "sum", s)
    s.synchronize()
    with pytest.raises(RuntimeTimeoutError, match=r"timed out after 0.5 s .* small-message allreduce: rank [01] "
                                                  r"block 0, one-shot gather: waiting for line \d+ from rank [01]"):
        group.check()
    with pytest.raises(CommunicatorBroken):
        group.run_ptrs(in_ptrs, out_ptrs, 100, "float32", "sum", s)


# --- GPU: processes sharing the GPU -----------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
@pytest.mark.parametrize("nprocs", [2, 4])
def test_processes_sharing_one_gpu_direct_and_through_the_drop_in(nprocs):
    pytest.importorskip("mpi4py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    program = ROOT / "tests" / "gpu_programs" / "small_allreduce_ipc.py"
    proc = subprocess.run(["mpirun", "-np", str(nprocs), sys.executable, str(program)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=170)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = [line for line in out.splitlines() if line.startswith("SMALL rank")]
    assert len(lines) == nprocs and all("wrong: none" in line for line in lines), out[-4000:]


# --- GPU: the one-shot allgather and reducescatter on virtual ranks ---------------------------

def _gather_scatter_case(group, coll, dtype, op, count, inplace, off, seed, stream, kind="oneshot"):
    """One allgather (`count` elements per rank's block) or reducescatter (`count`
    out, n * count in) through the group's `kind` kernel, against numpy; "" when right."""
    import cupy

    n, info = group.nranks, cases.dtype_info(dtype)
    st = cases.storage(np.zeros(1, dtype=info.np)).dtype
    big = n * count
    ins = cases.inputs(seed, n, count if coll == "allgather" else big, dtype, op)
    bufs = [cupy.zeros(big + 1, dtype=st) for _ in range(n)]            # the larger buffer, in place
    outs = [cupy.full(big + 1, 0x55, dtype=st) for _ in range(n)]       # poisoned: a missed element shows
    cupy.cuda.Device().synchronize()
    at = lambda a, e: a.data.ptr + (off + e) * st.itemsize  # noqa: E731
    in_ptrs, out_ptrs = [], []
    for r, (b, o, x) in enumerate(zip(bufs, outs, ins)):
        if coll == "allgather":
            # in place, rank r's input is block r of its output
            b[off + (r * count if inplace else 0):][:count].set(cases.storage(x), stream=stream)
            in_ptrs.append(at(b, r * count if inplace else 0))
            out_ptrs.append(at(b, 0) if inplace else at(o, 0))
        else:
            b[off:off + big].set(cases.storage(x), stream=stream)
            in_ptrs.append(at(b, 0))
            out_ptrs.append(at(b, r * count) if inplace else at(o, 0))
    _issue_and_wait(group, in_ptrs, out_ptrs, count if coll == "allgather" else big, count, dtype, op, stream,
                    coll=coll, kind=kind)
    reduced = cases.expected(ins, op, dtype) if coll == "reducescatter" else None
    for r in range(n):
        if coll == "allgather":
            want = np.concatenate(ins)
            src, start, length = (bufs[r] if inplace else outs[r]), off, big
        else:
            want = reduced[r * count:(r + 1) * count]
            src, start, length = (bufs[r], off + r * count, count) if inplace else (outs[r], off, count)
        got = src[start:start + length].get().view(want.dtype)
        bad = cases.first_wrong(got, want)
        if bad:
            return (f"{n} ranks {coll} {dtype} {op} count={count} {'in' if inplace else 'out-of'}-place "
                    f"offset={off} rank {r}: {bad}")
    return ""


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 4, 8])
def test_virtual_allgather_and_reducescatter_kernels(n):
    """Every dtype, counts from one element to the scratch's limit, in and out of
    place, offset by an element, with allreduce calls of both kernels between them
    on the same group (their block counters must keep agreeing on the call number)."""
    import cupy

    from runtime_cuda.ranks.small_allreduce import SmallAllreduce

    group = SmallAllreduce.virtual(n, timeout=10, max_bytes=MAX)
    s = cupy.cuda.Stream(non_blocking=True)
    wrong = []
    allreduce_bufs = Bufs(n, "float32", 4099)
    for d, dtype in enumerate(cases.DTYPES):
        es = cases.dtype_info(dtype).np.itemsize
        counts = [1, 3, 1000, 4097, MAX // es // n - 5, MAX // es]   # the last: a block of the whole scratch
        for i, count in enumerate(counts):
            for coll in ("allgather", "reducescatter"):
                op = cases.OPS[(i + d) % len(cases.OPS)] if coll == "reducescatter" else "sum"
                inplace, off = bool(i & 1), (i >> 1) & 1
                seed = ((n * 10 + d) * 10 + i) * 10 + (coll == "allgather")
                for kind in limits.SMALL_KERNELS[coll]:
                    why = _gather_scatter_case(group, coll, dtype, op, count, inplace, off, seed, s, kind)
                    if why:
                        wrong.append(f"{kind}: {why}")
            why = _run_case(group, allreduce_bufs, "float32", "sum", KERNELS[i % len(KERNELS)],
                            (1, 4099)[i & 1], False, 0, seed, s)
            if why:
                wrong.append("allreduce between: " + why)
    assert not wrong, "\n".join(wrong[:10])


def test_gather_scatter_refusals_name_the_call():
    from runtime_cuda.ranks.small_allreduce import KINDS, block_elems, refusal

    assert ("allgather", "twoshot") not in KINDS and ("reducescatter", "oneshot") in KINDS
    assert block_elems("reducescatter", 4096, 4) == 1024 and block_elems("allgather", 4096, 4) == 4096
    assert "1 element to" in refusal("float32", "sum", 0, coll="reducescatter", nranks=4)
    assert "does not split into 4 segments" in refusal("float32", "sum", 6, coll="reducescatter", nranks=4)
    assert refusal("float32", "sum", 8, 8, coll="reducescatter", nranks=4) is None        # 2 elements a block
    assert "serves 1 element to 4 B" in refusal("float32", "sum", 8, 4, coll="allgather", nranks=4)


# --- the error record, as the host reads it back ----------------------------------------

def _record(**fields):
    from runtime_cuda.core import abi

    err = np.zeros(abi.ERR_NFIELDS, dtype=np.int32)
    err[abi.field("ERR", "SET")] = 1
    for name, value in fields.items():
        err[abi.field("ERR", name)] = value
    return err


@pytest.mark.parametrize("kind,want", [
    ("GC3_WAIT_LL", ["rank 1 block 7", "one-shot gather", "line 2 from rank 3 (its flag 41, expected 42"]),
    ("GC3_WAIT_SLICE", ["rank 1 block 7 waited for block 3 of the same rank", "split-K slice 5 of column tile 2",
                        "(its last call 41, this call 4294967338)"]),
])
def test_a_timed_out_wait_says_what_it_waited_for(kind, want):
    """The GEMV's split-K blocks wait for slices of their own rank, not for a peer's line: the
    message says so (and keeps the 64-bit call numbers whole)."""
    from types import SimpleNamespace

    from runtime_cuda.core import abi
    from runtime_cuda.ranks.small_allreduce import SmallExecutor

    err = _record(KIND=abi.C[kind], RANK=1, TB=7, STEP=0, TILE=2, A=3, B=5, SEEN_LO=41, WANT_LO=42,
                  WANT_HI=1 if kind == "GC3_WAIT_SLICE" else 0)
    msg = SmallExecutor.describe_error(SimpleNamespace(timeout=5.0), err)
    assert msg.startswith("GPU wait timed out after 5 s")
    for part in want:
        assert part in msg, (part, msg)


def test_the_small_kernels_blocks_shrink_to_spread_a_call_over_more_of_them():
    """limits.small_allreduce_threads: a line (8 bytes) a thread in at most the group's most
    blocks, in whole warps, 128 to 512 threads; the blocks then cover every line once."""
    from gc3 import limits
    seen = []
    for nbytes in (8, 1000, 1 << 10, 64 << 10, 100 << 10, 256 << 10, 1 << 20, 2 << 20):
        for most in (1, 33, 128):
            t = limits.small_allreduce_threads(nbytes, most)
            b = limits.small_allreduce_blocks(nbytes, most, t)
            lines = -(-nbytes // limits.SMALL_ALLREDUCE_LINE_DATA_BYTES)
            assert t % 32 == 0 and limits.SMALL_ALLREDUCE_MIN_THREADS <= t <= limits.SMALL_ALLREDUCE_THREADS
            assert 1 <= b <= most
            assert b * t >= lines or t == limits.SMALL_ALLREDUCE_THREADS and b == most
            seen.append((nbytes, most, t, b))
    assert (64 << 10, 128, 128, 64) in seen and (256 << 10, 128, 256, 128) in seen and (2 << 20, 128, 512, 128) in seen
