#!/usr/bin/env bash
# Create .venv (if absent) and install gc3 with its test extras into it.
# Sourced by demo.sh and test.sh so both commands work on a fresh machine.
# On a machine with a GPU (nvidia-smi present) whose system python already has
# CuPy or torch, the venv sees the system's packages (--system-site-packages):
# a lent GPU machine has no package registry, and the GPU tests and demo then
# run instead of skipping.  Elsewhere (CI) nothing changes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('cupy') or u.find_spec('torch')))"; then
        echo "setup: GPU found and the system python has CuPy/torch: the venv uses the system's packages"
        "$PY" -m venv --system-site-packages .venv
        # When $PY is itself a venv (the lent machines' python3 is /opt/torch/.venv's), the
        # flag above reaches only the base interpreter's packages: a .pth adds $PY's own.
        site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        mine=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        if [ "$site" != "$mine" ]; then echo "$site" > "$mine/_gc3_system_gpu_packages.pth"; fi
    else
        "$PY" -m venv .venv
    fi
fi
# Without a registry pip cannot upgrade itself; what is installed already serves.
.venv/bin/python -m pip install -q --upgrade pip || echo "setup: pip not upgraded (no registry?); continuing"
.venv/bin/python -m pip install -q -e '.[test]' || .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
# The README's command table uses bare `gc3`: say how to get it on PATH.
echo "setup: done; put gc3 on your PATH with: source .venv/bin/activate"
