"""Host time of the gc3 torch backend's own Python per call, without a GPU.

    python scripts/bench_torch_host.py [--calls 20000]

Two ranks of `Gc3ProcessGroup` on threads over a HashStore; rank 0's group gets
a communicator whose submit() does nothing, and its tensors count as CUDA ones,
so what is timed is the group's work between torch's call and the
communicator: op and dtype lookup, layout checks, the Work and its future.
torch's own dispatch before the group and the communicator's work after it are
not in it (scripts/bench_host_time.py times the communicator).  Prints the
median of 5 rounds in us per call for all_reduce (SUM and AVG), all_gather
into a tensor and reduce_scatter of a tensor.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class NoopComm:
    def submit(self, *args):
        return "noop"

    def adopt_stream(self, stream):
        pass


def group():
    import torch
    import torch.distributed as dist

    from runtime_cuda.torch_dist.process_group import Gc3ProcessGroup

    store = dist.HashStore()
    pgs = [None, None]

    def make(r):
        pgs[r] = Gc3ProcessGroup(dist.PrefixStore("pg/", store), r, 2, timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pg, cuda = pgs[0], torch.device("cuda", 0)
    pg._comm, pg._device = NoopComm(), cuda
    pg._stream = lambda: 0
    pg._capturing = lambda: True     # a plain future: there is no CUDA here to record an event on
    real = pg._device_of
    pg._device_of = lambda tensors, what, copied=(): (real(tensors, what, copied), cuda)[1]
    return pg


def main() -> int:
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    pg = group()
    x, big = torch.zeros(4096), torch.zeros(8192)
    avg = dist.AllreduceOptions()
    avg.reduceOp = dist.ReduceOp.AVG
    cases = {"all_reduce SUM": lambda: pg.allreduce([x], dist.AllreduceOptions()),
             "all_reduce AVG": lambda: pg.allreduce([x], avg),
             "all_gather_into_tensor": lambda: pg._allgather_base(big, x),
             "reduce_scatter_tensor": lambda: pg._reduce_scatter_base(x, big)}
    print(f"# gc3 torch group, Python per call (us), median of 5 rounds of {args.calls}; torch {torch.__version__}")
    for name, call in cases.items():
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            rounds.append((time.perf_counter() - t0) / args.calls * 1e6)
        print(f"{name:24s} {statistics.median(rounds):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
