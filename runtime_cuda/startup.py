"""What the `gc3_nccl_hook.pth` file, installed with the package, runs at
interpreter start when GC3_NCCL is in the environment: the drop-in switched
on by the environment variable alone, for scripts started with plain
`python` or `mpirun python` and no change at all.  Without the variable the
hook imports nothing.  A failure here must never stop the user's program:
it is reported on stderr and the program runs on NCCL."""
import sys

try:
    from . import auto

    if auto.enabled() and not auto.install():
        print("gc3: GC3_NCCL is set but cupy.cuda.nccl is not available; nothing was replaced",
              file=sys.stderr)
except Exception as exc:  # noqa: BLE001 -- startup must go on whatever happened
    print(f"gc3: GC3_NCCL is set but the drop-in could not be installed ({type(exc).__name__}: {exc}); "
          "running on NCCL", file=sys.stderr)
