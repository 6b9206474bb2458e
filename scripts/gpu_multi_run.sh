#!/usr/bin/env bash
# The multi-GPU runs (multigpu tests, fuzz, tune, bench, peers, fused, torch), one process per GPU, in stages that each fit one device
# command (at most 10 minutes).  Summary lines and tables go to ${OUT:-.}.
# Usage (project root, N GPUs): bash scripts/gpu_multi_run.sh N STAGE [fuzz seconds]
#   multigpu  the tests that need >= 2 GPUs (the one-GPU part of the suite runs on any GPU)
#   suite1    the GPU suite, first half (torch, small allreduce, epilogue, fused, dtypes, virtual)
#   suite2    the GPU suite, the rest
#   fuzz      differential fuzz against NCCL (default catalog, then every sample and library algorithm as LL128),
#             and the training-style loop
#   bench     gc3 bench through the drop-in (5 collectives, 1 KiB - 1 GiB, default catalog)
#   tune      gc3 tune, full grid in bf16 (the calls' type), 1 KiB - 1 GiB, within a 7-minute budget (every
#             collective on 4x H100 took 5.5 min in float32; sizes past the budget go to NCCL, listed as
#             unmeasured; pieces tuned apart with -c join with `gc3 catalog merge`), the catalog, its IRs and
#             its plot tarred into $OUT/tune.tgz (a folder of many files does not come back whole)
#   peers     gc3 bench against default and symmetric-window NCCL in one run, and the host
#             time per call
#   fused     gc3 tune --fused then gc3 bench --fused (quick grid) through torch
#   torch     the torch example with backend nccl and gc3
# Order when time is short (most at stake first): multigpu, fuzz, tune, bench, peers, fused, torch.
# On 2x H200 (2026-11-23): multigpu 2.8-3.3 min, fuzz ~5 min, tune 2.3 min, bench 3 min, peers 2.5 min
# (1 KiB - 64 MiB; an alltoall sweep to 1 GiB against NCCL-sym alone: 26 s), fused 3 min, torch 0.5 min.
set -u
N=${1:?number of GPUs}; STAGE=${2:?stage (multigpu, suite1, suite2, fuzz, tune, bench, peers, fused, torch)}; T=${3:-240}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
O=${OUT:-.}
# Processes are not pinned: mpirun's default binds each rank to one core, so a rank's
# launches and its host-side waits would compete for it.
MPI="mpirun --bind-to none -np $N"
FIRST="tests/test_torch_backend.py tests/test_small_allreduce.py tests/test_epilogue.py tests/test_epilogue_gpu.py
       tests/test_fused_gpu.py tests/test_int_dtypes.py tests/test_runtime_virtual.py"
# Whole outputs in $O (tracebacks, and the slowest tests: where the suite's device time goes).
PYTEST="python3 -m pytest -q -p no:cacheprovider --tb=short --durations=25"
nvidia-smi -L; nvidia-smi topo -m | head -$((N + 2))
case "$STAGE" in
multigpu)
  timeout 560 $PYTEST -m multigpu tests/ > $O/gpu_multigpu.txt 2>&1; grep -E "passed|failed|^FAILED|^ERROR" $O/gpu_multigpu.txt ;;
suite1)
  timeout 570 $PYTEST -m "gpu or multigpu" $FIRST > $O/gpu_suite1.txt 2>&1; grep -E "passed|failed|^FAILED|^ERROR" $O/gpu_suite1.txt ;;
suite2)
  ign=""; for f in $FIRST; do ign="$ign --ignore=$f"; done
  timeout 570 $PYTEST -m "gpu or multigpu" $ign tests/ > $O/gpu_suite2.txt 2>&1; grep -E "passed|failed|^FAILED|^ERROR" $O/gpu_suite2.txt ;;
fuzz)
  F="-m runtime_cuda.commands.fuzz"
  timeout $((T + 60)) $MPI python3 $F --calls 1000000 --seed 100 --time-budget $T --record $O/fuzz.txt 2>&1 \
    | grep -E "^rank|^fuzz|^coverage|^NCCL|HANG|minimal|^  #" | head -40
  python3 -m runtime_cuda catalog protocol --ranks $N --protocol LL128 -o /tmp/ll128.json > /dev/null && \
  GC3_CONFIG=/tmp/ll128.json timeout $((T / 2 + 60)) $MPI python3 $F --calls 1000000 --seed 200 \
    --time-budget $((T / 2)) --record $O/fuzz_ll128.txt 2>&1 | grep -E "^rank|^fuzz|^coverage|HANG|minimal|^  #" | head -40
  timeout 200 $MPI python3 scripts/bench_train_loop.py --steps 200 2>&1 | tail -12 | tee $O/train_loop.txt ;;
tune)
  mkdir -p /tmp/tune
  # The budget leaves the 10-minute command time to compile, prove and write what was measured.
  timeout 560 $MPI python3 -m runtime_cuda tune -d bfloat16 -e 1G --time-budget 420 -o /tmp/tune/catalog.json \
    --plot /tmp/tune/tune.png \
    2>&1 | tail -40 \
    | tee $O/tune.log
  tar czf $O/tune.tgz -C /tmp tune ;;
bench)
  timeout 420 $MPI python3 -m runtime_cuda bench -c allreduce,allgather,reducescatter,alltoall,broadcast \
    -b 1K -e 1G -f 4 --csv $O/bench.csv --plot $O/bench.png 2>&1 | tail -80 | tee $O/bench.txt ;;
peers)
  timeout 300 $MPI python3 -m runtime_cuda bench --peer symmetric -c allreduce,allgather,reducescatter,alltoall \
    -b 1K -e 64M -f 8 --csv $O/bench_sym.csv 2>&1 | tail -60 | tee $O/bench_sym.txt
  for size in 1KiB 64KiB; do
    timeout 90 $MPI python3 scripts/bench_host_time.py --size $size 2>&1 | tail -8 | tee -a $O/host_time.txt
  done ;;
fused)
  # The fused operators through torch, as users call them: tune writes the measured path per shape
  # into the catalog the drop-in serves on these GPUs, then the benchmark appends its lines ($O/fused.txt).
  TR="torchrun --nproc-per-node $N -m runtime_cuda"
  timeout 250 $TR tune --fused --quick 2>&1 | grep -v "^W1\|OMP_NUM" | tail -60 | tee $O/tune_fused.txt
  timeout 300 $TR bench --fused --quick --record $O/fused.txt 2>&1 | grep -v "^W1\|OMP_NUM" | tail -60 \
    | tee $O/bench_fused.txt ;;
torch)
  # Two rounds each, alternating, of 200 steps: 20 steps of a 2 ms loop cannot tell two backends apart.
  for r in 1 2; do for b in nccl gc3; do
    timeout 120 torchrun --nproc-per-node $N examples/train_tp_dp.py --backend $b --tp $N --steps 200 2>&1 \
      | grep -E "^backend=|Error|error" | tee -a $O/train_tp_dp.txt
  done; done ;;
*)
  echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
