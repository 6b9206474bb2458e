"""Bad input, table-driven: each ends in a clear error naming the field or option,
exit status 2, no traceback, fast (sizes are bounded before anything is allocated)."""
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import cli
from gc3.errors import GC3Error, InputError, IRStructureError
from gc3.ir.xml_io import read_xml, to_xml
from gc3.simulator import simulate
from gc3.verify import verify

main = cli()   # gc3's CLI with the runtime's commands, installed or not

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "ir_samples" / "allreduce_ring_4r_inplace_Simple_i2.xml"
HEAD = ('<algo name="x" proto="Simple" nchannels="{nch}" nchunksperloop="1" ngpus="{n}" coll="allreduce" '
        'inplace="0">')
GPU = '<gpu id="{id}" i_chunks="{i}" o_chunks="1" s_chunks="0"><tb id="0" send="-1" recv="-1" chan="0">' \
      '<step s="0" type="cpy" srcbuf="i" srcoff="{off}" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" ' \
      'hasdep="0"/></tb></gpu>'


def xml(n="1", nch="1", i="1", off="0", gpus=None, extra=""):
    body = "".join(GPU.format(id=g, i=i, off=off) for g in range(gpus if gpus is not None else 1))
    return HEAD.format(n=n, nch=nch) + body + extra + "</algo>"


def dsl(body):
    return "from gc3 import GC3Program, chunk, Check\nfrom gc3.collectives import *\n" + body + "\n"


# (id, file name, file content or None, command arguments (FILE = the file), words the message must name)
XML_CASES = [
    ("not-xml", "a.xml", "<algo", ["check", "FILE"], ["not well-formed"]),
    ("ngpus-huge", "a.xml", xml(n="1000000000"), ["check", "FILE"], ["ngpus", "1024"]),
    ("ngpus-zero", "a.xml", xml(n="0"), ["simulate", "FILE"], ["ngpus", "'0'"]),
    ("ngpus-2^63", "a.xml", xml(n=str(2 ** 63)), ["simulate", "FILE"], ["ngpus"]),
    ("i_chunks-2^63", "a.xml", xml(i=str(2 ** 63 - 1)), ["simulate", "FILE"], ["i_chunks"]),
    ("s_chunks-huge", "a.xml", xml().replace('s_chunks="0"', 's_chunks="99999999999"'), ["check", "FILE"],
     ["s_chunks"]),
    ("int32-overflow", "a.xml", xml(off=str(2 ** 31)), ["check", "FILE"], ["srcoff", "2147483647"]),
    ("underscore-int", "a.xml", xml(n="0_1"), ["check", "FILE"], ["ngpus='0_1'", "ASCII digits"]),
    ("arabic-digits", "a.xml", xml(n="\u0661"), ["check", "FILE"], ["ngpus", "ASCII digits"]),
    ("plus-sign", "a.xml", xml(off="+0"), ["check", "FILE"], ["srcoff='+0'"]),
    ("too-many-gpus", "a.xml", xml(n="1", gpus=3), ["check", "FILE"], ["<gpu> number 2", "ngpus=1"]),
    ("too-many-chunks", "a.xml", xml(n="1000", i="65536", gpus=20), ["check", "FILE"], ["MAX_TOTAL_CHUNKS"]),
    ("nchannels-huge", "a.xml", xml(nch="100000"), ["check", "FILE"], ["nchannels"]),
    ("minBytes-huge", "a.xml", xml().replace('inplace="0"', 'inplace="0" minBytes="99999999999999999999"'),
     ["check", "FILE"], ["minBytes"]),
    ("post-rank", "a.xml", xml(extra='<postcondition><term rank="7" out="0" src="0" in="0" cnt="1"/></postcondition>'),
     ["check", "FILE"], ["rank='7'"]),
    ("post-twice", "a.xml", xml(extra="<postcondition/><postcondition/>"), ["check", "FILE"], ["second <postcondition>"]),
    ("missing-file", "nothere.xml", None, ["check", "FILE"], ["cannot read"]),
]

