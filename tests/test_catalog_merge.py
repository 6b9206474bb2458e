"""`gc3 catalog merge` (runtime_cuda/commands/catalog.py over runtime_cuda.nccl.tune.merge_catalogs):
catalogs tuned in pieces become one that `gc3 catalog check` and the drop-in accept, and pieces that
do not belong together are refused with exit 2 naming the file and what differs."""
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "ir_samples" / "machines" / "4xNVIDIA-H100-80GB-HBM3-NV18-all" / "catalog.json"


def gc3(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Model-only catalogs: allreduce and allgather on 2 ranks, allgather on 4."""
    top = tmp_path_factory.mktemp("tuned")
    for name, ranks, coll in (("a", 2, "allreduce"), ("b", 2, "allgather"), ("c", 4, "allgather")):
        (top / name).mkdir()
        res = gc3("tune", "--model-only", "--ranks", ranks, "--quick", "-q", "-c", coll,
                  "-o", top / name / "catalog.json")
        assert res.exit_code == 0, res.output
    return top


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def save(path: Path, catalog: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(catalog))
    return path


def refused(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and all(w in res.stderr for w in words), res.stderr


def test_merge_is_the_union_that_check_and_the_drop_in_accept(tuned, tmp_path):
    from runtime_cuda.nccl.catalog import load_catalog

    a, b = tuned / "a" / "catalog.json", tuned / "b" / "catalog.json"
    out = tmp_path / "merged" / "catalog.json"
    out.parent.mkdir()
    res = gc3("catalog", "merge", a, b, "-o", out)
    assert res.exit_code == 0 and "allreduce, allgather" in res.stdout, res.output

    merged, parts = load(out), [load(a), load(b)]
    sources = [(p.parent, e) for p, cat in zip((a, b), parts) for e in cat["algorithms"]]
    assert len(merged["algorithms"]) == len(sources)
    for e, (folder, src) in zip(merged["algorithms"], sources):
        assert {k: v for k, v in e.items() if k != "file"} == {k: v for k, v in src.items() if k != "file"}
        if "file" in src:
            assert (out.parent / e["file"]).parent == out.parent     # beside the catalog, as shipped ones are
            assert (out.parent / e["file"]).read_bytes() == (folder / src["file"]).read_bytes()
    prov = merged["provenance"]
    assert list(prov["choices"]) == ["allreduce", "allgather"]
    assert [p["collectives"] for p in prov["parts"]] == [["allreduce"], ["allgather"]]
    assert " + " in prov["command"] and not list(out.parent.glob("*.tmp*"))

    res = gc3("catalog", "check", out, "-q")
    assert res.exit_code == 0 and f"OK: {len(sources)} entries" in res.stdout, res.output
    catalog = load_catalog(dict(os.environ, GC3_CONFIG=str(out)))
    assert len(catalog.candidates) == len(sources)
    assert {c.collective for c in catalog.candidates} == {"allreduce", "allgather"}


def test_ir_dir_holds_the_irs_named_relative_to_the_catalog(tuned, tmp_path):
    out = tmp_path / "catalog.json"
    res = gc3("catalog", "merge", tuned / "a" / "catalog.json", tuned / "b" / "catalog.json", "-o", out,
              "--ir-dir", tmp_path / "irs")
    assert res.exit_code == 0, res.output
    files = [e["file"] for e in load(out)["algorithms"] if "file" in e]
    assert files and all(f.startswith("irs" + os.sep) and (tmp_path / f).is_file() for f in files)


def test_a_collective_tuned_twice_names_both_files(tuned, tmp_path):
    again = tmp_path / "again" / "catalog.json"
    shutil.copytree(tuned / "a", again.parent)
    refused(gc3("catalog", "merge", tuned / "a" / "catalog.json", again, "-o", tmp_path / "m.json"),
            "allreduce", str(tuned / "a" / "catalog.json"), str(again))
    assert not (tmp_path / "m.json").exists()


def test_different_ranks_are_refused(tuned, tmp_path):
    c = tuned / "c" / "catalog.json"
    refused(gc3("catalog", "merge", tuned / "a" / "catalog.json", c, "-o", tmp_path / "m.json"),
            f"{c}: FAILED", '"ranks" is 4', "has 2")


@pytest.mark.parametrize("text, words", [
    (None, ['provenance "choices"', "gc3 tune"]),            # ir_samples/index.json: a catalog, not tune's
    ('{"version": 1, "algorithms": [', ["cannot read it as a JSON catalog"]),
])
def test_a_file_that_is_not_a_tune_catalog_is_refused(tuned, tmp_path, text, words):
    bad = ROOT / "ir_samples" / "index.json" if text is None else tmp_path / "bad.json"
    if text is not None:
        bad.write_text(text)
    refused(gc3("catalog", "merge", tuned / "a" / "catalog.json", bad, "-o", tmp_path / "m.json"),
            f"{bad}: FAILED", *words)


def test_model_only_catalogs_match_by_cost_model_and_never_a_measured_one(tuned, tmp_path):
    a, b = load(tuned / "a" / "catalog.json"), load(tuned / "b" / "catalog.json")
    other = save(tmp_path / "h100" / "catalog.json", dict(b, provenance=dict(
        b["provenance"], cost_model=dict(b["provenance"]["cost_model"], preset="h100"))))
    refused(gc3("catalog", "merge", tuned / "a" / "catalog.json", other, "-o", tmp_path / "m.json"),
            "cost model h100", "h200")
    measured = save(tmp_path / "measured" / "catalog.json", dict(b, provenance=dict(b["provenance"], measured=True)))
    refused(gc3("catalog", "merge", tuned / "a" / "catalog.json", measured, "-o", tmp_path / "m.json"),
            '"measured" is True')
    assert "fingerprint" not in a["provenance"]


def test_same_ir_name_with_other_content_is_refused(tuned, tmp_path):
    a = load(tuned / "a" / "catalog.json")
    taken = next(e["file"] for e in a["algorithms"] if "file" in e)
    b = load(tuned / "b" / "catalog.json")
    clash = tmp_path / "clash" / "catalog.json"
    clash.parent.mkdir()
    (clash.parent / Path(taken).name).write_text("<algo/>")
    b["algorithms"] = [dict(e, file=Path(taken).name) if "file" in e else e for e in b["algorithms"]]
    save(clash, b)
    refused(gc3("catalog", "merge", tuned / "a" / "catalog.json", clash, "-o", tmp_path / "m.json"),
            Path(taken).name, "differ")


def split_shipped(tmp_path: Path, first: str) -> tuple:
    """The shipped measured catalog as two tunes: `first` (with the fused section) and the rest."""
    cat = load(SHIPPED)
    prov, out = cat["provenance"], []
    for name, pick in (("one", lambda c: c == first), ("two", lambda c: c != first)):
        part = {"version": 1, "provenance": dict(prov, choices={c: v for c, v in prov["choices"].items() if pick(c)}),
                "algorithms": [dict(e, file=os.path.relpath(SHIPPED.parent / e["file"], tmp_path / name))
                               if "file" in e else e for e in cat["algorithms"] if pick(e["collective"])]}
        if name == "one":
            part["fused"] = cat["fused"]
        out.append(save(tmp_path / name / "catalog.json", part))
    return cat, out


def test_measured_pieces_merge_back_into_the_whole(tmp_path):
    cat, (one, two) = split_shipped(tmp_path, "allgather")
    out = tmp_path / "catalog.json"
    res = gc3("catalog", "merge", one, two, "-o", out)
    assert res.exit_code == 0, res.output
    merged = load(out)
    want = [e for e in cat["algorithms"] if e["collective"] == "allgather"] + \
        [e for e in cat["algorithms"] if e["collective"] != "allgather"]
    assert [dict(e, file=Path(e["file"]).name) if "file" in e else e for e in merged["algorithms"]] == want
    assert merged["fused"] == cat["fused"]
    assert merged["provenance"]["prior"]["ruled_out"] == 2 * cat["provenance"]["prior"]["ruled_out"]


def test_measured_pieces_of_other_gpus_or_two_fused_sections_are_refused(tmp_path):
    cat, (one, two) = split_shipped(tmp_path, "allgather")
    piece = load(two)
    # Without its recorded fingerprint a catalog's GPUs are read from its device and links.
    piece["provenance"].pop("fingerprint", None)
    save(two, dict(piece, provenance=dict(piece["provenance"], device="NVIDIA H200")))
    refused(gc3("catalog", "merge", one, two, "-o", tmp_path / "m.json"), f"{two}: FAILED", "fingerprint", "H200")
    save(two, dict(piece, provenance=dict(piece["provenance"], gpus=8)))      # links no longer tell
    refused(gc3("catalog", "merge", one, two, "-o", tmp_path / "m.json"), "which GPUs it was measured on")
    save(two, dict(piece, fused=cat["fused"]))
    refused(gc3("catalog", "merge", one, two, "-o", tmp_path / "m.json"), '"fused"', str(one), str(two))


def test_a_catalog_tuned_in_another_dtype_says_so_and_does_not_merge(tmp_path):
    """`gc3 tune -d bfloat16` times in the type the calls use; its catalog records it, and a
    float32 piece of the same machine is not merged into it (other times, other choices)."""
    bf = tmp_path / "bf" / "catalog.json"
    bf.parent.mkdir()
    r = gc3("tune", "--model-only", "--ranks", 2, "--quick", "-c", "allgather", "-d", "bfloat16", "-o", bf, "-q")
    assert r.exit_code == 0, r.output
    prov = load(bf)["provenance"]
    assert prov["dtype"] == "bfloat16" and "-d bfloat16" in prov["command"]
    f32 = tmp_path / "f32" / "catalog.json"
    f32.parent.mkdir()
    assert gc3("tune", "--model-only", "--ranks", 2, "--quick", "-c", "allreduce", "-o", f32, "-q").exit_code == 0
    assert load(f32)["provenance"]["dtype"] == "float32"
    refused(gc3("catalog", "merge", f32, bf, "-o", tmp_path / "m.json"), "dtype", "bfloat16")
    r = gc3("tune", "--model-only", "--ranks", 2, "-d", "float8", "-o", tmp_path / "x.json")
    assert r.exit_code == 2 and "--dtype" in r.output
