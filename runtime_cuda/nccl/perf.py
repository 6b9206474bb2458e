"""The bookkeeping half of `gc3 bench`: sizes swept, nccl-tests' bandwidth
formulas, the table, CSV/JSON and the plot; and the plot of `gc3 tune`'s choices.
No GPU needed; `perf_gpu` measures.

nccl-tests' definitions: `size` is the larger user buffer in bytes, algbw =
size / time, busbw = algbw * factor, the factor being what each rank's link
must carry relative to size for an optimal algorithm:

    allreduce 2(n-1)/n   allgather, reducescatter, alltoall (n-1)/n
    broadcast, reduce 1
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from gc3.units import bus_factor

from .call import COLLECTIVES, REDUCING, ROOTED

IMPLS = ("gc3", "nccl", "nccl-sym")
PEERS = ("nccl", "nccl-sym")      # what gc3's speedup is measured against, in column order
PLACES = ("oop", "ip")
_LABELS = {"gc3": "gc3", "nccl": "NCCL", "nccl-sym": "NCCL-sym"}


def label(impl: str) -> str:
    """The table's name of an implementation: NCCL-sym is NCCL on symmetric windows."""
    return _LABELS.get(impl, impl)


def peers(impls: Sequence[str]) -> List[str]:
    """The NCCL columns gc3's speedup is shown against (none without gc3)."""
    return [p for p in PEERS if p in impls] if "gc3" in impls else []


def busbw_factor(coll: str, nranks: int) -> float:
    if coll not in COLLECTIVES:
        raise ValueError(f"no bus bandwidth factor for {coll!r} (known: {', '.join(COLLECTIVES)})")
    return bus_factor(coll, nranks)


