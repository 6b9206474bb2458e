"""`gc3 tune --plot` and `gc3 catalog plot`: the chosen algorithm's time and its
margin over NCCL per size, drawn from the provenance "choices" of a catalog
(`runtime_cuda.nccl.tune.choices_record`); a catalog without them, a plot not
named *.png or in no folder exit 2 with one clear line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import cli
from runtime_cuda.nccl import perf

TUNE = ["tune", "--model-only", "--ranks", "2", "--quick", "-c", "allreduce", "-b", "1K", "-e", "64K"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GC3_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "gc3-cache"))


def gc3(*args):
    return CliRunner().invoke(cli(), [str(a) for a in args])


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, (path, len(data))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("tuneplot")
    res = CliRunner().invoke(cli(), TUNE + ["-o", str(d / "catalog.json"), "--plot", str(d / "p.png")])
    assert res.exit_code == 0, res.output
    return d, res.output


def test_tune_writes_the_plot_after_the_catalog(tuned):
    d, output = tuned
    assert_png(d / "p.png")
    assert output.index("wrote " + str(d / "catalog.json")) < output.index("wrote " + str(d / "p.png"))


def test_catalog_plot_draws_a_written_catalog(tuned, tmp_path):
    d, _ = tuned
    res = gc3("catalog", "plot", d / "catalog.json", "-o", tmp_path / "again.png")
    assert res.exit_code == 0, res.output
    assert_png(tmp_path / "again.png")


@pytest.mark.parametrize("catalog, needle", [
    ({"version": 1, "algorithms": []}, 'no provenance "choices"'),
    ({"version": 1, "provenance": {"command": "hand-written"}, "algorithms": []}, 'no provenance "choices"'),
    ("not json {", "cannot read it as a JSON catalog"),
])
def test_catalog_plot_without_choices_exits_2(catalog, needle, tmp_path):
    src = tmp_path / "c.json"
    src.write_text(catalog if isinstance(catalog, str) else json.dumps(catalog))
    res = gc3("catalog", "plot", src, "-o", tmp_path / "p.png")
    assert res.exit_code == 2 and f"{src}: FAILED" in res.output and needle in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("plot, needle", [("p.svg", "name it *.png"), ("no/such/dir/p.png", "does not exist")])
def test_a_bad_plot_path_is_a_usage_error_before_any_work(plot, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = gc3(*TUNE, "-o", "c.json", "--plot", plot)
    assert res.exit_code == 2 and "--plot" in res.output and needle in res.output, res.output
    assert not (tmp_path / "c.json").exists()
    (tmp_path / "c.json").write_text("{}")
    res = gc3("catalog", "plot", "c.json", "-o", plot)
    assert res.exit_code == 2 and "-o" in res.output and needle in res.output, res.output


def _drawn(monkeypatch, choices, path):
    """plot_choices' panels, kept from the file writer: (axes, PNG written)."""
    kept = {}
    finish = perf._finish

    def keep(plt, fig, axes, *rest):
        kept["axes"] = axes
        finish(plt, fig, axes, *rest)
    monkeypatch.setattr(perf, "_finish", keep)
    perf.plot_choices(choices, path, title="t")
    assert_png(path)
    return kept["axes"]


def rec(nbytes, algorithm, time_us, nccl_us):
    return {"bytes": nbytes, "algorithm": algorithm, "time_us": time_us, "nccl_us": nccl_us}


def test_plot_choices_measured_draws_the_margin(monkeypatch, tmp_path):
    choices = {"allreduce": {
        "inplace": [rec(1 << 10, "oneshot_allreduce_2r", 5.0, 9.0), rec(1 << 22, "NCCL", 40.0, 40.0),
                    rec(1 << 28, "NCCL (not measured: time budget spent)", None, None)],
        "outofplace": [rec(1 << 10, "oneshot_allreduce_2r", 5.5, 9.5), rec(1 << 22, "ring_i16", 35.0, 42.0)]},
        "allgather": {"inplace": [rec(1 << 10, "allgather_ring_2r_LL", 4.0, 6.0)]}}
    axes = _drawn(monkeypatch, choices, tmp_path / "m.png")
    assert axes.shape == (2, 2)
    top, margin = axes[0][0], axes[1][0]
    lines = {l.get_label(): l for l in margin.get_lines()}
    assert list(lines["NCCL / chosen in-place"].get_ydata()) == [9.0 / 5.0, 1.0]   # NCCL won: parity
    assert list(lines["NCCL / chosen out-of-place"].get_ydata()) == [9.5 / 5.5, 42.0 / 35.0]
    chosen = {l.get_label(): l for l in top.get_lines()}["chosen in-place"]
    assert list(chosen.get_xdata()) == [1 << 10, 1 << 22]       # the unmeasured size is left out
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert {"oneshot_allreduce_2r", "ring_i16", "NCCL", "NCCL in-place"} <= set(legend)
    assert top.get_yscale() == "log" and not margin.texts


def test_plot_choices_model_only_says_nccl_was_not_measured(monkeypatch, tmp_path):
    choices = {"allreduce": {place: [rec(1 << 10, "oneshot_allreduce_2r", 5.3, None),
                                     rec(1 << 16, "allreduce_ring_2r_LL", 9.1, None)]
                             for place in ("inplace", "outofplace")}}
    axes = _drawn(monkeypatch, choices, tmp_path / "model.png")
    margin = axes[1][0]
    assert [t.get_text() for t in margin.texts] == ["NCCL not measured (cost model)"]
    assert not [l for l in margin.get_lines() if not l.get_label().startswith("_")]
    assert "NCCL in-place" not in [l.get_label() for l in axes[0][0].get_lines()]


def test_the_title_says_what_the_catalog_was_tuned_on():
    from runtime_cuda.commands.tune import choices_title

    measured = {"ranks": 4, "measured": True, "device": "NVIDIA H200", "date": "2026-11-25T19:00:00+00:00",
                "topology": {"summary": "NV18 between all 6 GPU pairs"}}
    assert choices_title(measured) == "gc3 tune: 4 ranks, measured on NVIDIA H200 (NV18 between all 6 GPU pairs), 2026-11-25"
    assert choices_title(dict(measured, topology={"unknown": "no nvidia-smi"})) == \
        "gc3 tune: 4 ranks, measured on NVIDIA H200, 2026-11-25"
    assert choices_title({"ranks": 8, "cost_model": {"preset": "h200"}, "date": "2026-11-25"}) == \
        "gc3 tune: 8 ranks, cost model h200, 2026-11-25"
