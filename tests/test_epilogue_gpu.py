"""Elementwise epilogues in the CUDA interpreter on a real GPU:

* runtime_cuda.fused.allreduce_epilogue on VirtualComm(2) and VirtualComm(4): every float type,
  each epilogue item alone and all together, odd shapes served by the small kernels' one-shot and
  two-shot epilogue build and, above their limit, by the allreduce then the epilogue pass, fused
  and sequential; integer-valued data, so results are compared bit for bit with the float64
  reference (which differs from the epilogue skipped or applied twice);
  (tests/test_epilogue_kernel_gpu.py: random data, casts, graphs, the shifted-peer control;)
* bf16 random data vs the float64 reference of the same inputs (relative 2e-2);
* the IR under LL and LL128, and avg on int32 and float32 (NCCL's rule);
* the interpreter follows the IR's flags: a carrying step stripped of its epilogue, or a
  non-final `re` given one, comes out wrong;
* 2 processes sharing the GPU (tests/gpu_programs/epilogue_ops.py under mpirun).
"""
import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
# Odd shapes: a few lines; over 64 KiB; over the small kernels' 2 MiB in every type (allreduce + pass).
SHAPES = ((7, 13), (131, 129), (1031, 1030))


def _lower(*args, fusion=True):
    from gc3.algorithms.fused.allreduce_epilogue import allreduce_epilogue
    from gc3.toolchain import lower
    return lower(allreduce_epilogue(*args), instr_fusion=fusion)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("which", ["scale", "bias", "residual", "all"])
def test_api_on_virtual_ranks_bit_exact(n, dtype, which, monkeypatch):
    import cupy
    from epilogue_cases import case, wrong
    from fused_cases import poisoned, to_host
    from runtime_cuda.fused import VirtualComm, allreduce_epilogue, check
    from runtime_cuda.fused import epilogue as ep
    comm = VirtualComm(n)
    s = cupy.cuda.Stream(non_blocking=True)
    paths = ["fused", "sequential"] if which == "all" else ["fused"]
    for i, shape in enumerate(SHAPES):
        xs, scale, bias, res, want, skipped, twice = case(np.random.default_rng([n, i]), n, shape, dtype, which)
        assert all(wrong(skipped[r], want[r]) and wrong(twice[r], want[r]) for r in range(n))
        for path, kind in [(p, k) for p in paths for k in (("oneshot", "twoshot") if p == "fused" else ("-",))]:
            monkeypatch.setattr(ep, "kernel_kind", lambda nbytes, nranks, _k=kind: _k)
            for rep in range(2):     # the second call reuses the cached launch
                outs = [poisoned(shape, dtype) for _ in range(n)]
                got = allreduce_epilogue(xs, comm, scale=scale, bias=bias if bias[0] is not None else None,
                                         residual=res if res[0] is not None else None, out=outs, stream=s, path=path)
                s.synchronize()
                check(comm)
                assert all(g is o for g, o in zip(got, outs))
                for r in range(n):
                    bad = wrong(to_host(outs[r], dtype), want[r])
                    assert bad == 0, f"{path} {kind} {shape} rank {r} call {rep}: {bad} of {want[r].size} wrong"


def test_api_bf16_random_data_within_tolerance():
    import cupy
    from fused_cases import RTOL, poisoned, to_host, values
    from runtime_cuda.fused import VirtualComm, allreduce_epilogue
    n, shape, dtype = 4, (97, 333), "bfloat16"
    rng = np.random.default_rng(16)
    xs = [values(rng, shape, dtype) for _ in range(n)]
    bias = [values(rng, (shape[-1],), dtype) for _ in range(n)]
    res = [values(rng, shape, dtype) for _ in range(n)]
    outs = [poisoned(shape, dtype) for _ in range(n)]
    allreduce_epilogue([x[0] for x in xs], VirtualComm(n), scale=0.25, bias=[b[0] for b in bias],
                       residual=[r[0] for r in res], out=outs, path="fused")
    cupy.cuda.runtime.deviceSynchronize()
    total, mag = sum(x[1] for x in xs), sum(np.abs(x[1]) for x in xs)
    for r in range(n):
        want = total * 0.25 + bias[r][1] + res[r][1]
        bound = RTOL[dtype] * (mag * 0.25 + np.abs(bias[r][1]) + np.abs(res[r][1]))
        got = to_host(outs[r], dtype)
        assert int((~(np.abs(got - want) <= bound)).sum()) == 0, r


def _run_ir(group, xs, named, dtype):
    """One call of an epilogue IR on virtual ranks: outputs (float64 host copies)."""
    import cupy
    from fused_cases import poisoned, to_host
    shape = xs[0].shape
    outs = [poisoned(shape, dtype) for _ in xs]
    names = group.prog.epilogue.names
    group.run_ptrs([x.data.ptr for x in xs], [o.data.ptr for o in outs], xs[0].size, dtype, "sum",
                   epilogue=[tuple(named[k][nm].data.ptr for nm in names) for k in range(len(xs))])
    group.check()
    cupy.cuda.runtime.deviceSynchronize()
    return [to_host(o, dtype) for o in outs]


