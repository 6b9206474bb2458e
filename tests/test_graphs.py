"""Calls captured in a user's CUDA graph (cupy `stream.begin_capture` /
`end_capture` on a non-default stream) replay as new calls: on virtual ranks
through LaunchGroup, and on 2 processes sharing one GPU through the drop-in
(tests/gpu_programs/dropin_graph.py).  Inputs change between replays and
eager calls are interleaved, so a replay that reused the captured launch's
epoch or FIFO flags would read the previous replay's data or race it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gc3.compiler.pipeline import lower
from gc3.dsl.program import run_script

ROOT = Path(__file__).resolve().parent.parent
ALGOS = ROOT / "gc3" / "algorithms"
pytestmark = pytest.mark.gpu


def _group(name, ranks, proto, instances=1):
    from runtime_cuda.ranks.virtual import VirtualRanks

    return VirtualRanks(lower(run_script(str(ALGOS / f"{name}.py"), [str(ranks)]), instances=instances,
                              protocol=proto))


def _upload(group, ins, inputs, dtype, stream):
    from runtime_cuda.core.checking import storage_dtype

    for r, a in zip(group.ranks, ins):
        a.set(np.ascontiguousarray(inputs[r]).view(storage_dtype(dtype)), stream=stream)


def _wrong(group, outs, expected, dtype):
    from gc3.dtypes import dtype_info
    from runtime_cuda.core.checking import CheckResult, compare

    res = CheckResult()
    for r, out in zip(group.ranks, outs):
        res.add(compare(r, out.get().view(dtype_info(dtype).np), expected[r], dtype))
    assert res.checked > 0
    return res


def _epochs(group):
    from runtime_cuda.core import abi

    rows = group.executor.rows.get().view(np.uint64).reshape(group.tables.nblocks, -1)
    return rows[:, abi.C["GC3_BKQ_EPOCH"]].copy()


@pytest.mark.parametrize("proto", ["Simple", "LL", "LL128"])
@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_replays_follow_changing_inputs_and_interleave_with_eager_calls(proto, dtype):
    import cupy

    from runtime_cuda.core.checking import device_buffers, reference_case

    group = _group("allreduce_ring", 4, proto)
    prog = group.prog
    n = 4 * (61 * 3 + 1)                  # odd chunk sizes
    inputs, _ = reference_case(prog, n, dtype, "sum", seed=0)
    ins, outs = device_buffers(group, inputs, n, dtype, inplace=False)
    cupy.cuda.Device().synchronize()      # the uploads ran on the default stream; s does not wait for it
    s = cupy.cuda.Stream(non_blocking=True)
    # Captured before any eager call of this shape: its one-time set-up happens during capture.
    s.begin_capture()
    group(ins, outs, op="sum", dtype=dtype, stream=s)
    graph = s.end_capture()
    for it in range(12):
        inputs, expected = reference_case(prog, n, dtype, "sum", seed=it + 1)
        _upload(group, ins, inputs, dtype, s)
        before = _epochs(group)
        if it % 4 == 3:
            group(ins, outs, op="sum", dtype=dtype, stream=s)
        else:
            graph.launch(stream=s)
        s.synchronize()
        group.check()
        res = _wrong(group, outs, expected, dtype)
        assert res.wrong == 0, f"{proto} {dtype} {'eager' if it % 4 == 3 else 'replay'} {it}: {res.first}"
        assert np.all(_epochs(group) == before + 1), "a launch did not advance every block's epoch"


def test_a_graph_of_100_calls_runs_100_calls_per_replay():
    import cupy

    from runtime_cuda.core.checking import device_buffers, reference_case

    group = _group("allreduce_allpairs", 2, "LL")
    prog = group.prog
    n = 2 * 1024
    inputs, expected = reference_case(prog, n, "int32", "sum", seed=3)
    ins, outs = device_buffers(group, inputs, n, "int32", inplace=False)
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    group(ins, outs, op="sum", dtype="int32", stream=s)      # eager first this time
    s.synchronize()
    s.begin_capture()
    for _ in range(100):
        group(ins, outs, op="sum", dtype="int32", stream=s)
    graph = s.end_capture()
    start = _epochs(group)
    for rep in range(3):
        for o in outs:                        # the graph must rewrite them
            o.fill(0)
        cupy.cuda.Device().synchronize()
        graph.launch(stream=s)
        s.synchronize()
        group.check()
        assert np.all(_epochs(group) == start + 100 * (rep + 1))
        res = _wrong(group, outs, expected, "int32")
        assert res.wrong == 0, res.first


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_dropin_graph_capture_on_two_processes_sharing_one_gpu(tmp_path):
    pytest.importorskip("mpi4py")
    from gc3.ir.xml_io import write_xml

    xmls = []
    for name, proto in (("allreduce_ring", "Simple"), ("allreduce_allpairs", "LL128")):
        p = tmp_path / f"{name}_2r_{proto}.xml"
        write_xml(lower(run_script(str(ALGOS / f"{name}.py"), ["2"]), instances=1, protocol=proto), p)
        xmls.append(p)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    for xml in xmls:
        env["GC3_XML_FILES"] = str(xml)
        program = ROOT / "tests" / "gpu_programs" / "dropin_graph.py"
        proc = subprocess.run(["mpirun", "-np", "2", sys.executable, str(program)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        lines = [l for l in out.splitlines() if l.startswith("GRAPH rank")]
        assert len(lines) == 2 and all("wrong: none" in l for l in lines), out[-4000:]
        assert all("NCCL" not in l.split("served")[1] for l in lines), out[-4000:]
