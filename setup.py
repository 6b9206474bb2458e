"""Only what pyproject.toml cannot say: the drop-in's startup hook
(gc3_nccl_hook.pth, runtime_cuda/startup.py) goes into site-packages, for a
wheel and for an editable install alike.  Python runs a .pth file's import
lines at every start, which is how GC3_NCCL=1 alone switches a unchanged
script to gc3."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HOOK = "gc3_nccl_hook.pth"


class BuildPyWithHook(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(HOOK, os.path.join(self.build_lib, HOOK), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        extra = [] if self.editable_mode else [os.path.join(self.build_lib, HOOK)]
        return super().get_outputs(include_bytecode) + extra


class EditableWithHook(editable_wheel):
    # An editable wheel maps packages only; the hook is written into it beside
    # setuptools' own path file.
    def _select_strategy(self, *args, **kwargs):
        inner = super()._select_strategy(*args, **kwargs)
        with open(HOOK, "rb") as f:
            hook = f.read()

        class WithHook:
            def __call__(self, wheel, files, mapping):
                inner(wheel, files, mapping)
                wheel.writestr(HOOK, hook)

            def __enter__(self):
                inner.__enter__()
                return self

            def __exit__(self, *exc):
                return inner.__exit__(*exc)

        return WithHook()


setup(cmdclass={"build_py": BuildPyWithHook, "editable_wheel": EditableWithHook})
