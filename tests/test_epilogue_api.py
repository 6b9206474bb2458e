"""runtime_cuda.fused.allreduce_epilogue on the CPU (no GPU needed): the programs it compiles
(proven, simulated against the unfused reference, built into tables whose flagged rows are the
IR's carrying steps), and its argument checks, on numpy stand-ins for CuPy arrays."""
import numpy as np
import pytest

from gc3.ir.xml_io import to_xml
from gc3.simulator import simulate
from gc3.verify import verify

from fake_gpu import DevArray, install

ep = pytest.importorskip("runtime_cuda.fused.epilogue")
mb = pytest.importorskip("runtime_cuda.fused.memory_bound")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("variant", [1, 2])
@pytest.mark.parametrize("scale,bias,res", [(2.0, False, False), (None, True, False), (None, False, True),
                                            (0.5, True, True)])
def test_programs_of_the_api(n, variant, scale, bias, res):
    from runtime_cuda import abi, tables
    items = ep._items(scale, bias, res)
    prog = mb.fused_program(ep.ALGO, (n, variant, 13 if bias else 0, 0, items), None)
    assert prog.epilogue.items == tuple((k, repr(float(a)) if k == "scale" else a) for k, a in items)
    assert verify(prog).proven > 0
    res_ = simulate(to_xml(prog), count=1001)        # odd: short last chunks
    assert res_.ok, res_.errors
    t = tables.build(prog)
    flagged = sum(bool(row[abi.field("ST", "FLAGS")] & abi.C["GC3_F_EPILOGUE"]) for row in t.steps)
    assert flagged == sum(st.epilogue is not None for g in prog.gpus for tb in g.threadblocks for st in tb.steps)
    assert flagged >= n       # every rank's every output chunk: at least one step per rank


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
