#!/usr/bin/env bash
# A quick pass of the drop-in fuzz on one GPU: virtual ranks, 2 and 4 processes sharing the GPU,
# and the GC3_FAULT switches it must catch.  Run from the project root on a GPU machine with Open MPI.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
F="-m runtime_cuda.commands.fuzz"
# Every NCCL dtype (int8, uint32, uint64 included) has a gc3 build, so the fuzz draws from all of them.
G="--ops sum,prod,max,min"
quiet() { grep -v "^---\|^$\|^Primary job\|^a non-zero\|^mpirun detected\|^the job to be\|^  Process name\|^  Exit code"; }
for n in 2 4 8; do timeout 100 python3 $F --mode virtual --ranks $n --calls ${CALLS:-1000} --seed 1 --max-bytes 33554432 2>&1 | tail -6; done
timeout 120 mpirun -np 2 python3 $F --calls 600 --seed 2 --max-bytes 33554432 2>&1 | quiet | tail -12
timeout 120 mpirun -np 4 python3 $F --calls 400 --seed 2 --max-bytes 33554432 $G --colls allreduce,allgather,reducescatter,alltoall 2>&1 | quiet | tail -12
# Processes, not virtual ranks: one virtual-rank launch fills the GPU, so unordered launches never
# overlap there and the ordering faults cannot show.  Each line must end in a detection.
for f in stream-reset stream-order pool-stream; do
  echo "== fault $f (must be caught)"
  GC3_FAULT=$f timeout 100 mpirun -np 2 python3 $F --calls 3000 --seed 3 --max-bytes 16777216 --no-minimize --hang-s 30 2>&1 | quiet | grep -E "MISMATCH|changed CuPy|HANG|hang in batch|cudaError|^fuzz " | head -3
done
