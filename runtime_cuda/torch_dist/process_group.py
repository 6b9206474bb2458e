"""gc3 as a torch.distributed process group, in Python.

Why a ProcessGroup subclass and not a per-device c10d Backend: torch (2.11 and
2.13 alike) binds `c10d.Backend` to Python with no constructor (a subclass
fails with "No constructor defined"), while `ProcessGroup` has a trampoline.
A creator that returns a ProcessGroup replaces the whole group, so for
"cpu:gloo,cuda:gc3" this group owns a gloo backend of its own, registered for
the CPU device: CPU tensors go to it, as they would with the per-device split,
and C++ callers that ask the group for its CPU backend find gloo.

CUDA tensors go to runtime_cuda.nccl's communicator by raw pointer (a tensor's
data_ptr is the zero-copy view DLPack would hand over, without DLPack's
per-call stream handshake), on torch's current stream, so the operation is
ordered with the caller's work like an NCCL call made on that stream.  Every
Work is complete once its call returns: the work is already enqueued on the
current stream.  The communicator is built on the first CUDA call (the device
is known only then), which must therefore be a collective of the whole group.
"""
from __future__ import annotations

import datetime
import socket
from typing import List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions,
                                        AllToAllOptions, BarrierOptions, BroadcastOptions, GatherOptions,
                                        PrefixStore, ProcessGroup, ProcessGroupGloo, ReduceOptions,
                                        ReduceScatterOptions, ScatterOptions, Work, _create_work_from_future)

from gc3.errors import CommunicatorError
from runtime_cuda.nccl.constants import DTYPE_CODES, OP_CODES
from runtime_cuda.nccl.fallback import NoFallback

from . import names

_DTYPES = {torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
           torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
           torch.bfloat16: "bfloat16", torch.bool: "uint8"}
# torch >= 2.3 has uint32/uint64 as limited dtypes (tensors, no arithmetic of their own): gc3 reduces them.
_DTYPES.update({getattr(torch, name): name for name in ("uint32", "uint64") if hasattr(torch, name)})
# Keyed by the op's integer: hashing torch's pybind enum costs about 3 us a lookup, on every call.
_OPS = {int(dist.ReduceOp.SUM): "sum", int(dist.ReduceOp.PRODUCT): "prod", int(dist.ReduceOp.MAX): "max",
        int(dist.ReduceOp.MIN): "min"}
_AVG, _PREMUL_SUM = int(dist.ReduceOp.AVG), int(dist.ReduceOp.PREMUL_SUM)
# bool tensors travel as uint8 (as NCCL's process group sends them), where a sum
# is a logical or and a product a logical and.
_BOOL_OPS = {"sum": "max", "prod": "min"}


def _premul_factor(reduce_op):
    """PREMUL_SUM's scalar factor: torch releases differ in whether the ReduceOp
    shows it as `.factor`; its pickled state (op, factor) has it in those we use."""
    factor = getattr(reduce_op, "factor", None)
    if factor is None and hasattr(reduce_op, "__getstate__"):
        try:
            state = reduce_op.__getstate__()
        except Exception:   # a ReduceOp that cannot be pickled: no factor to read
            state = None
        if isinstance(state, tuple) and len(state) == 2:
            factor = state[1]
    return factor


# In- and output blocks of each collective (for padding), as functions of the rank count.
_BLOCKS = {"allreduce": lambda n: (1, 1), "broadcast": lambda n: (1, 1), "reduce": lambda n: (1, 1),
           "allgather": lambda n: (1, n), "reducescatter": lambda n: (n, 1), "alltoall": lambda n: (n, n)}
_PAD = 256


def _log():
    from runtime_cuda.nccl.log import get_logger
    return get_logger()