def sweep(min_bytes: int, max_bytes: int, factor: int = 2, step_bytes: int = 0) -> List[int]:
    """nccl-tests' -b/-e/-f (multiplicative) or -i (additive) sweep, inclusive of max when hit."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError(f"need 0 < -b ({min_bytes}) <= -e ({max_bytes})")
    if step_bytes <= 0 and factor < 2:
        raise ValueError(f"-f must be >= 2 (got {factor}) unless -i gives an additive step")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s = s + step_bytes if step_bytes > 0 else s * factor
    return sizes


def element_count(coll: str, nbytes: int, itemsize: int, nranks: int) -> int:
    """Elements of the larger buffer for a requested size, rounded down so that
    collectives with per-rank blocks split evenly (as nccl-tests does)."""
    count = nbytes // itemsize
    if coll in ("allgather", "reducescatter", "alltoall"):
        count -= count % nranks
    return count


def nccl_count(coll: str, count: int, nranks: int) -> int:
    """The count argument NCCL takes for a buffer of `count` elements (the larger one)."""
    if coll in ("allgather", "reducescatter", "alltoall"):
        return count // nranks
    return count


@dataclass
class Measure:
    time_us: float
    algbw: float      # GB/s
    busbw: float      # GB/s
    wrong: Optional[int]   # None when not checked
    algorithm: str = ""    # which gc3 algorithm served it, or "NCCL"
    first_wrong: str = ""  # where the first wrong element is, when wrong
    graph100_us: Optional[float] = None   # us per call replayed from a graph of 100 calls (when timed)
    graph1_us: Optional[float] = None     # us per replay of a graph of one call


@dataclass
class Row:
    coll: str
    nbytes: int
    count: int
    dtype: str
    redop: str
    root: int
    nranks: int
    results: Dict[str, Dict[str, Measure]] = field(default_factory=dict)   # impl -> place -> Measure

    def speedup(self, place: str, peer: str = "nccl") -> Optional[float]:
        try:
            g, n = self.results["gc3"][place], self.results[peer][place]
        except KeyError:
            return None
        return n.time_us / g.time_us if g.time_us > 0 else None


def measure(coll: str, nbytes: int, nranks: int, time_us: float, wrong: Optional[int], algorithm: str = "") -> Measure:
    algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return Measure(time_us, algbw, algbw * busbw_factor(coll, nranks), wrong, algorithm)


# --- the table -----------------------------------------------------------------

_SIDE = "{:>9} {:>7} {:>7} {:>6}"


def _side(m: Optional[Measure]) -> str:
    if m is None:
        return _SIDE.format("-", "-", "-", "-")
    wrong = "N/A" if m.wrong is None else str(m.wrong)
    return _SIDE.format(f"{m.time_us:.2f}", f"{m.algbw:.2f}", f"{m.busbw:.2f}", wrong)


def header(coll: str, nranks: int, dtype: str, redop: str, impls: Sequence[str]) -> List[str]:
    lead = "{:>12} {:>12} {:>9} {:>6} {:>5}"
    blank = " " * len(lead.format("", "", "", "", ""))
    sides = []
    for impl in impls:
        sides += [f"{label(impl) + ' out-of-place':^32}", f"{label(impl) + ' in-place':^32}"]
    top = f"# {coll} on {nranks} ranks, {dtype}" + (f", {redop}" if coll in REDUCING else "")
    cols = [_SIDE.format("time", "algbw", "busbw", "#wrong")] * (2 * len(impls))
    units = [_SIDE.format("(us)", "(GB/s)", "(GB/s)", "")] * (2 * len(impls))
    against = peers(impls)
    # The first speedup block is titled in full, later ones (13 columns wide) by their peer.
    titles = [f" | speedup ({label(p)} time / gc3 time)" if k == 0 else f" | {'vs ' + label(p):^13}"
              for k, p in enumerate(against)]
    speed_cols = "".join(" | {:>6} {:>6}".format("oop", "ip") for _ in against)
    return [
        top,
        "#" + blank[1:] + " | " + " | ".join(sides) + "".join(titles),
        "#" + lead.format("size", "count", "type", "redop", "root")[1:] + " | " + " | ".join(cols)
        + (speed_cols + "  gc3 algorithm (oop / ip)" if against else ""),
        "#" + lead.format("(B)", "(elements)", "", "", "")[1:] + " | " + " | ".join(units),
    ]


def format_row(row: Row, impls: Sequence[str]) -> str:
    lead = "{:>12} {:>12} {:>9} {:>6} {:>5}".format(
        row.nbytes, row.count, row.dtype, row.redop if row.coll in REDUCING else "none",
        row.root if row.coll in ROOTED else -1)
    sides = [_side(row.results.get(impl, {}).get(place)) for impl in impls for place in PLACES]
    line = lead + " | " + " | ".join(sides)
    against = peers(impls)
    for peer in against:
        sp = [row.speedup(p, peer) for p in PLACES]
        line += " | " + " ".join("{:>6}".format("-" if s is None else f"{s:.2f}x") for s in sp)
    if against:
        algos = [row.results.get("gc3", {}).get(p) for p in PLACES]
        names = [m.algorithm if m is not None and m.algorithm else "-" for m in algos]
        line += "  " + (names[0] if names[0] == names[1] else " / ".join(names))
    if any(m.wrong for side in row.results.values() for m in side.values()):
        line += "  <- WRONG"
    return line


def graph_details(row: Row, impls: Sequence[str]) -> List[str]:
    """A comment line with the row's CUDA-graph replay times, when it has any:
    per implementation and placement, us per call in a graph of 100 calls / in
    a graph of one call, and gc3's ratio on the 100-call graph against each peer."""
    def us(x):
        return "-" if x is None or x != x else f"{x:.2f}"

    parts = []
    for impl in impls:
        side = row.results.get(impl, {})
        if any(m.graph100_us is not None for m in side.values()):
            parts.append(f"{label(impl)} " + " ".join(
                f"{p} {us(side[p].graph100_us)}/{us(side[p].graph1_us)}" for p in PLACES if p in side))
    if not parts:
        return []
    ratios = []
    for peer in peers(impls):
        for p in PLACES:
            g, n = (row.results.get(i, {}).get(p) for i in ("gc3", peer))
            if g and n and g.graph100_us and n.graph100_us and g.graph100_us == g.graph100_us:
                ratios.append(f"{p} vs {label(peer)} {n.graph100_us / g.graph100_us:.2f}x")
    return [f"#   graph us/call (100-call graph / 1-call graph): {' | '.join(parts)}"
            + (f"  [{', '.join(ratios)}]" if ratios else "")]


