"""Every layer that gives an opcode a meaning has an entry for every row of
gc3.ir.opcodes.OPCODES.  Adding a row (try GC3_TEST_EXTRA_OPCODE=conv) fails
`test_layer_has_every_opcode` once per layer that lacks it, on a CPU.

Layers that only read the row's properties (operand roles, the compiler's
RECVS/SENDS/FUSED/SEND_FUSION, the cost model, xml_io) need no entry."""
import os
import re

import pytest

from gc3.ir.opcodes import OPCODES, OpcodeInfo

KERNELS = os.path.join(os.path.dirname(__file__), "..", "runtime_cuda", "kernels")


def _step_value():
    from gc3.ir.opcodes import STEP_VALUE
    return set(STEP_VALUE)


def _timeline():
    from gc3.simulator.timeline import _COLORS
    return set(_COLORS)


def _abi():
    from runtime_cuda.core import abi
    return {name[len("GC3_OP_"):].lower() for name in abi.C if name.startswith("GC3_OP_")}


def _device_dispatch():
    with open(os.path.join(KERNELS, "interpreter.cu")) as f:
        return {name.lower() for name in re.findall(r"case\s+GC3_OP_(\w+)\s*:", f.read())}


def _compute_operators():
    from gc3.simulator.compute import OPERATORS
    return set(OPERATORS)


# layer -> (what it has, which rows it needs an entry for)
LAYERS = {
    # what a step computes, read by the simulator (on values) and the semantic checker (on symbols)
    "step meaning: gc3/ir/opcodes.py STEP_VALUE": (_step_value, lambda i: True),
    "timeline: gc3/simulator/timeline.py _COLORS": (_timeline, lambda i: True),
    # a compute row's operator (named like its opcode): inputs, evaluation, unfused reference
    "compute operators: gc3/simulator/compute.py OPERATORS": (_compute_operators, lambda i: i.compute is not None),
    "runtime ABI: #define GC3_OP_* in runtime_cuda/kernels/common.cuh": (_abi, lambda i: i.device),
    "device dispatch: case GC3_OP_* in runtime_cuda/kernels/interpreter.cu": (_device_dispatch, lambda i: i.device),
}


def missing(layer, table):
    has, needs = LAYERS[layer]
    return sorted(t for t, info in table.items() if needs(info) and t not in has())


@pytest.fixture
def opcode_table():
    table = dict(OPCODES)
    extra = os.environ.get("GC3_TEST_EXTRA_OPCODE")
    if extra:   # what adding an opcode row does to this test
        table[extra] = OpcodeInfo(recv=False, send=False, reduce=False, writes=True, local_in="src")
    return table


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_has_every_opcode(layer, opcode_table):
    assert not missing(layer, opcode_table), f"{layer} has no entry for {missing(layer, opcode_table)}"


def test_a_new_row_is_missed_by_every_layer():
    """...every layer but the compute operators' table, which only compute rows need."""
    table = dict(OPCODES, conv=OpcodeInfo(recv=False, send=False, reduce=False, writes=True, local_in="src"))
    assert [layer for layer in LAYERS if missing(layer, table) == ["conv"]] == \
        [layer for layer in LAYERS if not layer.startswith("compute operators")]


def test_a_cpu_only_row_is_exempt_from_the_device_layers_only():
    """A compute row the interpreter cannot run yet (device=False, not folded) still
    needs its step meaning, timeline colour and an operator; the device layers skip it, and
    the runtime refuses it instead (tests/test_fused_gemv.py)."""
    row = OpcodeInfo(recv=False, send=False, reduce=False, writes=True, device=False, compute="conv")
    table = dict(OPCODES, conv=row)
    device = [layer for layer in LAYERS if layer.startswith(("runtime ABI", "device dispatch"))]
    assert len(device) == 2
    assert [layer for layer in LAYERS if missing(layer, table) == ["conv"]] == \
        [layer for layer in LAYERS if layer not in device]
    from gc3.ir.opcodes import NOT_ON_DEVICE
    assert {t for t, i in OPCODES.items() if not i.device} - {"nop"} == NOT_ON_DEVICE


def test_layers_name_no_opcode_the_table_lacks():
    for layer, (has, needs) in LAYERS.items():
        assert has() <= set(OPCODES), layer


def test_derived_sets_are_the_ones_the_layers_used_to_list():
    from gc3.ir.opcodes import DEVICE_OPCODES, FUSED, RECVS, SEND_FUSION, SENDS
    assert RECVS == {"r", "rcs", "rrc", "rrs", "rrcs"} and SENDS == {"s", "rcs", "rrs", "rrcs"}
    assert FUSED == {"rcs", "rrs", "rrcs"} and SEND_FUSION == {"r": "rcs", "rrc": "rrcs"}
    assert DEVICE_OPCODES == ("s", "r", "rcs", "rrc", "rrs", "rrcs", "cpy", "re", "gemv", "ebag")
