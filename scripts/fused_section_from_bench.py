"""Write a catalog's fused entries from `gc3 bench --fused` records (dev tooling)

    python scripts/fused_section_from_bench.py CATALOG RECORDS GPUS OPS HW DATE "EDIT NOTE"

`gc3 tune --fused` times the sequential path and the fused one per shape; a bench run has
timed the same two (seq_gc3_us, or in older lines auto_us where the catalog sent the shape to
the sequential path, against fused_us), so its lines can decide the entries without measuring
again (bench_fused.entries_from_records).  Updates CATALOG's entries of OPS (comma-separated)
at GPUS with those of RECORDS' lines from HW on DATE, shape by shape: a shape the lines do not
decide keeps its entry, and a decided one keeps the fields the lines do not give (its graph
path where auto ran the fused path).  Adds EDIT NOTE to the section's edits.
"""
import json
import sys
from pathlib import Path

from runtime_cuda.fused import choice, records
from runtime_cuda.torch_dist import bench_fused

catalog, record, gpus, ops, hw, date, note = sys.argv[1:8]
rows = [r for r in records.read(Path(record)) if r["hw"] == hw and r.get("date") == date]
decided, skipped = bench_fused.entries_from_records(rows, int(gpus), ops.split(","))
for why in skipped:
    print("skipped:", why)
if not decided:
    sys.exit(f"no {ops} lines at {gpus} GPUs from {hw} on {date} in {record}")

key = lambda e: choice.entry_key(e["op"], e["gpus"], e["dtype"], e["shape"])  # noqa: E731
kept = json.loads(Path(catalog).read_text()).get("fused", {}).get("entries", []) if Path(catalog).exists() else []
merged = {key(e): e for e in kept if e["op"] in ops.split(",") and e["gpus"] == int(gpus)}
for e in decided:
    merged[key(e)] = {**merged.get(key(e), {}), **e}
entries = list(merged.values())
bench_fused.write_section(Path(catalog), entries, None, note)
print(f"{catalog}: {len(entries)} entries of {ops} at {gpus} GPUs, {sum(e['path'] == 'fused' for e in entries)} fused, "
      f"{sum(e.get('graph_path') == 'fused' for e in entries)} fused in a graph")