def wrong_details(row: Row) -> List[str]:
    """Comment lines naming the first wrong element of each wrong case of `row`."""
    return [f"#   {label(impl)} {'out-of-place' if place == 'oop' else 'in-place'} "
            f"{row.nbytes} B: {m.wrong} wrong; first: {m.first_wrong or '?'}"
            for impl, side in row.results.items() for place, m in side.items() if m.wrong]


def footer(rows: Sequence[Row], impls: Sequence[str]) -> List[str]:
    out = []
    for impl in impls:
        vals = [m.busbw for r in rows for m in r.results.get(impl, {}).values()]
        wrong = sum(m.wrong or 0 for r in rows for m in r.results.get(impl, {}).values())
        if vals:
            out.append(f"# {label(impl)}: out of bounds values: {wrong} {'OK' if wrong == 0 else 'FAILED'}; "
                       f"avg bus bandwidth: {sum(vals) / len(vals):.3f} GB/s")
    return out


# --- files -----------------------------------------------------------------------

def flat(row: Row) -> Dict[str, object]:
    out = {k: v for k, v in asdict(row).items() if k != "results"}
    for impl, places in row.results.items():
        for place, m in places.items():
            for k, v in asdict(m).items():
                out[f"{impl}_{place}_{k}"] = v
    for place in PLACES:
        out[f"speedup_{place}"] = row.speedup(place)
        if "nccl-sym" in row.results:
            out[f"speedup_sym_{place}"] = row.speedup(place, "nccl-sym")
    return out


def write_csv(rows: Sequence[Row], path: Path) -> None:
    records = [flat(r) for r in rows]
    keys: List[str] = []
    for rec in records:
        keys += [k for k in rec if k not in keys]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(records)


def write_json(rows: Sequence[Row], path: Path, meta: Dict[str, object]) -> None:
    Path(path).write_text(json.dumps({"meta": meta, "rows": [flat(r) for r in rows]}, indent=1) + "\n")


_COLORS = {"gc3": "tab:red", "nccl": "tab:blue", "nccl-sym": "tab:green"}