@pytest.mark.parametrize("proto", ["LL", "LL128"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ir_under_ll_protocols(proto, dtype):
    from epilogue_cases import case, wrong
    from runtime_cuda.ranks.virtual import VirtualRanks
    n, shape = 4, (33, 71)
    xs, scale, bias, res, want, _, _ = case(np.random.default_rng(9), n, shape, dtype, "all")
    items = [("scale", scale), ("bias", "bias"), ("residual", "residual")]
    for variant in (1, 2):
        group = VirtualRanks(_lower(n, variant, shape[-1], 0, items), proto=proto)
        got = _run_ir(group, xs, [{"bias": bias[k], "residual": res[k]} for k in range(n)], dtype)
        assert all(wrong(got[r], want[r]) == 0 for r in range(n)), (variant, [wrong(g, w) for g, w in zip(got, want)])


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_avg_epilogue_is_ncclavg(dtype):
    import cupy
    from gc3.ir.epilogue import avg_divide
    from runtime_cuda.ranks.virtual import VirtualRanks
    n, count = 4, 5003
    rng = np.random.default_rng(4)
    xs = [rng.integers(-100, 100, size=count).astype(dtype) for _ in range(n)]
    xs[0][:4] = [-7, 7, -1, 5]
    for x in xs[1:]:
        x[:4] = 0                               # odd sums of both signs: truncation shows
    want = avg_divide(sum(xs).astype(dtype), n)
    for variant in (1, 2):
        group = VirtualRanks(_lower(n, variant, 0, 0, ["avg"]))
        outs = [cupy.full(count, 99, dtype=dtype) for _ in range(n)]
        group([cupy.asarray(x) for x in xs], outs, dtype=dtype)    # no named inputs: none to pass
        group.check()
        for r, o in enumerate(outs):
            assert np.array_equal(o.get(), want), (variant, r, o.get()[:6], want[:6])


@pytest.mark.parametrize("how", ["stripped", "twice"])
def test_the_interpreter_follows_the_irs_flags(how):
    """Mutated IRs (what the semantic checker refuses) run as written: the output is wrong where
    the epilogue was skipped or applied twice, so the kernel applies it exactly on flagged steps."""
    from epilogue_cases import case, wrong
    from runtime_cuda.ranks.virtual import VirtualRanks
    n, shape, dtype = 4, (5, 40), "float32"
    xs, scale, _, _, want, skipped, twice = case(np.random.default_rng(1), n, shape, dtype, "scale")
    prog = copy.deepcopy(_lower(n, 1, 0, 0, [("scale", scale)], fusion=False))
    carriers = [st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.epilogue]
    if how == "stripped":
        carriers[0].epilogue = None
    else:          # one-shot: a partial `re` into the output gets it too
        extra = next(st for g in prog.gpus for tb in g.threadblocks for st in tb.steps
                     if st.type == "re" and st.epilogue is None)
        extra.epilogue = prog.epilogue
    got = _run_ir(VirtualRanks(prog), xs, [{}] * n, dtype)
    bad = sum(wrong(g, w) for g, w in zip(got, want))
    assert bad > 0, f"{how}: the mutated IR gave the right result"
    # ... and the wrong elements are exactly the skipped / doubled value
    other = skipped if how == "stripped" else None
    if other is not None:
        assert all(np.array_equal(np.where(g == w, o, g), o) for g, w, o in zip(got, want, other))


def test_refusals_on_the_device():
    import cupy
    from gc3.errors import GC3Error
    from runtime_cuda.fused import VirtualComm, allreduce_epilogue
    from runtime_cuda.ranks.virtual import VirtualRanks
    comm = VirtualComm(2)
    x = [cupy.ones((4, 8), cupy.float32) for _ in range(2)]
    with pytest.raises(ValueError, match="out overlaps residual"):
        allreduce_epilogue(x, comm, residual=x, out=x)
    group = VirtualRanks(_lower(2, 2, 8, 0, [("bias", "bias")]))
    with pytest.raises(GC3Error, match="needs the epilogue's inputs"):
        group.run_ptrs([a.data.ptr for a in x], [a.data.ptr for a in x], 32, "float32", "sum")
    with pytest.raises(GC3Error, match="runs as a sum"):
        group.run_ptrs([a.data.ptr for a in x], [a.data.ptr for a in x], 32, "float32", "max",
                       epilogue=[(x[0].data.ptr,), (x[1].data.ptr,)])
    with pytest.raises(GC3Error, match="on integer data"):
        group.run_ptrs([a.data.ptr for a in x], [a.data.ptr for a in x], 32, "int32", "sum",
                       epilogue=[(x[0].data.ptr,), (x[1].data.ptr,)])


# --- processes sharing the GPU ---------------------------------------------------------------------
def test_epilogue_in_two_processes_sharing_the_gpu():
    exe = shutil.which("mpirun")
    assert exe, "mpirun is not on PATH: the multi-process GPU tests need Open MPI"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1", GC3_TIMEOUT_S="60")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [exe, "-np", "2", sys.executable, str(ROOT / "tests" / "gpu_programs" / "epilogue_ops.py")]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert text.count("epilogue_ops ok") == 2, text[-6000:]
