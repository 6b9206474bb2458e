"""`gc3 trace --dag` draws an image of bounded width whose aspect stays readable:
the input chunks (ranks x chunks of them) wrap into rows as wide as the operations."""
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.cli import main

ROOT = Path(__file__).resolve().parents[1]


def png_size(path):
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("ranks", [4, 8])
def test_dag_png_has_bounded_width_and_a_readable_aspect(ranks, tmp_path):
    out = tmp_path / "dag.png"
    res = CliRunner().invoke(main, ["trace", str(ROOT / "gc3" / "algorithms" / "allreduce_ring.py"), str(ranks),
                                    "--dag", str(out), "-q"])
    assert res.exit_code == 0, res.output
    width, height = png_size(out)
    # 24 nodes per row at most (gc3.dsl.chunk_dag.DRAWN_ROW_MAX) at 0.9 in and 120 dpi
    assert width <= 24 * 0.9 * 120 + 1
    assert 1 / 3 <= width / height <= 3, (width, height)
