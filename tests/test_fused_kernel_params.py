"""The fused kernels take their parameters from ctypes structures whose fields the driver reads
by address, in order (runtime_cuda.ranks.small_allreduce.kernel_params): a field out of order or
of another size than the kernel's parameter would hand the kernel garbage.  Read each kernel's
parameter list from its .cu file and compare it with the structure, without a GPU."""
import ctypes
import re
from pathlib import Path

import pytest

from runtime_cuda.core import abi
from runtime_cuda.fused import ebag_kernel, gemv_kernel

KERNELS = Path(__file__).resolve().parents[1] / "runtime_cuda" / "kernels"


def _struct_bytes(source: str, name: str) -> int:
    """sizeof a struct of u64/int arrays of the kernel source (its fields' sizes, no padding
    beyond 8-byte alignment of the whole)."""
    body = re.search(r"struct %s\s*{(.*?)};" % name, source, re.S).group(1)
    size = 0
    for ctype, count in re.findall(r"(u64|int)\s+\w+\[([^\]]+)\];", body):
        n = eval(re.sub(r"GC3_\w+", lambda m: str(abi.C[m.group(0)]), count))   # noqa: S307 - digits and *
        size += n * (8 if ctype == "u64" else 4)
    return -(-size // 8) * 8


def _params(source: str, signature: str):
    """(name, bytes) of each parameter in a parameter list of the kernel source."""
    out = []
    for p in (p.strip() for p in signature.split(",")):
        m = re.fullmatch(r"(const\s+)?([\w ]+?)\s*(\*?)\s*(\w+)", p)
        assert m, p
        ctype, ptr, name = m.group(2).strip(), m.group(3), m.group(4)
        if ptr:
            size = 8
        elif ctype in ("int",):
            size = 4
        elif ctype in ("long long", "u64"):
            size = 8
        else:
            size = _struct_bytes(source, ctype)
        out.append((name, size))
    return out


def _fields(args):
    return [(name, ctypes.sizeof(ctype)) for name, ctype in args._fields_]


def test_the_embedding_bag_kernel_reads_its_structure_in_order():
    source = (KERNELS / "ebag_alltoall.cu").read_text()
    signature = re.search(r"gc3_ebag_alltoall\((.*?)\)\s*{", source, re.S).group(1)
    params = _params(source, signature)
    assert [n for n, _ in params] == [n for n, _ in _fields(ebag_kernel._Args)]
    assert params == _fields(ebag_kernel._Args)


def test_the_gemv_kernel_reads_its_structure_in_order():
    source = (KERNELS / "gemv_allreduce.cu").read_text()
    signature = re.search(r"name\((const Plan\* plan.*?)\)\s*{", source, re.S).group(1)
    params = _params(source, signature.replace("\\", " "))
    assert params == _fields(gemv_kernel._Args)


@pytest.mark.parametrize("dtype, dim, why", [("float32", 3, "not a multiple of 16"), ("bfloat16", 8, None),
                                             ("float16", 4, "not a multiple of 16"), ("int8", 16, "dtype int8")])
def test_embedding_rows_the_kernel_stores_whole(dtype, dim, why):
    got = ebag_kernel.refusal(dtype, 2, 1, 10, dim, 4, 4)
    assert (got is None) if why is None else (why in got)


def test_slots_grow_in_powers_of_two_from_a_floor():
    assert ebag_kernel.group_slot(1) == ebag_kernel.MIN_SLOT_BYTES
    assert ebag_kernel.group_slot(ebag_kernel.MIN_SLOT_BYTES + 1) == 2 * ebag_kernel.MIN_SLOT_BYTES
    assert ebag_kernel.group_slot(3 << 20) == 4 << 20
    # flags of every rank's blocks and the claim word, then two parity regions of n slots
    assert ebag_kernel.extra_bytes(4, 1 << 20) == ebag_kernel._flag_bytes(4) + 2 * 4 * (1 << 20)
    assert ebag_kernel._flag_bytes(4) >= (4 * abi.C["GC3_SA_MAX_BLOCKS"] + 1) * 8
    assert ebag_kernel._flag_bytes(4) % 16 == 0


@pytest.mark.parametrize("kernel, structure", [("gc3_small_allreduce", "_Args"), ("gc3_small_allreduce_ll128", "_Args"),
                                               ("gc3_epilogue_pass", "_PassArgs")])
def test_the_small_kernels_and_the_epilogue_pass_read_their_structures_in_order(kernel, structure):
    """The small-message kernels' launch and the epilogue pass's packed launch (PassLaunch)."""
    from runtime_cuda.ranks import small_allreduce
    source = (KERNELS / "small_allreduce.cu").read_text()
    signature = re.search(r"%s\((.*?)\)\s*{" % kernel, source, re.S).group(1)
    assert _params(source, signature) == _fields(getattr(small_allreduce, structure))
