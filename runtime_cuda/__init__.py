"""gc3's CUDA runtime: runs gc3/MSCCL XML IR with an interpreter kernel."""
from pathlib import Path

# The one place that locates files from this package's own path; modules in its subpackages
# name these, never their own __file__, so that moving a module does not move what it finds.
PACKAGE_DIR = Path(__file__).resolve().parent
# The CUDA sources (kernels/*.cu, *.cuh), package data in a wheel too.
KERNEL_DIR = PACKAGE_DIR / "kernels"
# The measured data (benchmark tables and plots, the fuzz and fused lines files) lives
# at the repository root, outside this package: a wheel does not carry it.
MEASURED_DIR = PACKAGE_DIR.parent / "measured"


def measured_file(name: str) -> Path:
    """`name` in the repository's measured/ folder, the default of every record and
    data path; GC3Error naming the folder where it is missing (an installed wheel
    has none: name the file yourself)."""
    if not MEASURED_DIR.is_dir():
        from gc3.errors import GC3Error
        raise GC3Error(f"{MEASURED_DIR}: no measured/ folder here (it is in a gc3 source checkout, "
                       f"not in an installed package); name the file for {name} yourself")
    return MEASURED_DIR / name
