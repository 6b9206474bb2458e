#!/usr/bin/env bash
# The recorded fuzz runs on ONE GPU: virtual ranks, and 4 and 2 processes sharing the GPU,
# run side by side (timings mean nothing here, ordering bugs do show).  Summary lines go to
# ${OUT:-.}/fuzz_*.txt; `gc3 fuzz --fold FILE...` folds runs of one configuration into the line that
# measured/fuzz.txt keeps.   CALLS_V / CALLS_P scale the runs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
O=${OUT:-.}; F="-m runtime_cuda.commands.fuzz"; V=${CALLS_V:-26000}; P=${CALLS_P:-10000}
pids=()
for s in 1 2 3 4; do
  timeout ${LIMIT:-560} python3 $F --mode virtual --ranks 4 --calls $V --seed $s --max-bytes 67108864 --time-budget ${BUDGET:-300} --record $O/fuzz_v4.txt > /tmp/log_v4_$s.txt 2>&1 & pids+=($!)
done
timeout ${LIMIT:-560} python3 $F --mode virtual --ranks 8 --calls $((V / 2)) --seed 11 --max-bytes 67108864 --time-budget ${BUDGET:-300} --record $O/fuzz_v8.txt > /tmp/log_v8.txt 2>&1 & pids+=($!)
timeout ${LIMIT:-560} mpirun -np 4 python3 $F --calls $P --seed 21 --hang-s 240 --time-budget ${BUDGET:-300} --record $O/fuzz_p4.txt > /tmp/log_p4.txt 2>&1 & pids+=($!)
timeout ${LIMIT:-560} mpirun -np 2 python3 $F --calls $P --seed 31 --hang-s 240 --time-budget ${BUDGET:-300} --record $O/fuzz_p2.txt > /tmp/log_p2.txt 2>&1 & pids+=($!)
rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done
cat $O/fuzz_*.txt; for f in /tmp/log_*.txt; do echo "== $f"; grep -v "^fuzz " $f | tail -4; done
exit $rc
