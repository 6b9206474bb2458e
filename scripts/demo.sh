#!/usr/bin/env bash
# Set up from scratch, then the main job: compile a ring AllReduce, verify the
# IR, and execute it on the CPU simulator against numpy.  Where a CUDA GPU is
# present, also run it with the interpreter kernel (4 virtual ranks on one GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
GC3=.venv/bin/gc3
mkdir -p build
$GC3 compile gc3/algorithms/allreduce_ring.py 4 -o build/allreduce_ring_4.xml
$GC3 check build/allreduce_ring_4.xml
$GC3 simulate build/allreduce_ring_4.xml --size 1MiB --dtype float32 --op sum
if nvidia-smi -L >/dev/null 2>&1; then
  # cupy from the venv (pip install -e '.[cuda]'), else the machine's own python3's.
  if .venv/bin/python -c 'import cupy' 2>/dev/null; then
    $GC3 run build/allreduce_ring_4.xml --size 64MiB --dtype float32 --op sum
  elif python3 -c 'import cupy' 2>/dev/null; then
    PYTHONPATH=$PWD python3 -m runtime_cuda run build/allreduce_ring_4.xml --size 64MiB --dtype float32 --op sum
  else
    echo "a GPU is present but cupy is not installed: .venv/bin/pip install -e '.[cuda]'" >&2
    exit 1
  fi
fi
