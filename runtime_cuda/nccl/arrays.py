"""Array-level collectives for new code: cupy arrays in, cupy arrays out.

    y = comm.all_reduce(x, op="sum")            # new array
    comm.all_reduce(x, out=x)                   # in place
    g = comm.all_gather(x)                      # shape (nranks, *x.shape)
    s = comm.reduce_scatter(x)                  # x.shape[0] / nranks rows (flat if it does not divide)
    t = comm.all_to_all(x)                      # block r of x goes to rank r
    comm.broadcast(x, root=0)                   # in place unless out= is given
    r = comm.reduce(x, root=0, op="max")        # meaningful on the root only

Every call takes `stream=` (a cupy Stream, or None for cupy's current stream)
and goes through the same selection as the pointer API.  `broadcast` and
`reduce` share their names with cupy.cuda.nccl's pointer methods: the
communicator sends a call whose first argument is an array here
(`is_array`), and one whose first argument is an address to the pointer form.
"""
from __future__ import annotations

from gc3.errors import CommunicatorError

from .constants import code_of_dtype, code_of_op


def is_array(args, kwargs) -> bool:
    """Whether a broadcast/reduce call is the array form (x first) or cupy's pointer form."""
    if "x" in kwargs:
        return True
    return bool(args) and hasattr(args[0], "__cuda_array_interface__")


class ArrayCollectives:
    # Provided by the communicator: _submit, _size, _rank.

    def _check(self, name: str, a, what: str) -> None:
        if not getattr(a, "flags", None) or not a.flags.c_contiguous:
            raise CommunicatorError(f"rank {self._rank}: {name}: {what} must be a C-contiguous cupy array")

    def _prepare(self, name, x, out, out_shape):
        import cupy
        self._check(name, x, "x")
        try:
            code = code_of_dtype(x.dtype)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self._rank}: {name}: {exc}") from None
        if out is None:
            out = cupy.empty(out_shape, dtype=x.dtype)
        self._check(name, out, "out")
        want = 1
        for n in out_shape:
            want *= n
        if out.dtype != x.dtype or out.size != want:
            raise CommunicatorError(f"rank {self._rank}: {name}: out must be {want} elements of {x.dtype}, "
                                    f"got {out.size} of {out.dtype}")
        return code, out

    def _op(self, name, op):
        try:
            return code_of_op(op)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self._rank}: {name}: {exc}") from None

    @staticmethod
    def _stream(stream) -> int:
        import cupy
        return (stream if stream is not None else cupy.cuda.get_current_stream()).ptr

    def _blocks(self, name, x):
        if x.size % self._size:
            raise CommunicatorError(f"rank {self._rank}: {name}: x has {x.size} elements, "
                                    f"not a multiple of {self._size} ranks")
        if x.ndim and x.shape[0] % self._size == 0:
            return (x.shape[0] // self._size,) + tuple(x.shape[1:])
        return (x.size // self._size,)

    def all_reduce(self, x, op="sum", out=None, stream=None):
        code, out = self._prepare("all_reduce", x, out, x.shape)
        self._submit("allreduce", x.data.ptr, out.data.ptr, x.size, code, self._op("all_reduce", op),
                     self._stream(stream))
        return out

    def all_gather(self, x, out=None, stream=None):
        code, out = self._prepare("all_gather", x, out, (self._size,) + tuple(x.shape))
        self._submit("allgather", x.data.ptr, out.data.ptr, x.size, code, None, self._stream(stream))
        return out

    def reduce_scatter(self, x, op="sum", out=None, stream=None):
        code, out = self._prepare("reduce_scatter", x, out, self._blocks("reduce_scatter", x))
        self._submit("reducescatter", x.data.ptr, out.data.ptr, x.size // self._size, code,
                     self._op("reduce_scatter", op), self._stream(stream))
        return out

    def all_to_all(self, x, out=None, stream=None):
        self._blocks("all_to_all", x)
        code, out = self._prepare("all_to_all", x, out, x.shape)
        self._submit("alltoall", x.data.ptr, out.data.ptr, x.size // self._size, code, None,
                     self._stream(stream))
        return out

    def array_broadcast(self, x, root=0, out=None, stream=None):
        code, out = self._prepare("broadcast", x, x if out is None else out, x.shape)
        self._submit("broadcast", x.data.ptr, out.data.ptr, x.size, code, None, self._stream(stream), root)
        return out

    def array_reduce(self, x, root=0, op="sum", out=None, stream=None):
        code, out = self._prepare("reduce", x, out, x.shape)
        self._submit("reduce", x.data.ptr, out.data.ptr, x.size, code, self._op("reduce", op),
                     self._stream(stream), root)
        return out
