"""What the `gc3_nccl_hook.pth` file, installed with the package, runs at
interpreter start when GC3_NCCL or GC3_TORCH is in the environment.  GC3_TORCH=1:
torch.distributed's backend="nccl" becomes gc3 (runtime_cuda/torch_dist/hook.py;
torch is not imported here).  GC3_NCCL=1: the drop-in switched
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

try:
    from .torch_dist import hook as _torch_hook
    from .torch_dist import names as _torch_names

    if _torch_names.enabled():
        _torch_hook.install()
except Exception as exc:  # noqa: BLE001 -- startup must go on whatever happened
    print(f"gc3: GC3_TORCH is set but the torch hook could not be installed ({type(exc).__name__}: {exc}); "
          "running on NCCL", file=sys.stderr)
