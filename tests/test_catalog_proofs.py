"""The NCCL catalog refuses unproven IR, caches verdicts by file hash; `gc3 catalog check`."""
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import cli
from runtime_cuda.nccl import catalog as catalog_mod
from runtime_cuda.nccl.catalog import check_config, load_catalog

main = cli()   # gc3's CLI with the runtime's commands, installed or not

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "ir_samples" / "allreduce_ring_4r_inplace_Simple_i2.xml"


def wrong_copy(tmp_path):
    """The ring with one reduction turned into a plain receive: well formed, matched, deadlock free, wrong."""
    text = RING.read_text()
    bad = text.replace('type="rrcs"', 'type="rcs"', 1)
    assert bad != text
    path = tmp_path / "ring_wrong.xml"
    path.write_text(bad)
    return path


def gc3(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_wrong_ir_is_refused_at_load_with_the_reason_logged(tmp_path, capsys):
    bad = wrong_copy(tmp_path)
    env = {"GC3_XML_FILES": f"{RING}:{bad}", "GC3_CACHE_DIR": str(tmp_path / "cache")}
    cat = load_catalog(env)
    assert [c.path for c in cat.candidates] == [RING]
    err = capsys.readouterr().err
    assert "WARNING" in err and "ring_wrong.xml: fails verification: SemanticError" in err


def test_verdicts_are_cached_by_file_hash(tmp_path, monkeypatch):
    bad = wrong_copy(tmp_path)
    env = {"GC3_XML_FILES": f"{RING}:{bad}", "GC3_CACHE_DIR": str(tmp_path / "cache")}
    assert len(load_catalog(env).candidates) == 1
    assert len(list((tmp_path / "cache" / "verified").iterdir())) == 2
    # A second start does not verify again: both verdicts come from the cache.
    import gc3.verify
    calls = []
    real = gc3.verify.verify
    monkeypatch.setattr(gc3.verify, "verify", lambda prog, **k: calls.append(prog.name) or real(prog, **k))
    assert [c.path for c in load_catalog(env).candidates] == [RING]
    assert calls == []
    # Changing a file's bytes changes its key: the new content is verified (and now passes).
    bad.write_text(RING.read_text() + "<!-- edited -->\n")
    assert len(load_catalog(env).candidates) == 2 and len(calls) == 1


def test_a_broadcast_whose_root_attribute_is_not_its_root_is_refused(tmp_path):
    text = (ROOT / "ir_samples" / "broadcast_ring_8r_Simple.xml").read_text().replace('root="0"', 'root="3"')
    path = tmp_path / "b.xml"
    path.write_text(text)
    cands, problems = check_config(_json(tmp_path, [{"file": "b.xml"}]))
    assert not cands and "fails verification" in problems[0] and "NCCL reads only the root's" in problems[0]


def _json(tmp_path, entries):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"version": 1, "algorithms": entries}))
    return cfg


def test_catalog_check_command(tmp_path):
    shutil.copy(RING, tmp_path / "ring.xml")
    wrong_copy(tmp_path)
    good = _json(tmp_path, [{"file": "ring.xml", "max_bytes": "1MiB"}])
    r = gc3("catalog", "check", good)
    assert r.exit_code == 0 and "OK: 1 entry" in r.output
    bad = _json(tmp_path, [{"file": "ring.xml"}, {"file": "ring_wrong.xml"},
                           {"file": "ring.xml", "min_bytes": 4096, "max_bytes": 1024},
                           {"file": "ring.xml", "ranks": "0_4"}, {"file": "ring.xml", "colour": 1}])
    r = gc3("catalog", "check", bad)
    assert r.exit_code == 1 and "4 bad entries of 5" in r.output
    assert "ring_wrong.xml: fails verification" in r.output
    assert "min_bytes=4096 > max_bytes=1024" in r.output
    assert "ranks='0_4'" in r.output and "unknown key(s) colour" in r.output
    r = gc3("catalog", "check", tmp_path / "none.json")
    assert r.exit_code == 2 and "no such file" in r.output and "Traceback" not in r.output
    (tmp_path / "cfg.xml").write_text('<gc3_config><load path="ring.xml" maxBytes="1MiB"/></gc3_config>')
    assert gc3("catalog", "check", tmp_path / "cfg.xml").exit_code == 0


def test_the_shipped_index_passes_catalog_check():
    r = gc3("catalog", "check", ROOT / "ir_samples" / "index.json")
    assert r.exit_code == 0, r.output


def test_each_entry_says_what_its_launch_group_runs(tmp_path):
    """A small-kernel entry names its kernel and its collective to the one kernel group
    (run without the collective, an allgather would run as an allreduce: the virtual fuzz
    once did so); an IR entry adds nothing, its group runs its own program."""
    from gc3 import limits

    entries = [{"kernel": k, "collective": c, "ranks": 2, "name": f"{k}_{c}"}
               for c, ks in limits.SMALL_KERNELS.items() for k in ks]
    (tmp_path / "k.json").write_text(json.dumps({"version": 1, "algorithms": entries}))
    good, problems = check_config(tmp_path / "k.json")
    assert problems == [] and len(good) == len(entries)
    assert {(c.run_kwargs["kind"], c.run_kwargs["coll"]) for c in good} == \
        {(e["kernel"], e["collective"]) for e in entries}
    ir = load_catalog({"GC3_XML_FILES": str(Path(__file__).parent / "data" / "msccl" / "allreduce_allpairs_2r_1i.xml")})
    assert ir.candidates and all(c.run_kwargs == {} for c in ir.candidates)
