"""A custom collective without <postcondition> (tests/data/alltonext_custom_16r.xml,
msccl-tools' alltonext as MSCCL runs it) on 16 virtual ranks of one GPU with
`gc3 run --unproven`, its buffers compared with `gc3 simulate`'s."""
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
ALLTONEXT = ROOT / "tests" / "data" / "alltonext_custom_16r.xml"


@pytest.mark.parametrize("size", ["64K", "4MiB"])
def test_gc3_run_unproven_matches_the_simulator(size):
    from runtime_cuda.commands import cli

    # cli(): gc3's command line with the runtime's commands, installed as a package or not.
    res = CliRunner().invoke(cli(), ["run", str(ALLTONEXT), "--unproven", "--mode", "virtual", "--size", size,
                                    "--iters", "3", "--warmup", "1"])
    assert res.exit_code == 0, res.output
    assert "NOTHING PROVEN" in res.output and "16 virtual ranks on one GPU" in res.output
    assert "against gc3 simulate's buffers" in res.output
    check = [line for line in res.output.splitlines() if line.startswith("check: ") and " wrong of " in line]
    assert check and check[0].startswith("check: 0 wrong of ") and not check[0].startswith("check: 0 wrong of 0 "), \
        res.output


def test_every_rank_buffer_is_the_simulators():
    """The same inputs through the interpreter kernel and through gc3 simulate: every
    output element of every rank bit for bit (rank 0's output, which nothing writes,
    holds the poison both put there)."""
    import cupy

    from gc3.ir.xml_io import read_xml
    from gc3.simulator import simulate
    from runtime_cuda.core.checking import device_buffers
    from runtime_cuda.ranks.virtual import VirtualRanks

    prog = read_xml(ALLTONEXT)
    n = 4 * 1024 + 3 * 4             # whole chunks plus short ones
    sim = simulate(prog, count=n, dtype="float32", unproven=True)
    assert sim.ok and sim.unproven
    group = VirtualRanks(prog)
    ins, outs = device_buffers(group, sim.inputs, n, "float32", False)
    group(ins, outs, op="sum", dtype="float32")
    group.check()
    for r, out in zip(group.ranks, outs):
        with cupy.cuda.Device(group.rank_device(r)):
            got = out.get().view(np.float32)
        assert got.view(np.uint32).tolist() == sim.outputs[r].view(np.uint32).tolist(), f"rank {r}"
    for r in range(1, 16):          # and what the simulator holds is alltonext's data
        assert np.array_equal(sim.outputs[r], sim.inputs[r - 1])
