"""The measured-lines file of the fused operators (`fused.txt`): one line per
shape, written by `gc3 bench --fused`, read back for the README's table and plot.

    fused op=gemm_rs gpus=4 M=8192 K=28672 N=8192 dtype=bfloat16 auto_us=... fused_us=... seq_nccl_us=...
          symm_us=... gemm_us=... comm_nccl_us=... comm_fused_us=... host_us=... seq_host_us=...
          graph_fused_us=... graph_seq_nccl_us=... seq_gc3_us=... graph_auto_us=... fused_ce_us=... host_ce_us=...
          path=fused|sequential check=ok hw=4xH100 date=YYYY-MM-DD

Times are microseconds per call; a field that does not apply is `n/a` (lines written before a
field existed lack it).  seq_gc3_us: the operator's sequential path on the gc3 group, the one
`auto` weighs the fused path against (GEMM family: lines from 2026-11-28 on).  fused_us, host_us: with the
GEMM storing the peers' tiles (GC3_FUSED_PEER_TILES=store unless the job set it); fused_ce_us,
host_ce_us: the fused path's eager call with the copy engines carrying them
(GC3_FUSED_PEER_TILES=copy-engine, GEMM + reduce-scatter, all-reduce, all-to-all), in the same job;
auto_us takes the way the catalog's entry names.  The
shape fields depend on the operator (M K N for the GEMM family); whatever
stands between dtype's neighbours is kept as the shape.
"""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from gc3.errors import InputError

from .choice import SIZE_AXIS

FIELDS = ("auto_us", "fused_us", "seq_nccl_us", "symm_us", "gemm_us", "comm_nccl_us", "comm_fused_us", "host_us",
          "seq_host_us", "graph_fused_us", "graph_seq_nccl_us", "seq_gc3_us", "graph_auto_us", "fused_ce_us",
          "host_ce_us")
_FIXED = ("op", "gpus", "dtype", "path", "check", "hw", "date") + FIELDS


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def format_line(op: str, gpus: int, shape: Mapping[str, int], dtype: str, values: Mapping[str, Optional[float]],
                path: str, check: str, hw: str, date: Optional[str] = None) -> str:
    cells = " ".join(f"{k}={_fmt(values.get(k))}" for k in FIELDS)
    dims = " ".join(f"{k}={v}" for k, v in shape.items())
    return (f"fused op={op} gpus={gpus} {dims} dtype={dtype} {cells} path={path} check={check} hw={hw} "
            f"date={date or datetime.date.today().isoformat()}")


def parse_line(text: str, where: str = "") -> dict:
    """One line as a dict: times as floats (None for n/a), `shape` the other fields."""
    cells = text.split()
    if not cells or cells[0] != "fused":
        raise InputError(f"{where}: not a fused record (it must start with 'fused')")
    out: Dict = {"shape": {}}
    for cell in cells[1:]:
        key, sep, value = cell.partition("=")
        if not sep:
            raise InputError(f"{where}: {cell!r} is not key=value")
        if key in FIELDS:
            try:
                out[key] = None if value == "n/a" else float(value)
            except ValueError:
                raise InputError(f"{where}: {key}={value!r} is not a number or n/a") from None
        elif key in _FIXED:
            out[key] = int(value) if key == "gpus" else value
        else:
            out["shape"][key] = int(value) if value.isdigit() else value
    missing = [k for k in ("op", "gpus", "path", "check", "hw") if k not in out]
    if missing:
        raise InputError(f"{where}: fields {', '.join(missing)} missing")
    return out


def read(path: Path) -> List[dict]:
    """Every record of the file; a later line of the same (op, gpus, shape, dtype, hw) replaces an earlier one
    (the epilogue's grid times each size in two input dtypes)."""
    latest: Dict = {}
    for i, text in enumerate(Path(path).read_text().splitlines(), 1):
        if text.strip() and not text.startswith("#"):
            r = parse_line(text, f"{path}:{i}")
            latest[(r["op"], r["gpus"], tuple(r["shape"].items()), r.get("dtype"), r["hw"])] = r
    return list(latest.values())


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def derived(r: dict) -> dict:
    """Speedups over the user's path (seq_nccl), the headroom seq/limit, and overlap efficiency E."""
    seq, fused = r.get("seq_nccl_us"), r.get("fused_us")
    limit = max(r["gemm_us"], r["comm_nccl_us"]) if r.get("gemm_us") and r.get("comm_nccl_us") else None
    e = (seq - fused) / (seq - limit) if seq and fused and limit and seq - limit > 1e-9 else None
    g_seq = r.get("graph_seq_nccl_us")
    return {"auto": ratio(seq, r.get("auto_us")), "fused": ratio(seq, fused), "symm": ratio(seq, r.get("symm_us")),
            "headroom": ratio(seq, limit), "E": e,
            "comm_share": ratio(r.get("comm_nccl_us"), seq),
            "graph_auto": ratio(g_seq, r.get("graph_auto_us")), "graph_fused": ratio(g_seq, r.get("graph_fused_us"))}


