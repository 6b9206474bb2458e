"""runtime_cuda.fused.allreduce_epilogue on the CPU (no GPU needed): its argument checks on
numpy stand-ins for CuPy arrays, the epilogue words the kernels read, and the small kernel
each size runs."""
import numpy as np
import pytest

from fake_gpu import DevArray, install

ep = pytest.importorskip("runtime_cuda.fused.epilogue")
mb = pytest.importorskip("runtime_cuda.fused.memory_bound")


class CudaArray(DevArray):
    """A numpy array that passes the API's CuPy-array check."""

    @property
    def __cuda_array_interface__(self):
        return {}


def arr(shape, dtype=np.float32):
    return np.zeros(shape, dtype).view(CudaArray)


def test_argument_checks(monkeypatch):
    install(monkeypatch)
    comm = mb.VirtualComm(2)
    x = [arr((3, 8)), arr((3, 8))]
    call = ep.allreduce_epilogue
    with pytest.raises(ValueError, match="no epilogue"):
        call(x, comm)
    for bad in (float("nan"), True, "2"):
        with pytest.raises(ValueError, match="scale must be a finite number"):
            call(x, comm, scale=bad)
    with pytest.raises(ValueError, match="list of 2 arrays"):
        call(x[0], comm, scale=2)
    with pytest.raises(ValueError, match=r"rank 1: x \(3, 9\) float32 differs from rank 0's \(3, 8\) float32"):
        call([x[0], arr((3, 9))], comm, scale=2)
    with pytest.raises(ValueError, match="dtype int32"):
        call([arr((3, 8), np.int32)] * 2, comm, scale=2)
    with pytest.raises(ValueError, match=r"rank 0: bias is \(3,\), expected \(8,\)"):
        call(x, comm, bias=[arr(3), arr(3)])
    with pytest.raises(ValueError, match="bias is given on some ranks and not on others"):
        call(x, comm, bias=[arr(8), None])
    with pytest.raises(ValueError, match=r"rank 1: residual: dtype float16, expected float32"):
        call(x, comm, residual=[arr((3, 8)), arr((3, 8), np.float16)])
    with pytest.raises(ValueError, match=r"rank 0: residual is \(8, 3\), expected \(3, 8\)"):
        call(x, comm, residual=[arr((8, 3)), arr((8, 3))])
    with pytest.raises(ValueError, match="C-contiguous 1-D"):
        call([np.float32(1)] * 2, comm, scale=2)
    with pytest.raises(ValueError, match="path"):
        call(x, comm, scale=2, path="fast")
    with pytest.raises(ValueError, match="out_dtype 'int8'"):
        call(x, comm, scale=2, out_dtype="int8")


def test_epilogue_words_are_the_interpreters():
    """The small kernels read the interpreter's GC3_EPW_* words (kernels/epilogue.cuh, load_epi)."""
    from runtime_cuda.core import abi, tables
    w = ep.words(["scale", "bias", "residual"], 0.5, 4096, 4, [0x1000, 0x2000], [0x3000, 0])
    assert len(w) == 2 and all(len(r) == abi.C["GC3_CMP_PTRS"] for r in w)
    assert w[0][abi.C["GC3_EPW_BIAS"]] == 0x1000 and w[1][abi.C["GC3_EPW_RESIDUAL"]] == 0
    assert np.uint64(w[0][abi.C["GC3_EPW_SCALE"]]).view(np.float64) == 0.5
    shape = w[0][abi.C["GC3_EPW_SHAPE"]]
    codes = [(shape >> 48 >> (4 * i)) & 15 for i in range(3)]
    assert shape & 0xFFFFFFFF == 4096 and (shape >> 32) & 0xFFFF == 4
    assert codes == [abi.C["GC3_EPI_SCALE"], abi.C["GC3_EPI_BIAS"], abi.C["GC3_EPI_RESIDUAL"]]
    assert ep.words(["bias"], None, 8, 2, [1], [0])[0][abi.C["GC3_EPW_SCALE"]] == \
        int(np.float64(1.0).view(np.uint64))
    assert tables.pack_epilogue(["scale"], 2.0, 0, 2, 0, 0) == ep.words(["scale"], 2.0, 0, 2, [0], [0])[0]


def test_kernel_choice_by_size():
    from gc3 import limits
    assert ep.fits_kernel(limits.SMALL_ALLREDUCE_MAX_BYTES // 2, "bfloat16")
    assert not ep.fits_kernel(limits.SMALL_ALLREDUCE_MAX_BYTES // 4 + 1, "float32")
    # two ranks: one-shot throughout; more: two-shot from a crossover that moves down with n
    assert {ep.kernel_kind(b, 2) for b in (1, 64 << 10, limits.SMALL_ALLREDUCE_MAX_BYTES)} == {"oneshot"}
    assert ep.kernel_kind(4 << 10, 4) == "oneshot" and ep.kernel_kind(1 << 20, 4) == "twoshot"
    assert ep.kernel_kind(256 << 10, 8) == "twoshot"
    assert 64 << 10 <= ep._twoshot_from(4) <= 512 << 10
