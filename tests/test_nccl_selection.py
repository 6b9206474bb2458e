"""Algorithm selection for the NCCL replacement: every field of the contract,
load order, the fallback log, and bad catalog files (CPU only)."""
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from gc3.ir.xml_io import read_xml, write_xml
from runtime_cuda.nccl import catalog as catalog_mod
from runtime_cuda.nccl.call import Call
from runtime_cuda.nccl.catalog import load_catalog
from runtime_cuda.nccl.constants import (ITEMSIZE, NCCL_BFLOAT16, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_INT32,
                                         NCCL_MAX, NCCL_SUM)
from runtime_cuda.nccl.log import get_logger
from runtime_cuda.nccl.selection import Rejection, Selector, check, select
from gc3.units import parse_size
from runtime_cuda.nccl.sizes import size_bucket

DATA = Path(__file__).parent / "data" / "msccl"
PAIRS = DATA / "allreduce_allpairs_2r_1i.xml"     # allreduce, 2 ranks, LL, in-place
RING = DATA / "allreduce_ring_4r_1i.xml"          # allreduce, 4 ranks, Simple, in-place
A2A = DATA / "alltoall_two_step_2n_4g.xml"        # alltoall, 8 ranks, out-of-place

BCAST = """<algo name="bcast2" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" coll="broadcast" inplace="0"{root}>
  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="-1" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""


def variant(tmp_path, src, filename, **attrs):
    """A copy of IR `src` under tmp_path/filename with <algo> attributes changed."""
    path = tmp_path / filename
    write_xml(dataclasses.replace(read_xml(src), **attrs), path)
    return path


def make_call(coll="allreduce", count=1024, dtype=NCCL_FLOAT32, op=NCCL_SUM, nranks=2, rank=0,
              inplace=True, root=0):
    es = ITEMSIZE[dtype]
    recv = 1 << 30
    if not inplace:
        send = 1 << 20
    elif coll == "allgather":
        send = recv + rank * count * es
    elif coll == "reducescatter":
        send, recv = recv, recv + rank * count * es
    else:
        send = recv
    if coll not in ("allreduce", "reducescatter", "reduce"):
        op = None
    return Call(coll, send, recv, count, dtype, op, 0, nranks, rank, root)


def env_of(*paths, var="GC3_XML_FILES", **extra):
    return {var: ":".join(str(p) for p in paths), **extra}


def decide(env, call, runtime=None):
    return select(load_catalog(env), call, runtime)


def only_rejection(env, call):
    d = decide(env, call)
    assert d.candidate is None
    assert len(d.rejections) == 1
    return d.rejections[0]


# --- the Call: sizes and in-place rules -----------------------------------

@pytest.mark.parametrize("coll, count, nranks, in_elems, nbytes", [
    ("allreduce", 10, 4, 10, 40), ("broadcast", 10, 4, 10, 40), ("reduce", 10, 4, 10, 40),
    ("allgather", 10, 4, 10, 160), ("reducescatter", 10, 4, 40, 160), ("alltoall", 10, 4, 40, 160),
])
def test_call_sizes_follow_nccl_tests_size_column(coll, count, nranks, in_elems, nbytes):
    c = make_call(coll, count=count, nranks=nranks)
    assert (c.in_elems, c.nbytes) == (in_elems, nbytes)


@pytest.mark.parametrize("coll", ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_call_inplace_follows_nccl_offsets(coll, rank):
    assert make_call(coll, nranks=4, rank=rank, inplace=True).inplace
    assert not make_call(coll, nranks=4, rank=rank, inplace=False).inplace
    # Same buffer for allgather/reducescatter is in-place only on rank 0.
    same = Call(coll, 4096, 4096, 8, NCCL_FLOAT32, None, 0, 4, rank)
    assert same.inplace == (rank == 0 or coll not in ("allgather", "reducescatter"))


# --- every field of the contract --------------------------------------------

def test_collective_field():
    r = only_rejection(env_of(A2A), make_call("allreduce", nranks=8))
    assert (r.field, r.candidate) == ("collective", A2A.name)
    assert decide(env_of(A2A), make_call("alltoall", nranks=8, inplace=False)).candidate.path == A2A


def test_ranks_field():
    r = only_rejection(env_of(RING), make_call(nranks=2))
    assert r.field == "ranks" and "4 ranks" in r.detail and "2" in r.detail
    assert decide(env_of(RING), make_call(nranks=4, rank=3)).candidate.path == RING


def test_inplace_field(tmp_path):
    assert only_rejection(env_of(PAIRS), make_call(inplace=False)).field == "inplace"
    assert decide(env_of(PAIRS), make_call(inplace=True)).uses_gc3
    # An out-of-place-only IR refuses in-place calls.
    assert only_rejection(env_of(A2A), make_call("alltoall", nranks=8, inplace=True)).field == "inplace"
    # outofplace="1" on an in-place IR serves both.
    both = variant(tmp_path, PAIRS, "both.xml", outofplace=True)
    assert decide(env_of(both), make_call(inplace=False)).uses_gc3
    assert decide(env_of(both), make_call(inplace=True)).uses_gc3
    # ... and so does a config entry's outofplace setting, or it can forbid it.
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps([{"file": str(PAIRS), "outofplace": True}, {"file": str(both), "outofplace": False}]))
    d = decide({"GC3_CONFIG": str(cfg)}, make_call(inplace=False))
    assert d.candidate.path == PAIRS
    cfg.write_text(json.dumps([{"file": str(both), "outofplace": False}]))
    assert only_rejection({"GC3_CONFIG": str(cfg)}, make_call(inplace=False)).field == "inplace"


def test_size_range_fields_are_inclusive(tmp_path):
    ranged = variant(tmp_path, PAIRS, "ranged.xml", minBytes=4096, maxBytes=65536)
    env = env_of(ranged)
    assert decide(env, make_call(count=1024)).uses_gc3            # 4096 B == minBytes
    assert decide(env, make_call(count=16384)).uses_gc3           # 65536 B == maxBytes
    assert only_rejection(env, make_call(count=1023)).field == "minBytes"
    assert only_rejection(env, make_call(count=16385)).field == "maxBytes"


@settings(max_examples=60, deadline=None)
@given(lo=st.integers(0, 1 << 20), span=st.one_of(st.none(), st.integers(0, 1 << 20)),
       count=st.integers(1, 1 << 19), dtype=st.sampled_from([NCCL_FLOAT16, NCCL_FLOAT32, NCCL_INT32]))
def test_size_range_property(lo, span, count, dtype):
    base = load_catalog(env_of(PAIRS)).candidates[0]
    hi = None if span is None else lo + span
    cand = dataclasses.replace(base, min_bytes=lo, max_bytes=hi)
    call = make_call(count=count, dtype=dtype)
    verdict = check(cand, call)
    inside = lo <= call.nbytes and (hi is None or call.nbytes <= hi)
    assert (not isinstance(verdict, Rejection)) == inside
    if not inside:
        assert verdict.field == ("minBytes" if call.nbytes < lo else "maxBytes")


def test_count_field(tmp_path):
    assert only_rejection(env_of(PAIRS), make_call(count=0)).field == "count"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"algorithms": [{"file": str(PAIRS), "count_multiple": 8}]}))
    env = {"GC3_CONFIG": str(cfg)}
    assert decide(env, make_call(count=64)).uses_gc3
    r = only_rejection(env, make_call(count=60))
    assert r.field == "count" and "multiple of 8" in r.detail
    # Uneven sizes are fine where the layout allows them (short last chunks).
    assert decide(env_of(PAIRS), make_call(count=1001)).uses_gc3


def test_count_field_uses_layout_rule():
    # The 8-rank alltoall IR serves any per-peer count, but the layout needs the
    # program's chunks to split into the collective's blocks: a 1-chunk input
    # cannot hold 8 per-peer blocks.
    cand = load_catalog(env_of(A2A)).candidates[0]
    prog = cand.program
    bad = dataclasses.replace(prog, gpus=[dataclasses.replace(g, i_chunks=3) for g in prog.gpus])
    r = check(dataclasses.replace(cand, program=bad), make_call("alltoall", nranks=8, inplace=False))
    assert r.field == "count" and "i_chunks=3" in r.detail


def test_dtype_and_op_fields(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps([{"file": str(PAIRS), "dtypes": ["float32", "bfloat16"], "ops": ["sum"]}]))
    env = {"GC3_CONFIG": str(cfg)}
    assert decide(env, make_call(dtype=NCCL_BFLOAT16)).uses_gc3
    assert only_rejection(env, make_call(dtype=NCCL_FLOAT16)).field == "dtype"
    assert only_rejection(env, make_call(op=NCCL_MAX)).field == "op"
    # The IR's own redop narrows the ops when the config does not.
    maxonly = variant(tmp_path, PAIRS, "max.xml", redop="max")
    assert decide(env_of(maxonly), make_call(op=NCCL_MAX)).uses_gc3
    assert only_rejection(env_of(maxonly), make_call(op=NCCL_SUM)).field == "op"


def test_root_field(tmp_path):
    default = tmp_path / "b0.xml"
    default.write_text(BCAST.format(root=""))
    rooted = tmp_path / "b1.xml"   # the same schedule with the ranks' roles swapped
    swapped = BCAST.format(root=' root="1"').replace('<gpu id="0"', '<gpu id="X"').replace(
        '<gpu id="1"', '<gpu id="0"').replace('<gpu id="X"', '<gpu id="1"').replace(
        'send="1"', 'send="0"').replace('recv="0"', 'recv="1"')
    rooted.write_text(swapped)
    assert decide(env_of(default), make_call("broadcast", inplace=False, root=0)).uses_gc3
    assert only_rejection(env_of(default), make_call("broadcast", inplace=False, root=1)).field == "root"
    assert decide(env_of(rooted), make_call("broadcast", inplace=False, root=1)).uses_gc3


def test_runtime_field():
    def runtime(cand, call):
        return "bfloat16 is not built" if call.dtype == NCCL_BFLOAT16 else None
    env = env_of(PAIRS)
    assert decide(env, make_call(), runtime).uses_gc3
    d = decide(env, make_call(dtype=NCCL_BFLOAT16), runtime)
    assert d.candidate is None and d.rejections == [Rejection(PAIRS.name, "runtime", "bfloat16 is not built")]


def test_fields_are_checked_in_contract_order(tmp_path):
    # Everything is wrong at once: the first field of the contract is named.
    r = only_rejection(env_of(RING), make_call("alltoall", nranks=2, count=0, inplace=False))
    assert r.field == "collective"


# --- load order ----------------------------------------------------------------

def test_first_match_in_load_order_wins(tmp_path):
    a = variant(tmp_path, PAIRS, "a.xml", name="first")
    b = variant(tmp_path, PAIRS, "b.xml", name="second")
    assert decide(env_of(a, b), make_call()).candidate.path == a
    assert decide(env_of(b, a), make_call()).candidate.path == b
    # A directory contributes its files in name order.
    assert decide(env_of(tmp_path), make_call()).candidate.path == a


def test_later_candidate_serves_what_earlier_rejects(tmp_path):
    small = variant(tmp_path, PAIRS, "small.xml", maxBytes=1024)
    big = variant(tmp_path, PAIRS, "big.xml", minBytes=1025)
    env = env_of(small, big)
    assert decide(env, make_call(count=256)).candidate.path == small
    d = decide(env, make_call(count=257))
    assert d.candidate.path == big and [r.field for r in d.rejections] == ["maxBytes"]


def test_source_order_gc3_then_msccl_then_config(tmp_path):
    g = variant(tmp_path, PAIRS, "g.xml")
    m = variant(tmp_path, PAIRS, "m.xml")
    c = variant(tmp_path, PAIRS, "c.xml")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"version": 1, "algorithms": [{"file": "c.xml"}]}))
    full = {"GC3_XML_FILES": str(g), "MSCCL_XML_FILES": str(m), "GC3_CONFIG": str(cfg)}
    assert [x.path for x in load_catalog(full).candidates] == [g, m, c]
    assert decide({"MSCCL_XML_FILES": str(m), "GC3_CONFIG": str(cfg)}, make_call()).candidate.path == m
    assert decide({"GC3_CONFIG": str(cfg)}, make_call()).candidate.path == c


def test_xml_config_sets_size_range_and_protocol(tmp_path):
    cfg = tmp_path / "cfg.xml"
    cfg.write_text(f'<gc3_config>\n  <load path="{PAIRS}" minBytes="0" maxBytes="64KiB" proto="Simple"/>\n'
                   f'  <load path="{PAIRS}" minBytes="64KiB" proto="LL128" name="big"/>\n</gc3_config>\n')
    env = {"GC3_CONFIG": str(cfg)}
    small = decide(env, make_call(count=16))
    assert small.candidate.program.proto == "Simple" and read_xml(PAIRS).proto == "LL"
    big = decide(env, make_call(count=1 << 20))
    assert (big.candidate.name, big.candidate.program.proto) == ("big", "LL128")
    assert big.rejections[0].field == "maxBytes"


def test_default_index_is_read_and_its_absence_is_logged(tmp_path, monkeypatch, capsys):
    index = tmp_path / "index.json"
    monkeypatch.setattr(catalog_mod, "DEFAULT_INDEX", index)
    assert load_catalog({"GC3_DEBUG": "INFO"}).candidates == ()
    err = capsys.readouterr().err
    assert "INFO" in err and str(index) in err and "every call goes to NCCL" in err
    write_xml(read_xml(PAIRS), tmp_path / "pairs.xml")
    index.write_text(json.dumps({"version": 1, "algorithms": [
        {"file": "pairs.xml", "collective": "allreduce", "ranks": 2, "inplace": True, "protocol": "LL",
         "min_bytes": 0, "max_bytes": "1MiB"}]}))
    cands = load_catalog({}).candidates
    assert [(c.path, c.max_bytes, c.origin.startswith("default index")) for c in cands] == \
        [(tmp_path / "pairs.xml", 1 << 20, True)]
    # Any variable set replaces the default index.
    assert load_catalog(env_of(RING)).candidates[0].path == RING and len(load_catalog(env_of(RING)).candidates) == 1


# --- bad catalog input: one warning each, skipped, never a crash -----------------

def warnings_in(err):
    return [line for line in err.splitlines() if " WARNING " in line]


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read"),
    ("<algo", "not well-formed"),
    ('<algo name="x" proto="Fast" nchannels="1" nchunksperloop="1" ngpus="2" coll="allreduce" inplace="1"/>',
     "proto='Fast'"),
])
def test_bad_xml_file_gives_one_warning_and_is_skipped(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.xml"
    if content is not None:
        bad.write_text(content)
    cat = load_catalog(env_of(bad, PAIRS))
    warns = warnings_in(capsys.readouterr().err)
    assert len(warns) == 1 and str(bad) in warns[0] and needle in warns[0], warns
    assert [c.path for c in cat.candidates] == [PAIRS]
    assert select(cat, make_call()).candidate.path == PAIRS


def test_unverifiable_xml_is_skipped(tmp_path, capsys):
    # Well-formed but wrong: rank 1's receive has no matching send.
    broken = tmp_path / "broken.xml"
    broken.write_text(BCAST.format(root="").replace('send="1" recv="-1"', 'send="-1" recv="-1"'))
    cat = load_catalog(env_of(broken))
    warns = warnings_in(capsys.readouterr().err)
    assert cat.candidates == () and len(warns) == 1 and "fails verification" in warns[0]
    assert select(cat, make_call("broadcast", inplace=False)).candidate is None


def test_empty_directory_warns(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert load_catalog(env_of(tmp_path / "empty")).candidates == ()
    warns = warnings_in(capsys.readouterr().err)
    assert len(warns) == 1 and "holds no .xml files" in warns[0]


@pytest.mark.parametrize("text, needle", [
    ("{", "not valid JSON"),
    ('{"algos": []}', "'algorithms'"),
    ('{"version": 2, "algorithms": []}', "version 2"),
])
def test_bad_config_file_gives_one_warning(tmp_path, capsys, text, needle):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(text)
    assert load_catalog({"GC3_CONFIG": str(cfg)}).candidates == ()
    warns = warnings_in(capsys.readouterr().err)
    assert len(warns) == 1 and needle in warns[0] and str(cfg) in warns[0], warns


@pytest.mark.parametrize("entry, needle", [
    ({"file": "p.xml", "max_byte": 10}, "unknown key(s) max_byte"),
    ({"file": "p.xml", "ranks": 4}, "ranks=4"),
    ({"file": "p.xml", "collective": "allgather"}, "collective='allgather'"),
    ({"file": "p.xml", "protocol": "Fast"}, "protocol='Fast'"),
    ({"file": "p.xml", "max_bytes": "lots"}, "max_bytes='lots'"),
    ({"file": "p.xml", "dtypes": ["float8"]}, "unknown dtypes float8"),
    ({"file": "missing.xml"}, "cannot read"),
    ({"path": "p.xml"}, "'file' key"),
])
def test_bad_config_entry_is_skipped_others_kept(tmp_path, capsys, entry, needle):
    write_xml(read_xml(PAIRS), tmp_path / "p.xml")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"algorithms": [entry, {"file": "p.xml", "name": "good"}]}))
    cat = load_catalog({"GC3_CONFIG": str(cfg)})
    warns = warnings_in(capsys.readouterr().err)
    assert len(warns) == 1 and needle in warns[0] and "algorithms[0]" in warns[0], warns
    assert [c.name for c in cat.candidates] == ["good"]


def test_bad_xml_config_entry(tmp_path, capsys):
    cfg = tmp_path / "cfg.xml"
    cfg.write_text(f'<gc3_config>\n<load file="{PAIRS}"/>\n<load path="{PAIRS}" minBytes="-3"/>\n'
                   f'<load path="{PAIRS}"/>\n</gc3_config>\n')
    cat = load_catalog({"GC3_CONFIG": str(cfg)})
    warns = warnings_in(capsys.readouterr().err)
    assert len(warns) == 2 and ":2: <load>" in warns[0] and ":3: <load>" in warns[1], warns
    assert len(cat.candidates) == 1


# --- the GC3_DEBUG log -------------------------------------------------------------

def selector(env):
    return Selector(load_catalog(env), get_logger(env))


def test_fallback_reason_logged_once_per_collective_and_size_bucket(tmp_path, capsys):
    ranged = variant(tmp_path, PAIRS, "ranged.xml", maxBytes=1024)
    sel = selector(env_of(ranged, RING, A2A, GC3_DEBUG="INFO"))
    capsys.readouterr()
    assert not sel.choose(make_call(count=300)).uses_gc3           # 1200 B, bucket [1 KiB, 2 KiB)
    first = capsys.readouterr().err
    assert "-> NCCL: no gc3 algorithm matches" in first
    assert "ranged.xml: maxBytes (1200 B > maxBytes 1024)" in first
    assert "allreduce_ring_4r_1i.xml: ranks" in first
    assert "alltoall_two_step_2n_4g.xml: collective" in first
    sel.choose(make_call(count=500))                                # same bucket: quiet
    assert capsys.readouterr().err == ""
    sel.choose(make_call(count=600))                                # next bucket: logged again
    assert capsys.readouterr().err.count("-> NCCL") == 1


def test_chosen_algorithm_logged_at_info(capsys):
    sel = selector(env_of(PAIRS, GC3_DEBUG="INFO"))
    capsys.readouterr()
    sel.choose(make_call(count=64))
    err = capsys.readouterr().err
    assert "-> gc3 algorithm allreduce_allpairs_2r_1i.xml" in err and "proto LL" in err
    sel.choose(make_call(count=64))
    assert capsys.readouterr().err == ""


def test_trace_logs_every_call_and_default_is_quiet(capsys):
    sel = selector(env_of(PAIRS, GC3_DEBUG="TRACE"))
    capsys.readouterr()
    for _ in range(3):
        sel.choose(make_call(count=64))
    assert capsys.readouterr().err.count("-> gc3 allreduce_allpairs_2r_1i.xml") == 3
    sel = selector(env_of(PAIRS))
    sel.choose(make_call(count=64))
    sel.choose(make_call(inplace=False))
    assert capsys.readouterr().err == ""


def test_empty_catalog_fallback_says_so(capsys):
    sel = Selector(load_catalog({"GC3_CONFIG": "/nonexistent/cfg.json", "GC3_DEBUG": "INFO"}),
                   get_logger({"GC3_DEBUG": "INFO"}))
    sel.choose(make_call())
    err = capsys.readouterr().err
    assert len(warnings_in(err)) == 1 and "no gc3 algorithm loaded" in err


# --- sizes ----------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("8", 8), ("64K", 65536), ("64KiB", 65536), ("128M", 128 << 20),
                                         ("1G", 1 << 30), ("1.5M", 3 << 19), (4096, 4096)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["-1", "1X", "", -5, True])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_size_bucket_is_power_of_two():
    assert [size_bucket(n) for n in (0, 1, 2, 3, 4, 1023, 1024)] == [0, 1, 2, 2, 3, 10, 11]


def test_default_index_found_in_a_checkout_and_in_a_wheel_install(tmp_path, monkeypatch):
    from runtime_cuda.nccl import catalog as catalog_mod

    here = catalog_mod.default_index()
    assert here.is_file() and here.parent.name == "ir_samples"
    # outside a checkout: the copy pyproject's data-files installs under sys.prefix
    shared = tmp_path / "share" / "gc3" / "ir_samples" / "index.json"
    shared.parent.mkdir(parents=True)
    shared.write_text('{"version": 1, "algorithms": []}')
    monkeypatch.setattr(catalog_mod, "__file__", str(tmp_path / "site" / "runtime_cuda" / "nccl" / "catalog.py"))
    monkeypatch.setattr(catalog_mod.sys, "prefix", str(tmp_path))
    assert catalog_mod.default_index() == shared


def test_catalog_candidate_is_the_only_class_named_candidate():
    # tune's program variants (tune.Variant) and the sweep's configurations (candidates.ProgramConfig)
    # are other things; one name for the entry calls select from keeps a reader from confusing them.
    import ast

    root = Path(__file__).resolve().parents[1]
    found = sorted(str(path.relative_to(root)) for package in ("gc3", "runtime_cuda", "scripts")
                   for path in (root / package).rglob("*.py")
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ClassDef) and node.name == "Candidate")
    assert found == ["runtime_cuda/nccl/catalog.py"]


def test_count_multiple_is_exact(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"algorithms": [{"file": str(PAIRS), "count_multiple": 3}]}))
    env = {"GC3_CONFIG": str(cfg)}
    assert decide(env, make_call(count=3 * 341)).uses_gc3
    for count in (1024, 3 * 341 + 1, 2):
        assert only_rejection(env, make_call(count=count)).field == "count"
    cfg.write_text(json.dumps({"algorithms": [{"file": str(PAIRS), "count_multiple": 0}]}))
    assert not decide(env, make_call(count=1024)).uses_gc3
