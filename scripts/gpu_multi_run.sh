#!/usr/bin/env bash
# The multi-GPU run of issues 20/21, in the budgeted order, one process per GPU:
#   1. the GPU test suite;  2. the differential fuzz against NCCL (default catalog, then every
#   sample forced to LL128) and the training-style loop.  Summary lines go to ${OUT:-.}.
# Usage (project root, N GPUs): bash scripts/gpu_multi_run.sh N [fuzz seconds]
set -u
N=${1:?number of GPUs}; T=${2:-240}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
O=${OUT:-.}
nvidia-smi -L; nvidia-smi topo -m | head -$((N + 2))
timeout 400 python3 -m pytest -q -p no:cacheprovider -m "gpu or multigpu" tests/ 2>&1 | tail -15 | tee $O/gpu_suite.txt
F=scripts/fuzz_dropin.py
timeout $((T + 60)) mpirun -np $N python3 $F --calls 1000000 --seed 100 --time-budget $T --record $O/fuzz.txt 2>&1 \
  | grep -E "^rank|^fuzz|^coverage|^NCCL|HANG|minimal|^  #" | head -40
python3 scripts/ll128_config.py $N > /tmp/ll128.json && \
GC3_CONFIG=/tmp/ll128.json timeout $((T / 2 + 60)) mpirun -np $N python3 $F --calls 1000000 --seed 200 \
  --time-budget $((T / 2)) --record $O/fuzz_ll128.txt 2>&1 | grep -E "^rank|^fuzz|^coverage|HANG|minimal|^  #" | head -40
timeout 300 mpirun -np $N python3 scripts/bench_train_loop.py --steps 200 2>&1 | tail -12 | tee $O/train_loop.txt
