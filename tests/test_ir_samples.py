"""The shipped ir_samples/: exactly what `gc3 catalog build` writes now,
an index.json the NCCL-replacement catalog accepts entry for entry, and every
sample verified and simulated against numpy for 3 sizes, 2 dtypes and every
reduction op its collective takes."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from gc3.dtypes import OPS
from gc3.ir.layout import blocks_of
from gc3.simulator import simulate
from gc3.verify import verify
from gc3.ir.xml_io import read_xml
from runtime_cuda.nccl import samples as gen

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "ir_samples"
ENTRIES = json.loads((SAMPLES / "index.json").read_text())["algorithms"]
INDEX = [e for e in ENTRIES if "file" in e]        # the IR samples
KERNELS = [e for e in ENTRIES if "kernel" in e]    # the small-message allreduce kernels
REDUCING = {"allreduce", "reducescatter", "reduce"}


def test_committed_samples_are_what_the_generator_writes_now():
    assert gen.SAMPLES_DIR == SAMPLES
    assert gen.differences(SAMPLES) == [], "run: gc3 catalog build"


def test_generator_check_mode_reports_a_changed_sample(tmp_path):
    gen.generate(tmp_path)
    victim = tmp_path / INDEX[0]["file"]
    victim.write_text(victim.read_text().replace('proto="', 'proto="X', 1))
    (tmp_path / "stale.xml").write_text("<algo/>")
    assert sorted(gen.differences(tmp_path)) == [
        f"{INDEX[0]['file']}: differs from what `gc3 catalog build` writes now",
        "stale.xml: in %s but no longer generated" % tmp_path]


def test_sample_set_is_moderate_and_covers_the_configurations():
    files = sorted(p.name for p in SAMPLES.glob("*.xml"))
    fused = sorted(f"{name}.xml" for name in gen.FUSED)     # written, never indexed: no NCCL call
    assert fused and set(fused) <= set(files)
    files = sorted(set(files) - set(fused))
    assert files == sorted({e["file"] for e in INDEX})   # an IR may be listed twice (in/out-of-place ranges)
    assert 20 <= len(files) <= 60
    assert sum(p.stat().st_size for p in SAMPLES.iterdir()) < 3 * 1024 * 1024
    progs = [read_xml(SAMPLES / e["file"]) for e in INDEX]
    assert {p.ngpus for p in progs} == {2, 4, 8}
    assert {p.proto for p in progs} == {"Simple", "LL"}
    assert {p.nchannels > 1 for p in progs} == {True, False}
    assert {p.inplace for p in progs} == {True, False}
    assert {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce"} == {p.coll for p in progs}
    assert any("2x4" in e["file"] for e in INDEX)


def test_index_entries_state_what_the_xml_holds_and_ranges_do_not_overlap():
    ranges = defaultdict(list)
    for e in INDEX:
        prog = read_xml(SAMPLES / e["file"])
        assert (e["collective"], e["ranks"], e["inplace"], e["protocol"]) == \
               (prog.coll, prog.ngpus, prog.inplace, prog.proto), e["file"]
        # The XML's range is the entry's, or the union of its entries' when it is listed twice.
        mine = [x for x in INDEX if x["file"] == e["file"]]
        assert prog.minBytes == min(x["min_bytes"] for x in mine)
        tops = [x["max_bytes"] for x in mine]
        assert None in tops or prog.maxBytes == max(tops)
        assert ("root" in e) == (prog.coll in ("broadcast", "reduce"))
        ranges[(prog.coll, prog.ngpus, prog.inplace, "2x4" in e["file"])].append(
            (e["min_bytes"], e["max_bytes"] if e["max_bytes"] is not None else float("inf")))
    for key, spans in ranges.items():
        spans.sort()
        for (lo1, hi1), (lo2, hi2) in zip(spans, spans[1:]):
            assert lo1 <= hi1 < lo2 <= hi2, f"{key}: size ranges overlap: {spans}"


def test_catalog_loads_every_index_entry():
    from runtime_cuda.nccl.catalog import load_catalog
    catalog = load_catalog({})
    assert [c.kernel or c.path.name for c in catalog.candidates] == [e.get("kernel") or e["file"] for e in ENTRIES]


def test_the_small_message_kernels_lead_the_allreduce_entries_up_to_their_limit():
    """Kernel entries come first (selection takes the first match), one-shot from 0, and
    each rank count's ranges tile [0, the kernels' limit] as the cost model splits it."""
    from gc3 import limits
    from gc3.simulator.cost_config import preset
    from gc3.simulator.small_allreduce import small_allreduce_seconds

    assert KERNELS and ENTRIES[:len(KERNELS)] == KERNELS
    for e in KERNELS:
        if e["collective"] != "allreduce":   # the one-shot allgather/reducescatter, where measured, from 0
            assert e["kernel"] == "oneshot" and e["min_bytes"] == 0, e
            assert e["max_bytes"] == gen.GATHER_SCATTER_TOP[e["ranks"]] <= limits.SMALL_ALLREDUCE_MAX_BYTES
    for ranks in sorted({e["ranks"] for e in KERNELS}):
        mine = [e for e in KERNELS if e["ranks"] == ranks and e["collective"] == "allreduce"]
        assert mine[0]["kernel"] == "oneshot" and mine[0]["min_bytes"] == 0
        assert mine[-1]["max_bytes"] == gen.KERNEL_TOP.get(ranks, limits.SMALL_ALLREDUCE_DEFAULT_BYTES)
        for a, b in zip(mine, mine[1:]):
            assert b["min_bytes"] == a["max_bytes"] + 1
        for e in mine:   # the kernel the index names is the model's faster one at its range's top
            other = "twoshot" if e["kernel"] == "oneshot" else "oneshot"
            t = lambda k: small_allreduce_seconds(k, e["max_bytes"], ranks, preset())  # noqa: E731
            assert t(e["kernel"]) <= t(other) or e is mine[-1], (ranks, e)


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"][:-4] for e in INDEX])
def test_sample_verifies_and_simulates_correctly(entry):
    prog = read_xml(SAMPLES / entry["file"])
    verify(prog)
    g = prog.gpus[0]
    blocks, _ = blocks_of(prog.coll, prog.ngpus, g.i_chunks, g.o_chunks)
    ops = sorted(OPS) if prog.coll in REDUCING else ["sum"]
    for count in (blocks, blocks * 37, blocks * 1000):       # one element per block; two uneven
        for dtype in ("float32", "bfloat16"):
            for op in ops:
                res = simulate(prog, count=count, dtype=dtype, op=op, root=entry.get("root", 0))
                assert res.ok, f"count={count} {dtype} {op}: {res.errors[:2]}"