def _panels(ncols: int):
    """pyplot (Agg) and a figure of two rows of panels per column: values above, ratios below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, ncols, figsize=(4.5 * ncols, 6.5), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": (3, 2)})
    return plt, fig, axes


def _finish(plt, fig, axes, path: Path, title: str, dpi: int) -> None:
    """Parity line, log2 sizes, grid and legends on every column; title; write the file."""
    for ratio in axes[1]:
        ratio.axhline(1.0, color="gray", linewidth=0.8)
        ratio.set_xlabel("size (bytes)")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot(rows: Sequence[Row], path: Path, title: str = "", dpi: int = 120) -> None:
    """Per collective (a column of panels): busbw vs size for gc3 and NCCL (and
    NCCL-sym when measured) above, and below gc3's ratio to each NCCL (NCCL time
    / gc3 time, 1 = parity); out-of-place solid, in-place dashed."""
    colls = list(dict.fromkeys(r.coll for r in rows))
    plt, fig, axes = _panels(len(colls))
    names = {"oop": "out-of-place", "ip": "in-place"}
    for k, coll in enumerate(colls):
        bw, ratio = axes[0][k], axes[1][k]
        mine = [r for r in rows if r.coll == coll]
        for place, style in (("oop", "-"), ("ip", "--")):
            for impl, color in _COLORS.items():
                pts = [(r.nbytes, r.results[impl][place].busbw) for r in mine
                       if place in r.results.get(impl, {})]
                if pts:
                    xs, ys = zip(*pts)
                    bw.plot(xs, ys, style, color=color, marker="o", markersize=3,
                            label=f"{label(impl)} {names[place]}")
            for peer, color in (("nccl", "black"), ("nccl-sym", _COLORS["nccl-sym"])):
                pts = [(r.nbytes, r.speedup(place, peer)) for r in mine if r.speedup(place, peer) is not None]
                if pts:
                    xs, ys = zip(*pts)
                    ratio.plot(xs, ys, style, color=color, marker="o", markersize=3,
                               label=f"vs {label(peer)} {names[place]}")
        bw.set_ylabel("busbw (GB/s)")
        bw.set_title(f"{coll}, {mine[0].nranks} ranks, {mine[0].dtype}")
        ratio.set_ylabel("gc3 / NCCL (busbw)")
    _finish(plt, fig, axes, path, title, dpi)


def _algorithm_colors(choices: Dict[str, Dict[str, List[dict]]]) -> Dict[str, tuple]:
    """A colour (and marker) per chosen algorithm; whatever NCCL serves in NCCL's blue."""
    from matplotlib import colormaps

    palette = [c for i, c in enumerate(colormaps["tab10"].colors) if i not in (0, 3, 7)]   # not NCCL's blue, gc3's red, gray
    algos = sorted({r["algorithm"] for per in choices.values() for recs in per.values() for r in recs})
    ours = [a for a in algos if not a.startswith("NCCL")]
    out = {a: (_COLORS["nccl"], "x") for a in algos if a.startswith("NCCL")}
    out.update({a: (palette[i % len(palette)], "os^Dv"[i // len(palette) % 5]) for i, a in enumerate(ours)})
    return out


def plot_choices(choices: Dict[str, Dict[str, List[dict]]], path: Path, title: str = "", dpi: int = 120) -> None:
    """`gc3 tune`'s decisions, from its provenance record (`tune.choices_record`,
    a catalog's provenance "choices"): per collective (a column of panels) the
    chosen algorithm's time per call and NCCL's where measured above, and below
    the margin, NCCL time / chosen time (1 = parity: NCCL itself was chosen);
    out-of-place solid, in-place dashed (hollow points), each point in its
    algorithm's colour.
    Sizes without a time (the time budget spent) are left out."""
    if not choices:
        raise ValueError("no choices to plot")
    from matplotlib.lines import Line2D

    plt, fig, axes = _panels(len(choices))
    colors = _algorithm_colors(choices)
    names = {"outofplace": "out-of-place", "inplace": "in-place"}
    for k, (coll, per) in enumerate(choices.items()):
        top, margin = axes[0][k], axes[1][k]
        seen = {}
        for place, style, dot in (("outofplace", "-", {"markersize": 4}),
                                  ("inplace", "--", {"markersize": 7, "markerfacecolor": "none"})):
            timed = [r for r in per.get(place, []) if r["time_us"] is not None]
            vs = [r for r in timed if r["nccl_us"] is not None and r["time_us"] > 0]
            for ax, pts, color, what in (
                    (top, [(r, r["time_us"]) for r in timed], _COLORS["gc3"], "chosen"),
                    (top, [(r, r["nccl_us"]) for r in per.get(place, []) if r["nccl_us"] is not None],
                     _COLORS["nccl"], "NCCL"),
                    (margin, [(r, r["nccl_us"] / r["time_us"]) for r in vs], "black", "NCCL / chosen")):
                if pts:
                    ax.plot([r["bytes"] for r, _ in pts], [y for _, y in pts], style, color=color,
                            linewidth=1, label=f"{what} {names[place]}")
                    if what != "NCCL":
                        for r, y in pts:
                            c, m = seen[r["algorithm"]] = colors[r["algorithm"]]
                            ax.plot(r["bytes"], y, m, color=c, zorder=3, **dot)
        handles, labels = top.get_legend_handles_labels()
        handles += [Line2D([], [], linestyle="", marker=m, color=c) for c, m in seen.values()]
        top.legend(handles, labels + list(seen), fontsize=6)
        top.set_yscale("log")
        top.set_ylabel("time per call (us)")
        top.set_title(coll)
        margin.set_ylabel("margin (NCCL time / chosen time)")
        if not any(r["nccl_us"] is not None for recs in per.values() for r in recs):
            margin.text(0.5, 0.5, "NCCL not measured (cost model)", transform=margin.transAxes,
                        ha="center", va="center", color="gray")
            margin.set_yticks([])
    _finish(plt, fig, axes, path, title, dpi)
