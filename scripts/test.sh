#!/usr/bin/env bash
# Set up a virtual environment from scratch and run the test suite.
# GPU tests (markers gpu/multigpu) skip themselves where cupy finds no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# torch is optional for users, but the torch backend's glue has CPU tests (gloo and host-memory
# stand-ins) that skip without it, and a skip hides a failure: install it where a registry serves it
# (about 80 s), at the version the GPU machines have, since some tests pin torch's own behaviour
# (2.14 lets monitored_barrier through where 2.11 refuses it).  GC3_SKIP_TORCH=1 leaves it out;
# GC3_TEST_TORCH=VERSION picks another.
if [ "${GC3_SKIP_TORCH:-0}" != 1 ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "test: installing torch ${GC3_TEST_TORCH:-2.11.0} for the torch backend's CPU tests: about 2.7 GB" \
         "to download with its CUDA libraries (about 95 s); GC3_SKIP_TORCH=1 leaves it out"
    .venv/bin/python -m pip install -q -e '.[torch]' "torch==${GC3_TEST_TORCH:-2.11.0}" \
        || echo "test: torch not installed (no registry?); its tests skip"
fi

# The wheel as a user installs it: built from the checkout's files (a stale build/ folder would
# leak into it), installed with --no-deps into a fresh venv that borrows this venv's dependencies
# (no registry needed), and used outside the source tree, where only what the wheel installed can
# be imported: the algorithm library's modules must be there as code, and a fused program of
# gc3.algorithms must compile and verify through the runtime's loader and the installed `gc3`.
wheel_check() {
    local tmp src site installed
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"; trap - RETURN' RETURN
    # setuptools builds wheels itself from 70.1; an older one needs the `wheel` package.  Where
    # neither is here, a registry may serve a newer setuptools; where none does, no wheel can be
    # built, which is said, not failed.
    if ! .venv/bin/python -c "import setuptools.command.bdist_wheel" 2>/dev/null \
            && ! .venv/bin/python -c "import wheel" 2>/dev/null \
            && ! .venv/bin/python -m pip install -q "setuptools>=70.1" >/dev/null 2>&1; then
        echo "test: wheel check NOT RUN: this venv's setuptools cannot build a wheel (70.1 or later can, or the" \
             "wheel package) and no registry served a newer one"
        return 0
    fi
    src="$tmp/src"
    .venv/bin/python - "$src" <<'EOF'
import shutil, subprocess, sys
from pathlib import Path
dest = Path(sys.argv[1])
listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True)
if listed.returncode == 0:
    for rel in filter(None, listed.stdout.decode().split("\0")):
        if Path(rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(rel, dest / rel)
else:   # an exported tree: everything but what setup, builds and runs make
    shutil.copytree(".", dest, ignore=shutil.ignore_patterns(".venv", "build", "dist", "*.egg-info", "__pycache__",
                                                             ".pytest_cache", ".hypothesis"))
EOF
    if ! .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$src" >"$tmp/build.log" 2>&1; then
        tail -n 30 "$tmp/build.log" >&2
        echo "test: wheel check FAILED: building the wheel failed (above)" >&2
        return 1
    fi
    .venv/bin/python -m venv --without-pip "$tmp/venv"
    .venv/bin/python -m pip --python "$tmp/venv/bin/python" install -q --no-deps --no-index "$tmp"/dist/gc3-*.whl
    site=$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    .venv/bin/python -c "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])" \
        | sort -u > "$site/_gc3_test_dependencies.pth"
    mkdir "$tmp/work"
    installed=$(cd "$tmp/work" && env -u PYTHONPATH "$tmp/venv/bin/python" - "$src/gc3/algorithms" <<'EOF'
import sys
from pathlib import Path

import gc3.algorithms
import runtime_cuda
from gc3.ir.xml_io import write_xml
from runtime_cuda.fused.schedule import compiled
from runtime_cuda.nccl import library

prefix = Path(sys.prefix).resolve()
for module in (gc3.algorithms, runtime_cuda):
    where = Path(module.__file__).resolve()
    assert prefix in where.parents, f"{module.__name__} comes from {where}, not from the installed wheel"
source = Path(sys.argv[1])
shipped = set(gc3.algorithms.names()) | set(gc3.algorithms.names("fused"))
written = {p.stem for p in source.glob("[!_]*.py")} | {f"fused.{p.stem}" for p in (source / "fused").glob("[!_]*.py")}
assert shipped == written, f"the wheel's algorithms differ from the checkout's: {sorted(shipped ^ written)}"
assert library.compile_program("allreduce_ring", (4,))[1].coll == "allreduce"
prog = compiled("gemm_all_reduce", 4)        # as the fused operator loads its program: import, lower, prove
assert prog.fused and prog.ngpus == 4
write_xml(prog, "gemm_allreduce_4.xml")
print(Path(gc3.algorithms.__file__).parent / "fused" / "gemv_allreduce.py")
EOF
) || { echo "test: wheel check FAILED: the installed package (above)" >&2; return 1; }
    if ! (cd "$tmp/work" && unset PYTHONPATH && "$tmp/venv/bin/gc3" check -q gemm_allreduce_4.xml \
            && "$tmp/venv/bin/gc3" compile "$installed" 2 -o gemv_allreduce_2.xml \
            && "$tmp/venv/bin/gc3" check -q gemv_allreduce_2.xml) >"$tmp/cli.log" 2>&1; then
        cat "$tmp/cli.log" >&2
        echo "test: wheel check FAILED: the installed gc3 command (above)" >&2
        return 1
    fi
    echo "test: wheel check: $(basename "$tmp"/dist/gc3-*.whl) installed in a fresh venv; from outside the" \
         "checkout, gc3.algorithms.fused compiled and verified (gemm_allreduce through the runtime's loader," \
         "gemv_allreduce through the installed gc3 compile and check)"
}
wheel_check
exec .venv/bin/python -m pytest -q "$@"