class Gc3ProcessGroup(ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._store = store
        self._rank, self._size = rank, size
        self._gloo = ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, timeout)
        self._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, self._gloo)
        self._comm = None
        self._device: Optional[torch.device] = None
        self._splits = None   # the host exchange uneven all-to-all sizes go through
        # (raw stream, capturing) of the last _submit, for the _work that follows it: each costs
        # about a microsecond to ask torch for, and a call needs both twice otherwise.
        self._issued: Optional[tuple] = None

    def getBackendName(self) -> str:
        return names.NAME

    @property
    def served(self):
        """Calls per gc3 algorithm name and "NCCL" (the communicator's tally)."""
        return getattr(self._comm, "served", {})

    # --- the CUDA communicator --------------------------------------------------
    def _cuda(self, tensors, what: str, copied=()):
        """The communicator for these tensors' GPU, built on first use; None when
        they are CPU tensors (gloo's).  Mixed or unsupported tensors raise.
        `copied`: tensors that reach gc3 only through a staging copy (list outputs
        and inputs, as torch's NCCL backend stages them), so may be strided views."""
        device = self._device_of(tensors, what, copied)
        if device.type == "cpu":
            return None
        if self._comm is None:
            self._comm = self._connect(device)
        elif device != self._device:
            raise ValueError(f"gc3 {what}: rank {self._rank}: this group runs on {self._device}, got a tensor on "
                             f"{device}")
        return self._comm

    def _device_of(self, tensors, what: str, copied=()) -> torch.device:
        """The one device of the call's tensors; CUDA tensors must have a dtype NCCL
        has and, but for `copied`, be contiguous."""
        tensors = list(tensors) + list(copied)
        devices = {t.device for t in tensors}
        if len(devices) != 1:
            raise ValueError(f"gc3 {what}: rank {self._rank}: tensors on several devices {sorted(map(str, devices))}")
        device = devices.pop()
        if device.type == "cpu":
            return device
        if device.type != "cuda":
            raise ValueError(f"gc3 {what}: rank {self._rank}: gc3 serves CUDA tensors, got {device}")
        self._check_layout(tensors, what, copied)
        return device

    def _check_layout(self, tensors, what: str, copied=()) -> None:
        staged = {id(t) for t in copied}
        for t in tensors:
            if t.dtype not in _DTYPES:
                raise ValueError(f"gc3 {what}: rank {self._rank}: dtype {t.dtype} is not one NCCL has")
            if not t.is_contiguous() and id(t) not in staged:
                raise ValueError(f"gc3 {what}: rank {self._rank}: tensors must be contiguous")

    def _connect(self, device: torch.device):
        import cupy

        from runtime_cuda.nccl import NcclCommunicator, get_unique_id
        from runtime_cuda.nccl.rendezvous import StoreExchange

        index = device.index if device.index is not None else torch.cuda.current_device()
        self._device = torch.device("cuda", index)
        exchange = StoreExchange(self._store, self._rank, self._size, prefix="gc3/rendezvous")
        self._splits = StoreExchange(self._store, self._rank, self._size, prefix="gc3/splits")
        if self._size == 1:
            return _Solo()     # _submit copies; there is no peer to set anything up with
        with cupy.cuda.Device(index):
            places = exchange.allgather((socket.gethostname(), cupy.cuda.runtime.deviceGetPCIBusId(index)))
            reason = names.no_nccl_reason(places)
            if reason:
                _log().info("gc3 torch backend, rank %d: no NCCL fallback (%s)", self._rank, reason)
                return NcclCommunicator.without_nccl(exchange, index, reason)
            uid = exchange.bcast(get_unique_id() if self._rank == 0 else None)
            _log().info("gc3 torch backend, rank %d: NCCL serves what gc3 does not", self._rank)
            return NcclCommunicator(self._size, uid, self._rank)

    def _get_backend(self, device):
        # torch asks a group for its CUDA backend in Python: init_process_group
        # (device_id=...) reads supports_splitting from it, and teardown, FSDP and
        # the NCCL-specific helpers look for a ProcessGroupNCCL.  gc3 has no C++
        # Backend (c10d.Backend has no Python constructor), so they get a stand-in
        # saying "nothing to split, coalesce or allocate": torch then creates
        # subgroups with new_group, which calls this backend's creator.
        if torch.device(device).type == "cuda":
            return _CudaBackend(self)
        return super()._get_backend(device)

    def _stream(self) -> int:
        # The raw handle straight from torch's C side: current_stream(device) builds a
        # Stream object and parses the device first, about 5 us a call.
        return torch._C._cuda_getCurrentRawStream(self._device.index)

    def _submit(self, comm, coll, send, recv, count, op=None, root=0, padded=False) -> None:
        """One call on contiguous tensors (None where the call has no such buffer)."""
        self._issued = None
        if count == 0:
            return   # nothing moves (NCCL's count-0 calls are no-ops too)
        if self._size == 1 and coll in _BLOCKS:
            # A one-rank group (a DeviceMesh dimension of size 1): every collective
            # is its input, which catalogs hold no program for.
            if send is not None and recv is not None and send.data_ptr() != recv.data_ptr():
                recv.view(-1).copy_(send.view(-1))
            return
        t = send if send is not None else recv
        code = DTYPE_CODES[_DTYPES[t.dtype]]
        if t.dtype == torch.bool and op is not None:
            op = _BOOL_OPS.get(op, op)
        stream, capturing = self._stream(), self._capturing()
        if capturing:
            comm.adopt_stream(stream)
        self._issued = (stream, capturing)
        try:
            comm.submit(coll, 0 if send is None else send.data_ptr(), 0 if recv is None else recv.data_ptr(), count,
                        code, None if op is None else OP_CODES[op], stream, root)
        except NoFallback as exc:
            if padded or coll not in _BLOCKS or count % _PAD == 0:
                raise
            _log().info("gc3 torch backend, rank %d: %s of %d elements padded to a multiple of %d (%s)",
                        self._rank, coll, count, _PAD, exc)
            self._padded(comm, coll, send, recv, count, op, root)

    def _padded(self, comm, coll, send, recv, count, op, root) -> None:
        """The call on blocks padded to a multiple of _PAD elements: gc3's layouts
        divide a buffer into chunks, which an odd count cannot fill.  Every rank
        pads alike (selection depends on the call alone); the padding is zeros,
        and each block's padding lands only in padding."""
        nin, nout = _BLOCKS[coll](self._size)
        width = -(-count // _PAD) * _PAD
        stage_in = send.new_zeros((nin, width))
        stage_in[:, :count] = send.reshape(nin, count)
        stage_out = stage_in if nin == nout == 1 else send.new_empty((nout, width))
        self._submit(comm, coll, stage_in, stage_out, width, op, root, padded=True)
        if coll != "reduce" or self._rank == root:
            recv.reshape(nout, count).copy_(stage_out[:, :count])

    @staticmethod
    def _capturing() -> bool:
        return torch.cuda.is_current_stream_capturing()

    def _reduce_op(self, reduce_op, what: str, dtype: torch.dtype):
        """gc3's op name, and the factor PREMUL_SUM scales the inputs by first (into
        a copy where the input must survive).  AVG is NCCL's own avg op (the drop-in
        applies ncclAvg's rule: integers truncate toward zero), as torch's NCCL
        backend passes it."""
        kind = getattr(reduce_op, "op", reduce_op)
        code = int(kind)
        name = _OPS.get(code)
        if name is not None:
            return name, None
        if code == _AVG:
            if dtype == torch.bool:
                raise ValueError(f"gc3 {what}: rank {self._rank}: ReduceOp.AVG on bool tensors is not defined "
                                 "(torch's NCCL backend refuses it too)")
            return "avg", None
        if code == _PREMUL_SUM:
            factor = _premul_factor(reduce_op)
            if not isinstance(factor, (int, float)):
                raise ValueError(f"gc3 {what}: rank {self._rank}: PREMUL_SUM with a tensor factor is not served")
            return "sum", float(factor)
        raise ValueError(f"gc3 {what}: rank {self._rank}: reduce op {kind} is not served (sum, prod, max, min, "
                         "avg, premul_sum are)")

    def _work(self, result, cuda: bool = True):
        issued, self._issued = self._issued, None
        if cuda and self._device is not None:
            stream, capturing = issued if issued is not None else (self._stream(), self._capturing())
            return _Enqueued(result, self._device.index, stream, capturing)
        return _create_work_from_future(_done(result))

    # --- collectives ------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts=None):
        opts = opts if opts is not None else AllreduceOptions()
        comm = self._cuda(tensors, "allreduce")
        if comm is None:
            return self._gloo.allreduce(tensors, opts)
        for t in tensors:
            op, pre = self._reduce_op(opts.reduceOp, "allreduce", t.dtype)
            if pre is not None:
                t.mul_(pre)
            self._submit(comm, "allreduce", t, t, t.numel(), op)
        return self._work(tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts=None):
        if self._cuda(tensors, "allreduce_coalesced") is None:
            return self._gloo.allreduce_coalesced(tensors, opts or AllreduceCoalescedOptions())
        one = AllreduceOptions()
        if opts is not None:
            one.reduceOp = opts.reduceOp
        return self.allreduce(tensors, one)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        comm = self._cuda([output, input], "all_gather_into_tensor")
        if comm is None:
            return self._gloo._allgather_base(output, input, opts or AllgatherOptions())
        if output.dtype != input.dtype or output.numel() != input.numel() * self._size:
            raise ValueError(f"gc3 all_gather_into_tensor: rank {self._rank}: output needs {self._size} x "
                             f"{input.numel()} {input.dtype} elements, got {output.numel()} {output.dtype}")
        self._submit(comm, "allgather", input, output, input.numel())
        return self._work([output])

    def allgather_into_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts=None):
        # What torch's functional all_gather_tensor (torch.compile) calls, CPU and CUDA alike.
        return self._each(outputs + inputs, outputs,
                          [lambda o=o, i=i: self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)])

    def reduce_scatter_tensor_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts=None):
        # What torch's functional reduce_scatter_tensor (torch.compile) calls.
        return self._each(outputs + inputs, outputs,
                          [lambda o=o, i=i: self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)])

    def _each(self, tensors, result, calls):
        """Several calls as one Work: gloo's (CPU) waited here, gc3's already enqueued."""
        cuda = self._cuda(tensors, "coalesced call") is not None
        for call in calls:
            work = call()
            if not cuda:
                work.wait()
        return self._work(result, cuda)

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts=None):
        flat_outs = [t for group in output_tensors for t in group]
        if self._cuda(input_tensors, "allgather", copied=flat_outs) is None:
            return self._gloo.allgather(output_tensors, input_tensors, opts or AllgatherOptions())
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self._size or any(o.numel() != inp.numel() for o in outs):
                raise ValueError(f"gc3 allgather: rank {self._rank}: needs {self._size} outputs of "
                                 f"{inp.numel()} elements each")
            # Gathered contiguously, then copied out on the same stream (the
            # staging tensor is freed stream-ordered, after the copies).
            staged = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=inp.device)
            self._allgather_base(staged, inp.reshape(-1))
            for r, out in enumerate(outs):
                out.copy_(staged[r * inp.numel():(r + 1) * inp.numel()].view_as(out))
        return self._work(output_tensors)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        comm = self._cuda([output, input], "reduce_scatter_tensor")
        if comm is None:
            return self._gloo._reduce_scatter_base(output, input, opts)
        if output.dtype != input.dtype or input.numel() != output.numel() * self._size:
            raise ValueError(f"gc3 reduce_scatter_tensor: rank {self._rank}: input needs {self._size} x "
                             f"{output.numel()} {output.dtype} elements, got {input.numel()} {input.dtype}")
        op, pre = self._reduce_op(opts.reduceOp, "reduce_scatter", input.dtype)
        if pre is not None:
            input = input * pre
        self._submit(comm, "reducescatter", input, output, output.numel(), op)
        return self._work([output])

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts=None):
        flat_ins = [t for group in input_tensors for t in group]
        if self._cuda(output_tensors, "reduce_scatter", copied=flat_ins) is None:
            return self._gloo.reduce_scatter(output_tensors, input_tensors, opts or ReduceScatterOptions())
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._size or any(i.numel() != out.numel() for i in ins):
                raise ValueError(f"gc3 reduce_scatter: rank {self._rank}: needs {self._size} inputs of "
                                 f"{out.numel()} elements each")
            self._reduce_scatter_base(out, torch.cat([i.reshape(-1) for i in ins]), opts)
        return self._work(output_tensors)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                      input_split_sizes: List[int], opts=None):
        comm = self._cuda([output, input], "all_to_all_single")
        if comm is None:
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes,
                                            opts or AllToAllOptions())
        n = self._size
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise ValueError(f"gc3 all_to_all_single: rank {self._rank}: {input.numel()} input and "
                                 f"{output.numel()} output elements do not split evenly over {n} ranks")
            self._submit(comm, "alltoall", input, output, input.numel() // n)
            return self._work([output])
        ins = list(input_split_sizes) or [input.shape[0] // n] * n
        outs = list(output_split_sizes) or [output.shape[0] // n] * n
        if len(ins) != n or len(outs) != n or sum(ins) != input.shape[0] or sum(outs) != output.shape[0]:
            raise ValueError(f"gc3 all_to_all_single: rank {self._rank}: splits {ins} / {outs} do not cover "
                             f"{input.shape[0]} / {output.shape[0]} rows in {n} parts")
        row = input[0].numel() if input.dim() and input.shape[0] else output[0].numel() if output.shape[0] else 1
        # Uneven splits: every block padded to the largest block of any rank (a
        # host exchange, so not under graph capture), one even all-to-all.
        widest = max(self._splits.allgather(max(ins + outs)))
        send = input.new_zeros((n, widest * row))
        recv = output.new_empty((n, widest * row))
        flat_in, flat_out = input.reshape(-1), output.reshape(-1)
        at = 0
        for peer, rows in enumerate(ins):
            send[peer, :rows * row] = flat_in[at:at + rows * row]
            at += rows * row
        self._submit(comm, "alltoall", send, recv, widest * row)
        at = 0
        for peer, rows in enumerate(outs):
            flat_out[at:at + rows * row] = recv[peer, :rows * row]
            at += rows * row
        return self._work([output])

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts=None):
        """dist.all_to_all: tensor p goes to rank p, output q came from rank q; as one
        all_to_all_single over the flattened lists (sizes may differ per peer)."""
        if self._cuda((), "all_to_all", copied=output_tensors + input_tensors) is None:
            return self._gloo.alltoall(output_tensors, input_tensors, opts or AllToAllOptions())
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"gc3 all_to_all: rank {self._rank}: needs {n} input and {n} output tensors, got "
                             f"{len(input_tensors)} and {len(output_tensors)}")
        if len({t.dtype for t in output_tensors + input_tensors}) != 1:
            raise ValueError(f"gc3 all_to_all: rank {self._rank}: the tensors' dtypes differ")
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        recv = send.new_empty(sum(t.numel() for t in output_tensors))
        self.alltoall_base(recv, send, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors])
        at = 0
        for t in output_tensors:
            t.copy_(recv[at:at + t.numel()].view_as(t))
            at += t.numel()
        return self._work(output_tensors)

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts=None):
        """dist.gather: an all-gather of which only the root keeps the result."""
        opts = opts if opts is not None else GatherOptions()
        flat_outs = [t for group in output_tensors for t in group]
        if self._cuda(input_tensors, "gather", copied=flat_outs) is None:
            return self._gloo.gather(output_tensors, input_tensors, opts)
        if len(input_tensors) != 1:
            raise ValueError(f"gc3 gather: rank {self._rank}: needs one input tensor, got {len(input_tensors)}")
        inp = input_tensors[0]
        root = opts.rootRank
        if self._rank == root and (len(output_tensors) != 1 or len(output_tensors[0]) != self._size
                                   or any(o.numel() != inp.numel() for o in output_tensors[0])):
            raise ValueError(f"gc3 gather: rank {self._rank} (root): needs one list of {self._size} outputs of "
                             f"{inp.numel()} elements each")
        staged = inp.new_empty(self._size * inp.numel())
        self._allgather_base(staged, inp.reshape(-1))
        if self._rank == root:
            for r, out in enumerate(output_tensors[0]):
                out.copy_(staged[r * inp.numel():(r + 1) * inp.numel()].view_as(out))
        return self._work(output_tensors)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts=None):
        """dist.scatter: the root's list broadcast as one tensor, each rank keeping its part."""
        opts = opts if opts is not None else ScatterOptions()
        flat_ins = [t for group in input_tensors for t in group]
        comm = self._cuda((), "scatter", copied=output_tensors + flat_ins)
        if comm is None:
            return self._gloo.scatter(output_tensors, input_tensors, opts)
        if len(output_tensors) != 1:
            raise ValueError(f"gc3 scatter: rank {self._rank}: needs one output tensor, got {len(output_tensors)}")
        out, root = output_tensors[0], opts.rootRank
        k = out.numel()
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size or \
                    any(t.numel() != k for t in input_tensors[0]):
                raise ValueError(f"gc3 scatter: rank {self._rank} (root): needs one list of {self._size} inputs of "
                                 f"{k} elements each")
            whole = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        else:
            whole = out.new_empty(self._size * k)
        self._rooted(comm, "broadcast", whole, whole, None, root)
        out.copy_(whole[self._rank * k:(self._rank + 1) * k].view_as(out))
        return self._work(output_tensors)

    def _rooted(self, comm, coll, send, t, op, root) -> None:
        """A broadcast or reduce; where gc3 has no algorithm for it (catalogs hold
        root-0 programs) and no NCCL stands behind, an all_reduce does the same:
        non-roots contribute zeros to a broadcast (x + 0 is x, but for a zero's sign), and a reduce sums
        into a copy that only the root keeps.  Every rank gets the same refusal
        (selection depends on the call alone), so all take the same path."""
        try:
            self._submit(comm, coll, send, t, t.numel(), op, root=root)
            return
        except NoFallback as exc:
            _log().info("gc3 torch backend, rank %d: %s root %d as an all_reduce (%s)", self._rank, coll, root, exc)
        if coll == "broadcast":
            if self._rank != root:
                t.zero_()
            self._submit(comm, "allreduce", t, t, t.numel(), "sum")
        else:
            acc = send.clone()
            self._submit(comm, "allreduce", acc, acc, acc.numel(), op)
            if self._rank == root:
                t.copy_(acc)

    def broadcast(self, tensors: List[torch.Tensor], opts=None):
        opts = opts if opts is not None else BroadcastOptions()
        comm = self._cuda(tensors, "broadcast")
        if comm is None:
            return self._gloo.broadcast(tensors, opts)
        for t in tensors:
            self._rooted(comm, "broadcast", t, t, None, opts.rootRank)
        return self._work(tensors)

    def reduce(self, tensors: List[torch.Tensor], opts=None):
        opts = opts if opts is not None else ReduceOptions()
        comm = self._cuda(tensors, "reduce")
        if comm is None:
            return self._gloo.reduce(tensors, opts)
        for t in tensors:
            op, pre = self._reduce_op(opts.reduceOp, "reduce", t.dtype)
            # A non-root's tensor is input only: scaled into a copy, so it survives.
            self._rooted(comm, "reduce", t if pre is None else t * pre, t, op, opts.rootRank)
        return self._work(tensors)

    def _p2p(self, kind: str, tensors: List[torch.Tensor], peer: int, tag: int):
        if self._comm is None and tensors and tensors[0].is_cuda:
            raise CommunicatorError(
                f"gc3 {kind}: rank {self._rank}: the first CUDA call of a gc3 group must be a collective of the "
                "whole group (it builds the communicator); call dist.barrier() or a collective first")
        comm = self._cuda(tensors, kind)
        if comm is None:
            fn = self._gloo.send if kind == "send" else self._gloo.recv
            return fn(tensors, peer, tag)
        if peer < 0:
            raise ValueError(f"gc3 {kind}: rank {self._rank}: receiving from any source is not served")
        # NCCL matches point-to-point calls in issue order and has no tags; so does gc3.
        for t in tensors:
            self._submit(comm, kind, t if kind == "send" else None, t if kind == "recv" else None, t.numel(),
                         root=peer)
        return self._work(tensors)

    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0):
        return self._p2p("send", tensors, dstRank, tag)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0):
        return self._p2p("recv", tensors, srcRank, tag)

    def barrier(self, opts=None):
        opts = opts if opts is not None else BarrierOptions()
        device = getattr(opts, "device", None)
        if self._comm is None and device is not None and device.type == "cuda":
            # Every rank is here: the moment to build the communicator for the
            # GPU torch chose for the barrier (so point-to-point calls may follow).
            self._cuda([torch.empty(0, device=device)], "barrier")
        # The GPU work issued so far completes first (NCCL's barrier also waits
        # for the device), then the ranks meet on the host over gloo.
        if self._device is not None:
            torch.cuda.current_stream(self._device).synchronize()
        return self._gloo.barrier(opts)


