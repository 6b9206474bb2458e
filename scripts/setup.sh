#!/usr/bin/env bash
# Create .venv (if absent) and install gc3 with its test extras into it.
# Sourced by demo.sh and test.sh so both commands work on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