DSL_CASES = [
    ("ranks-huge", "p.py", dsl('GC3Program("p", AllReduce(10**9, 1))'), ["compile", "FILE", "-o", "x.xml"],
     ["num_ranks=1000000000", "MAX_RANKS"]),
    ("chunk-factor-1e7", "p.py", dsl('GC3Program("p", AllReduce(2, 10**7))'), ["compile", "FILE", "-o", "x.xml"],
     ["chunk_factor=10000000", "MAX_CHUNKS"]),
    ("alltoall-too-big", "p.py", dsl('GC3Program("p", AllToAll(1024, 1024))'), ["trace", "FILE"],
     ["1048576 chunks", "MAX_CHUNKS"]),
    ("instances-huge", "p.py", dsl('GC3Program("p", AllReduce(2, 1), instances=10**6)'), ["trace", "FILE"],
     ["instances=1000000", "MAX_INSTANCES"]),
    ("scratch-1e12", "p.py", dsl('with GC3Program("p", AllReduce(2, 1)):\n    chunk(0, "in", 0).copy(1, "sc", 10**12)'),
     ["compile", "FILE", "-o", "x.xml"], ["MAX_CHUNKS"]),
    ("syntax-error", "p.py", "with with\n", ["compile", "FILE", "-o", "x.xml"], ["p.py:1", "not valid Python"]),
    ("script-raises", "p.py", "x = 1\n{}['k']\n", ["trace", "FILE"], ["p.py:2", "KeyError"]),
    ("xml-to-compile", "r.xml", RING.read_text(), ["compile", "FILE", "-o", "x.xml"], ["DSL program (FILE.py)"]),
    ("bad-program-argument", "p.py", dsl("from gc3 import int_args\nint_args(n=2)"),
     ["trace", "FILE", "two"], ["argument n must be an int"]),
]

CLI_CASES = [
    ("negative-seed", None, None, ["simulate", RING, "--seed", "-1"], ["--seed"]),
    ("timeline-missing-folder", None, None, ["simulate", RING, "--timeline", "/no/such/dir/t.png"],
     ["--timeline", "does not exist"]),
    ("timeline-extension", None, None, ["simulate", RING, "--timeline", "t.xyz"], ["--timeline", "'.xyz'"]),
    ("count-2^63", None, None, ["simulate", RING, "--count", str(2 ** 63)], ["count=9223372036854775808",
                                                                             "MAX_BYTES"]),
    ("size-huge", None, None, ["simulate", RING, "--size", "999999999999GiB"], ["size", "MAX_BYTES"]),
    ("size-garbage", None, None, ["simulate", RING, "--size", "1\u0661K"], ["cannot read size"]),
    ("size-too-much-to-simulate", None, None, ["simulate", RING, "--size", "100GiB"], ["MAX_SIMULATED_BYTES"]),
    ("dag-bad-path", "p.py", dsl('with GC3Program("p", AllReduce(2, 1)):\n    pass'),
     ["trace", "FILE", "--dag", "/no/such/dir/d.png"], ["--dag", "does not exist"]),
    ("slots-zero", None, None, ["check", RING, "--slots", "0"], ["--slots"]),
    ("instances-option", "p.py", dsl('with GC3Program("p", AllReduce(2, 1)):\n    pass'),
     ["compile", "FILE", "-o", "x.xml", "--instances", "100000"], ["--instances", "64"]),
]


def catalog(entries):
    return json.dumps({"version": 1, "algorithms": entries})


CATALOG_CASES = [
    ("not-json", "c.json", "{", ["catalog", "check", "FILE"], ["not valid JSON"]),
    ("not-a-list", "c.json", json.dumps({"algorithms": 3}), ["catalog", "check", "FILE"], ["must be a list"]),
    ("missing", "none.json", None, ["catalog", "check", "FILE"], ["no such file"]),
]

# Entries of a readable catalog: the file is fine, each entry is skipped (status 1).
ENTRY_CASES = [
    ("min>max", {"min_bytes": 4096, "max_bytes": 1024}, ["min_bytes=4096 > max_bytes=1024"]),
    ("ranks-underscore", {"ranks": "0_4"}, ["ranks='0_4'"]),
    ("ranks-arabic", {"ranks": "\u0664"}, ["ranks="]),
    ("root-huge", {"root": 10 ** 20}, ["root="]),
    ("count-multiple-zero", {"count_multiple": 0}, ["count_multiple=0"]),
    ("size-unicode", {"max_bytes": "\u0661MiB"}, ["max_bytes="]),
    ("size-huge", {"max_bytes": "999999999999GiB"}, ["max_bytes=", "MAX_BYTES"]),
    ("unknown-key", {"colour": "red"}, ["unknown key(s) colour"]),
    ("dtype", {"dtypes": ["float7"]}, ["unknown dtypes float7"]),
]


def invoke(tmp_path, name, content, args):
    target = None
    if name is not None:
        target = tmp_path / name
        if content is not None:
            target.write_text(content)
    args = [str(target) if a == "FILE" else str(a) for a in args]
    if "-o" in args:
        args[args.index("-o") + 1] = str(tmp_path / args[args.index("-o") + 1])
    start = time.perf_counter()
    r = CliRunner().invoke(main, args)
    return r, time.perf_counter() - start


