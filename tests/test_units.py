"""One size parser, one meaning of units wherever a size is read: the CLI
(`gc3 simulate --size`, `gc3 run --size`, `gc3 bench -b/-e`), the simulator,
the catalog's min/max_bytes; and one bus factor."""
import numpy as np
import pytest

from gc3.errors import GC3Error, SizeError
from gc3.units import bus_factor, parse_size

BINARY = [("8", 8), ("64K", 64 << 10), ("64k", 64 << 10), ("64KiB", 64 << 10), ("128M", 128 << 20),
          ("1MiB", 1 << 20), ("1G", 1 << 30), (" 2 GiB ", 2 << 30), ("1.5M", 3 << 19), ("3B", 3),
          # up to the documented limit of 1 TiB per call
          ("1TiB", 1 << 40), ("1T", 1 << 40), ("1t", 1 << 40), ("0.5TiB", 1 << 39)]
DECIMAL = [("1KB", 1000), ("1MB", 10 ** 6), ("1.5MB", 1_500_000), ("2GB", 2 * 10 ** 9), ("4kb", 4000), ("1TB", 10 ** 12)]
NUMBERS = [(4096, 4096), (np.int64(12), 12), (0, 0)]


@pytest.mark.parametrize("text, nbytes", BINARY + DECIMAL + NUMBERS)
def test_units_mean_the_same_everywhere(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["", "-1", "1X", "1 parsec", "1\u0661K", "0.5", "1.0000001K", "2T", -5, True,
                                 "2048GiB",
                                 "1.1TB", "1025GiB"])
def test_bad_sizes_are_a_size_error_and_a_value_error(bad):
    with pytest.raises(SizeError) as info:
        parse_size(bad)
    assert isinstance(info.value, ValueError) and isinstance(info.value, GC3Error)


def test_every_reader_is_this_parser():
    import gc3.simulator.driver as driver
    import runtime_cuda.commands.bench as bench
    import runtime_cuda.nccl.catalog as catalog
    from gc3.simulator.driver import _element_count

    assert driver.parse_size is parse_size and catalog.parse_size is parse_size
    assert bench._size(None, None, "1MB") == 10 ** 6 and bench._size(None, None, "1M") == 1 << 20
    s = catalog._settings({"min_bytes": "1KB", "max_bytes": "1K"})
    assert (s.min_bytes, s.max_bytes) == (1000, 1024)
    assert _element_count("1MB", None, 4) == 250_000


@pytest.mark.parametrize("coll, n, factor", [("allreduce", 4, 1.5), ("allgather", 4, 0.75), ("reducescatter", 8, 0.875),
                                             ("alltoall", 2, 0.5), ("broadcast", 4, 1.0), ("reduce", 4, 1.0)])
def test_bus_factor_is_nccl_tests(coll, n, factor):
    assert bus_factor(coll, n) == factor


@pytest.mark.parametrize("proto", ["Simple", "LL"])
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("split", [(1, 0), (4, 65536), (8, 1000)])
def test_runtime_and_cost_model_tile_alike(proto, itemsize, split):
    """One slot size and one tiling rule: the cost model's tiles are the runtime's."""
    from dataclasses import replace

    from gc3.simulator.cost_config import DEFAULT, preset
    from gc3.simulator.cost_model import tile_of
    from runtime_cuda.core.binding import tile_lanes
    from runtime_cuda.core.connections import TileSplit

    cfg = replace(preset(DEFAULT), tile_split=split)
    for cs in (1, 7, 4096, 100_000):
        for max_cnt in (1, 3, 16):
            lanes = tile_lanes(cs, itemsize, proto, max_cnt, TileSplit(*split))
            assert tile_of(cs * itemsize, itemsize, proto, max_cnt, cfg)[0] == lanes * itemsize
