"""Time `gc3.verify.verify` on an 8-rank all-pairs AllReduce with 2 instances (~265 KB of XML).

    python scripts/bench_verify.py
"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_verify_large import allpairs  # noqa: E402  (the same program the tests check)

from gc3.verify import verify  # noqa: E402
from gc3.ir.xml_io import from_xml, to_xml  # noqa: E402

text = to_xml(allpairs())
t0 = time.perf_counter()
prog = from_xml(text)
t1 = time.perf_counter()
verify(prog)
t2 = time.perf_counter()
print(f"{'xml bytes':>10} {'parse s':>8} {'verify s':>9}")
print(f"{len(text):>10} {t1 - t0:>8.3f} {t2 - t1:>9.3f}")
