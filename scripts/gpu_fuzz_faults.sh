#!/usr/bin/env bash
# Show that gc3 fuzz catches each root cause in runtime_cuda/core/faults.py when GC3_FAULT puts it back
# (one GPU; virtual ranks and 2 processes sharing it).  Each run must end with mismatches > 0.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
F="-m runtime_cuda.commands.fuzz"
quiet() { grep -v "^---\|^$\|^Primary job\|^a non-zero\|^mpirun detected\|^the job to be\|^  Process name\|^  Exit code"; }
for f in stream-reset stream-order pool-stream; do
  for mode in virtual processes; do
    echo "== GC3_FAULT=$f mode=$mode"
    if [ $mode = virtual ]; then
      GC3_FAULT=$f timeout 150 python3 $F --mode virtual --ranks 2 --calls ${CALLS:-3000} --seed 3 --max-bytes 16777216 --no-minimize 2>&1 | quiet | tail -4
    else
      GC3_FAULT=$f timeout 150 mpirun -np 2 python3 $F --calls ${CALLS:-3000} --seed 3 --max-bytes 16777216 --no-minimize 2>&1 | quiet | tail -4
    fi
  done
done
