#!/usr/bin/env bash
# Set up a virtual environment from scratch and run the test suite.
# GPU tests (markers gpu/multigpu) skip themselves where cupy finds no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
