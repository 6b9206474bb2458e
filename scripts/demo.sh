#!/usr/bin/env bash
# Set up from scratch, then the main job: compile a ring AllReduce, verify the
# IR, and execute it on the CPU simulator against numpy.  On a machine with a
# CUDA GPU (and cupy), also run it with the interpreter kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
GC3=.venv/bin/gc3
mkdir -p build
$GC3 compile algorithms/allreduce_ring.py 4 -o build/allreduce_ring_4.xml
$GC3 check build/allreduce_ring_4.xml
$GC3 simulate build/allreduce_ring_4.xml --size 1MiB --dtype float32 --op sum
if .venv/bin/python -c 'import cupy, sys; sys.exit(cupy.cuda.runtime.getDeviceCount() < 1)' 2>/dev/null; then
  $GC3 run build/allreduce_ring_4.xml --size 64MiB --dtype float32 --op sum
fi