@pytest.mark.parametrize("case", XML_CASES + DSL_CASES + CLI_CASES + CATALOG_CASES, ids=lambda c: c[0])
def test_bad_input_is_a_clear_fast_error(tmp_path, case):
    _, name, content, args, words = case
    r, seconds = invoke(tmp_path, name, content, args)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    for w in words:
        assert w in r.output, (w, r.output)
    assert seconds < 2.0


@pytest.mark.parametrize("case", ENTRY_CASES, ids=lambda c: c[0])
def test_bad_catalog_entries_are_named_and_skipped(tmp_path, case):
    _, fields, words = case
    (tmp_path / "ring.xml").write_text(RING.read_text())
    cfg = tmp_path / "c.json"
    cfg.write_text(catalog([{"file": "ring.xml"}, {"file": "ring.xml", **fields}]))
    r, seconds = invoke(tmp_path, "c.json", None, ["catalog", "check", "FILE"])
    assert r.exit_code == 1 and "1 bad entry of 2" in r.output and "algorithms[1]" in r.output, r.output
    for w in words:
        assert w in r.output, (w, r.output)
    assert "Traceback" not in r.output and seconds < 2.0


@pytest.mark.parametrize("var, value, call", [
    ("GC3_TIMEOUT_S", "nan", lambda: __import__("runtime_cuda.core.launcher").core.launcher.gpu_wait_timeout_s()),
    ("GC3_TIMEOUT_S", "-3", lambda: __import__("runtime_cuda.core.launcher").core.launcher.gpu_wait_timeout_s()),
    ("GC3_SLOT_BYTES_SIMPLE", "1e9",
     lambda: __import__("runtime_cuda.core.connections").core.connections.slot_bytes("Simple")),
    ("GC3_TILE_SPLIT_LL", "4:\u0661",
     lambda: __import__("runtime_cuda.core.connections").core.connections.tile_split("LL")),
    ("OMPI_COMM_WORLD_SIZE", "0_2", lambda: __import__("runtime_cuda.commands.run").commands.run._world_size()),
])
def test_bad_environment_variables_are_named(monkeypatch, var, value, call):
    monkeypatch.setenv(var, value)
    with pytest.raises(Exception) as err:
        call()
    assert var in str(err.value) and isinstance(err.value, Exception) and not isinstance(err.value, ValueError)


def test_strict_integers():
    from gc3.units import strict_int
    for ok, want in (("0", 0), ("-1", -1), ("2147483647", 2 ** 31 - 1)):
        assert strict_int(ok) == want
    for bad in ("", "-", "0_1", "+1", " 1", "1 ", "\u0661", "1e3", "0x10", "1" * 40):
        with pytest.raises(ValueError):
            strict_int(bad)
    with pytest.raises(ValueError, match="out of range"):
        strict_int("5", 0, 4)
    assert issubclass(InputError, Exception)


# --- IR fields out of range: the verifier and the simulator refuse them alike ---------------
SAMPLE = ROOT / "ir_samples" / "allgather_ring_4r_Simple.xml"


def _with_gpu0(**fields):
    prog = read_xml(SAMPLE)
    gpus = [dataclasses.replace(g, **fields) if g.id == 0 else g for g in prog.gpus]
    return dataclasses.replace(prog, gpus=gpus)


@pytest.mark.parametrize("field", ["i_chunks", "o_chunks", "s_chunks"])
def test_negative_chunk_counts_are_structure_errors_not_crashes(field):
    prog = _with_gpu0(**{field: -2})
    with pytest.raises(IRStructureError, match=rf"rank 0: {field}=-2"):
        verify(prog)
    # the simulator must fail with a GC3Error (never numpy's ValueError)
    try:
        res = simulate(prog, count=8)
    except GC3Error as exc:
        assert "-2" in str(exc)
    else:
        assert not res.ok


def test_cli_simulate_negative_scratch_is_a_clear_failure(tmp_path):
    path = tmp_path / "neg.xml"
    path.write_text(to_xml(_with_gpu0(s_chunks=-2)))
    for cmd in ("check", "simulate"):
        r = subprocess.run([sys.executable, "-m", "gc3", cmd, str(path), *(["--count", "8"] if cmd == "simulate" else [])],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)   # refused while reading: bad input
        assert "Traceback" not in r.stderr and "s_chunks='-2'" in r.stderr, (cmd, r.stderr)


def test_simulate_rejects_a_channel_outside_nchannels_like_check():
    prog = dataclasses.replace(read_xml(SAMPLE), nchannels=0)
    with pytest.raises(IRStructureError, match="chan=0 outside"):
        verify(prog)
    res = simulate(prog, count=8)
    assert not res.ok and any("chan=0" in e and "nchannels=0" in e for e in res.errors), res.errors
