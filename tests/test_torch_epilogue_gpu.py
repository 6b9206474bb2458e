"""fused_all_reduce_epilogue on a gc3 group, n processes sharing one GPU
(tests/gpu_programs/torch_epilogue.py): every size, type, cast and term combination against
fp32 and the sequential path, the same bits on every rank, CUDA-graph replay, back-to-back
calls, and the shifted-peer negative control."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "gpu_programs" / "torch_epilogue.py"
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n", [2, 4])
def test_the_fused_epilogue_on_ranks_sharing_one_gpu(n, tmp_path):
    pytest.importorskip("cupy")
    from test_torch_backend import spawn_ranks, tuned_catalog
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC3_TORCH_FALLBACK="0", NCCL_NVLS_ENABLE="0", GC3_TIMEOUT_S="90",
               GC3_CONFIG=str(tuned_catalog(n, tmp_path)), GC3_CACHE_DIR=str(tmp_path / "cache"))
    outs = spawn_ranks([str(PROGRAM)], n, tmp_path, env, says="ALL OK rank={rank}", timeout=600)
    for needed in ("sizes terms torch.bfloat16->torch.bfloat16", "sizes terms torch.float16->torch.float16",
                   "sizes terms torch.float32->torch.float32", "sizes terms torch.float32->torch.bfloat16",
                   "cuda graph replay torch.bfloat16", "cuda graph replay torch.float32->torch.bfloat16",
                   "back to back alternating sizes", "shifted peer (3, 333) fails the check",
                   "shifted peer (1000, 333) fails the check"):
        assert needed in outs[0], f"{needed!r} did not run on rank 0:\n{outs[0][-3000:]}"
