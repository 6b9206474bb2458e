"""A Gantt chart of predicted step times, one row per (rank, threadblock)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Union

from .cost_model import Timing
from .executor import Executed

_COLORS = {
    "s": "tab:blue", "r": "tab:orange", "rcs": "tab:green", "rrc": "tab:red", "rrs": "tab:purple",
    "rrcs": "tab:brown", "cpy": "tab:pink", "re": "tab:olive", "nop": "tab:gray",
    "gemv": "tab:cyan", "ebag": "tab:cyan", "gemm": "tab:cyan", "agemm": "tab:cyan",
}


def draw(records: List[Executed], timing: Timing, path: Union[str, Path], title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sorted({(r.rank, r.tb) for r in records})
    row_of = {key: i for i, key in enumerate(rows)}
    bars = {t: [] for t in _COLORS}
    for i, rec in enumerate(records):
        y = row_of[(rec.rank, rec.tb)]
        # A threadblock walks its steps once per tile, so a step is one bar per tile.
        spans = timing.spans[i] if timing.spans else [(timing.start[i], timing.end[i])]
        bars[rec.type].append((y, [(s * 1e6, max((e - s) * 1e6, 1e-3)) for s, e in spans]))
    height = min(max(2.5, 0.22 * len(rows) + 1.5), 60)
    fig, ax = plt.subplots(figsize=(12, height))
    for t, items in bars.items():
        for y, xranges in items:
            ax.broken_barh(xranges, (y - 0.4, 0.8), facecolors=_COLORS[t], edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"r{r} tb{t}" for r, t in rows], fontsize=max(4, min(9, 400 // max(len(rows), 1))))
    ax.invert_yaxis()
    ax.set_xlabel(f"predicted time (us; {timing.calibration if timing.calibrated else 'UNCALIBRATED'}; "
                  f"{timing.ntiles} tile(s) of {timing.tile_bytes} B per chunk)")
    ax.set_title(title or "gc3 simulate: predicted timeline")
    used = [t for t, items in bars.items() if items]
    ax.legend(handles=[Patch(color=_COLORS[t], label=t) for t in used], loc="upper right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