def markdown(records: List[dict]) -> str:
    """The README's table: one row per record, the user's path first; the shape names the input dtype
    where it is not bf16, the dtype every grid uses unless it says otherwise.  The graph columns
    compare replays in a CUDA graph: matmul then NCCL against auto's and the fused path's.  gc3 fused
    is the GEMM storing the peers' tiles, beside it the copy engines carrying them (fused_ce_us)."""
    rows = ["| op | G | shape | seq-nccl µs | symm µs | gc3 auto µs | gc3 fused µs | copy engines µs | seq/auto "
            "| seq/fused | headroom | E | auto's path | check | graph seq/auto | graph seq/fused |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"   # noqa: E731
    for r in sorted(records, key=lambda r: (r["op"], r["gpus"], str(r.get("dtype")), tuple(r["shape"].values()))):
        d = derived(r)
        dims = dict(r["shape"], **({"dtype": r["dtype"]} if r.get("dtype", "bfloat16") != "bfloat16" else {}))
        shape = " ".join(f"{k}={v}" for k, v in dims.items())
        rows.append(f"| {r['op']} | {r['gpus']} | {shape} | {f(r.get('seq_nccl_us'))} | {f(r.get('symm_us'))} | "
                    f"{f(r.get('auto_us'))} | {f(r.get('fused_us'))} | {f(r.get('fused_ce_us'))} | {f(d['auto'], 2)}× | "
                    f"{f(d['fused'], 2)}× | "
                    f"{f(d['headroom'], 2)}× | {f(d['E'], 2)} | {r['path']} | {r['check']} | {f(d['graph_auto'], 2)}× | "
                    f"{f(d['graph_fused'], 2)}× |")
    return "\n".join(rows)


def _panels(records: List[dict]) -> List[Tuple[str, Tuple[str, ...]]]:
    """The plot's rows: the GEMM family together (all along M), then each other operator along its own
    size axis (choice.SIZE_AXIS), in that order."""
    ops = sorted({r["op"] for r in records})
    gemm = tuple(op for op in ops if SIZE_AXIS.get(op, "M") == "M")
    return ([("M", gemm)] if gemm else []) + [(SIZE_AXIS[op], (op,)) for op in ops if op not in gemm]


def series(records: List[dict], gpus: int, ops: Tuple[str, ...], axis: str) -> Dict[Tuple[str, str], List[dict]]:
    """A panel's lines: the records of `ops` at `gpus` GPUs that vary along `axis`, by (op, the
    other dimensions, the input dtype where not bf16, and the machine where the panel has several:
    a line never joins two machine kinds)."""
    here = [r for r in records if r["gpus"] == gpus and r["op"] in ops and axis in r["shape"]]
    several_hw = len({r["hw"] for r in here}) > 1
    lines: Dict[Tuple[str, str], List[dict]] = {}
    for r in here:
        rest = " ".join(f"{k}={v}" for k, v in r["shape"].items() if k != axis)
        rest += "" if r.get("dtype", "bfloat16") == "bfloat16" else f" {r['dtype']}"
        lines.setdefault((r["op"], rest + (f" {r['hw']}" if several_hw else "")), []).append(r)
    return lines


def plot(records: List[dict], out: Path, title: str = "") -> None:
    """Speedup over the user's path (matmul or the torch ops, then NCCL) against each operator's
    size axis: a row of panels per operator (the GEMM family shares one), a column per GPU count, a
    line per op and fixed other dimensions: gc3 auto (solid), gc3 fused (dashed), PyTorch symm_mem
    (dotted), and the headroom seq/max(compute, comm) as ticks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["gpus"] for r in records})
    if not counts:
        raise InputError("no fused records to plot")
    panels = _panels(records)
    fig, axes = plt.subplots(len(panels), len(counts), figsize=(7 * len(counts), 4.2 * len(panels)), squeeze=False)
    for row, (axis, ops) in zip(axes, panels):
        for ax, g in zip(row, counts):
            lines = series(records, g, ops, axis)
            for i, ((op, rest), pts) in enumerate(sorted(lines.items())):
                pts.sort(key=lambda r: r["shape"][axis])
                x = [r["shape"][axis] for r in pts]
                d = [derived(r) for r in pts]
                color = f"C{i % 10}"
                ax.plot(x, [v["auto"] or float("nan") for v in d], "-o", color=color, label=f"{op} {rest}", ms=3)
                ax.plot(x, [v["fused"] or float("nan") for v in d], "--", color=color, alpha=0.7)
                if any(v["symm"] for v in d):
                    ax.plot(x, [v["symm"] or float("nan") for v in d], ":", color=color, alpha=0.7)
                ax.plot(x, [v["headroom"] or float("nan") for v in d], "_", color=color, ms=12)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.axhline(0.98, color="r", lw=0.6, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xlabel(axis)
            ax.set_ylabel("T_seq_nccl / T  (higher is faster)")
            ax.set_title(f"{'/'.join(ops)}, {g} GPUs: auto (solid), fused (dashed), symm (dotted), headroom (ticks)",
                         fontsize=8)
            if lines:
                ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
