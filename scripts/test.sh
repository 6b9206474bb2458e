#!/usr/bin/env bash
# Set up a virtual environment from scratch and run the test suite.
# GPU tests (markers gpu/multigpu) skip themselves where cupy finds no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