def _done(result) -> torch.futures.Future:
    """A plain future holding `result` already (no CUDA events)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


class _Enqueued(Work):
    """The Work of a call already enqueued on the caller's current stream.

    Why not a CUDA-aware torch Future: its set_result finds the tensors in the
    result by pickling it and records an event, about 15 us a call on the
    machines we measured, for a wait() that nearly always runs on the same
    stream and so needs nothing.  Here wait() orders the current stream after
    the call's stream only when they differ (recording there at wait time
    covers the call and whatever came after it: later, never wrong), and the
    future is built only when asked for, on the call's stream.  Under graph
    capture the call is in the capturing stream's graph already, as before."""

    def __init__(self, result, device: int, stream: int, captured: bool):
        super().__init__()
        self._result, self._device, self._raw, self._captured = result, device, stream, captured

    def _call_stream(self):
        return torch.cuda.ExternalStream(self._raw, device=torch.device("cuda", self._device))

    def wait(self, timeout=None) -> bool:
        if not self._captured and torch._C._cuda_getCurrentRawStream(self._device) != self._raw:
            torch.cuda.current_stream(self._device).wait_stream(self._call_stream())
        return True

    def is_completed(self) -> bool:
        return True        # enqueued: what follows on the stream runs after it

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def get_future(self):
        if self._captured:
            return _done(self._result)
        # set_result records its event on the current stream: the call's, for this moment.
        # (Set and put back by hand: library code never enters a stream with `with`.)
        before = torch.cuda.current_stream(self._device)
        torch.cuda.set_stream(self._call_stream())
        try:
            fut = torch.futures.Future(devices=[self._device])
            fut.set_result(self._result)
        finally:
            torch.cuda.set_stream(before)
        return fut


class _Solo:
    """The communicator of a one-rank group: never called (see _submit)."""
    served: dict = {}


class _CudaBackend:
    """What Gc3ProcessGroup._get_backend(cuda) answers (see there)."""
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, pg: Gc3ProcessGroup):
        self._pg = pg

    def name(self) -> str:
        return names.NAME

    def rank(self) -> int:
        return self._pg.rank()

    def size(self) -> int:
        return self._pg.size()

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def eager_connect_single_device(self, device) -> None:
        """Nothing now: the communicator is built at the group's first CUDA collective."""


def create(store, rank: int, size: int, timeout: datetime.timedelta) -> Gc3ProcessGroup:
    """The creator torch.distributed calls for backend "gc3"."""
    return Gc3ProcessGroup(store, rank, size, timeout)
