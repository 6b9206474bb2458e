"""Collectives: buffer sizes, aliasing, precondition and postcondition.

Sizes follow the block structure of `gc3/ir/layout.py`: with n ranks and chunk
factor c, allgather's output holds n blocks of c chunks, alltoall's input and
output n blocks each, reducescatter's input n blocks and its output one; the
others one block of c chunks per buffer.

In-place collectives alias one user buffer onto the other (`alias`), so the
real allocation is the only one that appears in traced slots, and its size is
the only one declared (`input_chunks`/`output_chunks` give 0 for the aliased
buffer, as msccl-tools' XML does).

A custom collective subclasses `Collective` and overrides `input_size`,
`output_size` (if not c chunks), `precondition(rank, index)` (does input chunk
`index` of `rank` hold data?) and `postcondition(rank, index)` (the `Value`
output chunk `index` of `rank` must hold, or None for "don't care"), built
with `input_chunk` and `reduction` (or `+`).

They sit with the IR, below the DSL, because the verifier and the compiler read
them too (the NCCL collectives' postconditions, a custom one's sizes); users
import them from `gc3.collectives`.
"""
from __future__ import annotations

from itertools import repeat
from typing import Optional, Tuple

from .. import limits
from ..errors import TraceError
from ..units import as_int, user_location
from .epilogue import EpilogueError, make, parse
from .program import ACCUMS, ComputeSpec
from .symbolic import Value, as_computed, computed_chunk, input_chunk, reduced_inputs, reduction

# The collectives NCCL has: their meaning is built into gc3's verifier and
# runtime.  Any other collective carries its postcondition in its IR.
NCCL_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")

__all__ = ["NCCL_COLLECTIVES", "Collective", "AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast", "Reduce",
           "AllToNext", "GemvAllReduce", "EmbeddingBagAllToAll", "GemmReduceScatter", "GemmAllReduce",
           "GemmAllToAll", "AllGatherGemm", "input_chunk", "reduction", "Value"]


class Collective:
    name = "custom"
    root: Optional[int] = None
    # The user buffer an in-place call aliases onto the other one.
    aliased_buffer = "o"

    # gc3.ir.epilogue.Epilogue every specified output chunk gets on top of its value (None: none)
    epilogue = None

    def __init__(self, num_ranks: int, chunk_factor: int = 1, inplace: bool = False, name: Optional[str] = None,
                 epilogue=None, cols: Optional[int] = None):
        num_ranks = as_int(num_ranks, "num_ranks", 1, high=limits.MAX_RANKS, limit="MAX_RANKS")
        chunk_factor = as_int(chunk_factor, "chunk_factor", 1, high=limits.MAX_CHUNKS, limit="MAX_CHUNKS")
        if not isinstance(inplace, bool):
            raise TraceError(f"{user_location()}: inplace must be True or False, got {inplace!r}")
        self.num_ranks = num_ranks
        self.chunk_factor = chunk_factor
        self.inplace = inplace
        if name is not None:
            self.name = name
        if epilogue is not None:
            self.with_epilogue(epilogue, cols)

    def with_epilogue(self, epilogue, cols: Optional[int] = None) -> "Collective":
        """Fuse an elementwise epilogue into the collective (gc3.ir.epilogue): "scale(0.5),bias(b)"
        or a list ["avg", ("bias", "b"), ("residual", "r"), ("cast", "bfloat16")]; `cols`: the
        bias length.  The compiler puts it on the steps that store each final output chunk."""
        where = f"{user_location()}: {type(self).__name__} epilogue"
        try:
            self.epilogue = parse(epilogue, cols, where) if isinstance(epilogue, str) else make(epilogue, cols, where)
        except EpilogueError as exc:
            raise TraceError(str(exc)) from None
        return self

    def __repr__(self) -> str:
        root = "" if self.root is None else f", root={self.root}"
        return (f"{type(self).__name__}(num_ranks={self.num_ranks}, chunk_factor={self.chunk_factor}, "
                f"inplace={self.inplace}{root})")

    # --- sizes ------------------------------------------------------------
    def input_size(self, rank: int) -> int:
        """Chunks of the user's input buffer (as the program addresses it)."""
        return self.chunk_factor

    def output_size(self, rank: int) -> int:
        return self.chunk_factor

    def input_chunks(self, rank: int) -> int:
        """Declared input chunks (MSCCL i_chunks): 0 when in-place aliases it away."""
        return 0 if self.inplace and self.aliased_buffer == "i" else self.input_size(rank)

    def output_chunks(self, rank: int) -> int:
        return 0 if self.inplace and self.aliased_buffer == "o" else self.output_size(rank)

    def size(self, rank: int, buffer: str) -> int:
        return self.input_size(rank) if buffer == "i" else self.output_size(rank)

    # --- aliasing ------------------------------------------------------------
    def alias(self, rank: int, buffer: str, index: int) -> Tuple[str, int]:
        """The real (buffer, index) of user chunk (buffer, index) on `rank`."""
        if self.inplace and buffer == self.aliased_buffer:
            other = "i" if buffer == "o" else "o"
            return other, index + self.alias_offset(rank)
        return buffer, index

    def alias_offset(self, rank: int) -> int:
        return 0

    # --- conditions ------------------------------------------------------------
    def precondition(self, rank: int, index: int) -> bool:
        """Whether input chunk `index` of `rank` holds data when the collective starts."""
        return True

    def postcondition(self, rank: int, index: int) -> Optional[Value]:
        raise TraceError(f"{user_location()}: collective {self.name!r} ({type(self).__name__}) defines no postcondition(rank, index)")

    def every_rank(self, index: int) -> Value:
        """The reduction of input chunk `index` of every rank, made once per index
        (a verifier asks for it once per rank and chunk: n^2 c terms otherwise)."""
        cache = self.__dict__.setdefault("_every_rank", {})
        value = cache.get(index)
        if value is None:
            value = cache[index] = reduced_inputs(zip(range(self.num_ranks), repeat(index)))
        return value

    def _root(self, root) -> int:
        root = as_int(root, "root", 0)
        if root >= self.num_ranks:
            raise TraceError(f"{user_location()}: root {root} is not a rank of {self.num_ranks}")
        return root


class AllReduce(Collective):
    name = "allreduce"

    def postcondition(self, rank, index):
        return self.every_rank(index)


class AllGather(Collective):
    name = "allgather"
    aliased_buffer = "i"

    def output_size(self, rank):
        return self.num_ranks * self.chunk_factor

    def alias_offset(self, rank):
        return rank * self.chunk_factor

    def postcondition(self, rank, index):
        src, j = divmod(index, self.chunk_factor)
        return input_chunk(src, j)


class ReduceScatter(Collective):
    name = "reducescatter"

    def input_size(self, rank):
        return self.num_ranks * self.chunk_factor

    def alias_offset(self, rank):
        return rank * self.chunk_factor

    def postcondition(self, rank, index):
        return self.every_rank(rank * self.chunk_factor + index)


class AllToAll(Collective):
    name = "alltoall"

    def input_size(self, rank):
        return self.num_ranks * self.chunk_factor

    def output_size(self, rank):
        return self.num_ranks * self.chunk_factor

    def postcondition(self, rank, index):
        src, j = divmod(index, self.chunk_factor)
        return input_chunk(src, rank * self.chunk_factor + j)


class Broadcast(Collective):
    name = "broadcast"

    def __init__(self, num_ranks, chunk_factor=1, inplace=False, root=0):
        super().__init__(num_ranks, chunk_factor, inplace)
        self.root = self._root(root)

    def precondition(self, rank, index):
        # Only the root's send buffer is read by NCCL's broadcast.
        return rank == self.root

    def postcondition(self, rank, index):
        return input_chunk(self.root, index)


class Reduce(Collective):
    name = "reduce"

    def __init__(self, num_ranks, chunk_factor=1, inplace=False, root=0):
        super().__init__(num_ranks, chunk_factor, inplace)
        self.root = self._root(root)

    def postcondition(self, rank, index):
        if rank != self.root:
            return None
        return self.every_rank(index)


class AllToNext(Collective):
    """Rank i's input goes to rank i+1's output; the last rank sends nothing and
    rank 0's output is left as it was (msccl-tools' pipeline collective)."""

    name = "alltonext"

    def precondition(self, rank, index):
        return rank != self.num_ranks - 1

    def postcondition(self, rank, index):
        return None if rank == 0 else input_chunk(rank - 1, index)


class _Fused:
    """What a fused collective adds to its plain one (mixed in before it): `compute`
    (the operator's gc3.ir.ComputeSpec), whose split axis is cut into `blocks`
    blocks of `per_chunk` units, block k being what the plain collective calls
    input chunk k; no chunk is given by the caller (compute steps fill them), and
    the postcondition is the plain one's with compute leaves op(r, k) in place of
    in(r, k)."""

    compute = None
    per_chunk = 1

    def _declare(self, spec, where: str) -> None:
        axis, length, _ = spec.split()
        self.blocks = sum(spec.splits) if spec.splits else self.input_size(0)
        if length % self.blocks:
            raise TraceError(f"{where}: the {spec.op} operator's {length} {axis}s do not split into {self.blocks} "
                             f"chunks (chunk_factor={self.chunk_factor}): a chunk must hold whole {axis}s")
        self.compute, self.per_chunk = spec, length // self.blocks

    def precondition(self, rank, index):
        return False      # the caller gives the operator's inputs, not chunks: compute steps fill the buffer

    def postcondition(self, rank, index):
        cache = self.__dict__.setdefault("_computed", {})
        if (rank, index) not in cache:
            v = super().postcondition(rank, index)
            cache[(rank, index)] = None if v is None else as_computed(v, self.compute.op)
        return cache[(rank, index)]

    def span(self, index: int, count: int = 1):
        """The split-axis range [col0, col1) of blocks index..index+count-1."""
        return index * self.per_chunk, (index + count) * self.per_chunk


def _float_dtype(dtype, op: str, where: str) -> str:
    from ..dtypes import dtype_info

    info = dtype_info(dtype)
    if not info.is_float:
        raise TraceError(f"{where}: {op} computes in floating point; dtype {info.name} is not")
    return info.name


class GemvAllReduce(_Fused, AllReduce):
    """A fused GEMV + AllReduce (row-parallel linear layer at decode): rank r
    holds x_r [batch, K_shard] and its weight shard w_r [K_shard, N]; every rank
    ends with y = sum_r x_r @ w_r in its output.

    The buffer holds y in column blocks (`gc3.ir.ComputeSpec`): chunk j is
    y[:, j*N/c:(j+1)*N/c] row-major, c = chunk_factor.  No chunk holds data
    when the collective starts: each is produced by a `gemv(rank, ...)` step
    (its leaf gemv(rank, j)) and then sent, reduced and copied like any chunk,
    so the postcondition is AllReduce's with gemv leaves in place of inputs.
    In place by default: the compute writes the output buffer directly."""

    def __init__(self, num_ranks, chunk_factor=1, batch=1, k_shard=128, n_out=128, dtype="bfloat16",
                 inplace=True):
        super().__init__(num_ranks, chunk_factor, inplace)
        where = user_location()
        batch = as_int(batch, "batch", 1, where)
        k_shard = as_int(k_shard, "k_shard", 1, where)
        n_out = as_int(n_out, "n_out", 1, where)
        if n_out % self.chunk_factor:
            raise TraceError(f"{where}: n_out={n_out} is not a multiple of chunk_factor={self.chunk_factor}: "
                             f"each chunk must hold a whole column block of y")
        self._declare(ComputeSpec("gemv", _float_dtype(dtype, "a gemv", where),
                                  (("x", (batch, k_shard)), ("w", (k_shard, n_out)))), where)

    def __repr__(self) -> str:
        batch, k, n = self.compute.gemv_dims()
        return (f"GemvAllReduce(num_ranks={self.num_ranks}, chunk_factor={self.chunk_factor}, batch={batch}, "
                f"k_shard={k}, n_out={n}, dtype={self.compute.dtype!r}, inplace={self.inplace})")

    def columns(self, index: int, count: int = 1):
        """Output columns [col0, col1) of y that chunks index..index+count-1 hold."""
        return self.span(index, count)


class EmbeddingBagAllToAll(_Fused, AllToAll):
    """A fused embedding-bag + AllToAll (DLRM table-wise sharding, TorchRec's
    PooledEmbeddingsAllToAll): rank r holds T tables [rows, dim] (`dtype`), and for
    the global batch of B = N*b samples, per table, `pooling` indices a sample on
    average: indices [T, B*pooling] and offsets [T, B+1] (int32, CSR bags).

    Rank r pools (sum) its tables for every sample, pooled_r [B, T*dim], and rank
    p ends with the rows of its own b samples from every rank.  Layout: rank r's
    input buffer is pooled_r row-major, so input chunk p*c + i (c = chunk_factor)
    is samples p*b + i*b/c .. of it; rank p's output chunk r*c + i is rank r's
    input chunk p*c + i (plain AllToAll), so p's output is [N, b, T*dim]: rank-major,
    then sample, then table t's dim values.  TorchRec's [b, N*T*dim] (sample-major,
    then rank r's tables in rank order) is output.reshape(N, b, T*dim)
    .transpose(1, 0, 2).reshape(b, N*T*dim); the simulator's reference is this
    output buffer.  No chunk is given: `embedding_bag(rank, ...)` steps compute
    them (leaf ebag(rank, k) for input chunk k) anywhere, e.g. into scratch,
    and they are sent like any chunk."""

    def __init__(self, num_ranks, chunk_factor=1, tables=2, rows=64, dim=16, batch=4, pooling=4,
                 dtype="float32"):
        super().__init__(num_ranks, chunk_factor, False)
        where = user_location()
        t, rows, dim, b, pooling = (as_int(v, name, 1, where) for v, name in
                                    ((tables, "tables"), (rows, "rows"), (dim, "dim"), (batch, "batch"),
                                     (pooling, "pooling")))
        if b % self.chunk_factor:
            raise TraceError(f"{where}: batch={b} (samples per rank) is not a multiple of chunk_factor="
                             f"{self.chunk_factor}: each chunk must hold whole samples")
        total = self.num_ranks * b
        self._declare(ComputeSpec("ebag", _float_dtype(dtype, "an embedding bag", where),
                                  (("tables", (t, rows, dim)), ("indices", (t, total * pooling)),
                                   ("offsets", (t, total + 1))),
                                  (("indices", "int32"), ("offsets", "int32"))), where)

    def __repr__(self) -> str:
        t, rows, dim, nnz, total = self.compute.ebag_dims()
        return (f"EmbeddingBagAllToAll(num_ranks={self.num_ranks}, chunk_factor={self.chunk_factor}, tables={t}, "
                f"rows={rows}, dim={dim}, batch={total // self.num_ranks}, pooling={nnz // total}, "
                f"dtype={self.compute.dtype!r})")


class _Gemm(_Fused):
    """A fused GEMM + collective: rank r holds a_r [M, K] and b_r [K, N] (`dtype`,
    fp32 accumulation) and its partial product C_r = a_r @ b_r [M, N] is the plain
    collective's input, row-major and split by rows (`gc3.ir.ComputeSpec` gemm): input
    chunk k is rows k*M/B .. (k+1)*M/B, B the collective's input chunks.  `gemm(rank, ...)`
    steps produce them (leaf gemm(rank, k)), and they are sent, reduced and copied like any
    chunk, so the postcondition is the plain collective's over gemm leaves.

    accum "float32" (the default of the reductions): the compute stores its fp32
    accumulator and the buffers are float32, so the cross-rank sum is carried in fp32 and
    rounded to `dtype` once, by the caller, as cuBLAS + NCCL-in-fp32 would; "" rounds every
    stored value to `dtype` (per hop)."""

    def _declare_gemm(self, m, k, n, dtype, accum: str, where: str, splits=()) -> None:
        m, k, n = (as_int(v, name, 1, where) for v, name in ((m, "m"), (k, "k"), (n, "n")))
        if accum not in ("",) + ACCUMS:
            raise TraceError(f"{where}: accum={accum!r}: expected '' (round per hop) or one of {', '.join(ACCUMS)}")
        self._declare(ComputeSpec("gemm", _float_dtype(dtype, "a gemm", where), (("a", (m, k)), ("b", (k, n))),
                                  accum=accum, splits=splits), where)

    def __repr__(self) -> str:
        m, k, n = self.compute.gemm_dims()
        return (f"{type(self).__name__}(num_ranks={self.num_ranks}, chunk_factor={self.chunk_factor}, m={m}, "
                f"k={k}, n={n}, dtype={self.compute.dtype!r}, accum={self.compute.accum!r})")

    def rows(self, index: int, count: int = 1):
        """Rows [r0, r1) of C that input chunks index..index+count-1 hold."""
        return self.span(index, count)


class GemmReduceScatter(_Gemm, ReduceScatter):
    """GEMM + ReduceScatter (row-parallel linear, sequence parallel): a_r [M, K/n], b_r
    [K/n, N]; rank p ends with rows p*M/n .. (p+1)*M/n of sum_r a_r @ b_r ([M/n, N]).
    Input chunk p*c + i (c = chunk_factor) is row block i of rank p's slice."""

    def __init__(self, num_ranks, chunk_factor=1, m=64, k_shard=32, n=32, dtype="bfloat16", accum="float32"):
        super().__init__(num_ranks, chunk_factor, False)
        self._declare_gemm(m, k_shard, n, dtype, accum, user_location())


class GemmAllReduce(_Gemm, AllReduce):
    """GEMM + AllReduce (row-parallel linear without sequence parallelism): a_r [M, K/n],
    b_r [K/n, N]; every rank ends with sum_r a_r @ b_r [M, N].  Chunk j is row block j.
    In place: the compute writes the output buffer directly."""

    def __init__(self, num_ranks, chunk_factor=1, m=64, k_shard=32, n=32, dtype="bfloat16", accum="float32"):
        super().__init__(num_ranks, chunk_factor, True)
        self._declare_gemm(m, k_shard, n, dtype, accum, user_location())


class GemmAllToAll(_Gemm, AllToAll):
    """GEMM + AllToAll (expert-parallel combine): rank r computes a_r @ b_r [M, N]; its
    row slice p (M/n rows, c chunks) goes to rank p, which holds [n, M/n, N] rank-major
    (plain AllToAll: output chunk r*c + i of rank p is rank r's input chunk p*c + i).
    No reduction, so each value is rounded to `dtype` once, by the GEMM (accum "").

    `splits` (rows for each rank, summing to M): a skewed split.  The largest slice is c
    chunks of R rows; every buffer keeps the equal grid of n slices of c chunks, slice p
    holding splits[p]/R of them (ComputeSpec.splits), the rest padding the IR leaves
    unspecified (its <postcondition> lists the chunks that matter)."""

    def __init__(self, num_ranks, chunk_factor=1, m=64, k=32, n=32, dtype="bfloat16", splits=None):
        super().__init__(num_ranks, chunk_factor, False)
        where = user_location()
        self.states_postcondition = splits is not None    # padding is unspecified: the IR says which
        blocks = () if splits is None else self._blocks_of(splits, as_int(m, "m", 1, where), where)
        self._declare_gemm(m, k, n, dtype, "", where, blocks)

    def _blocks_of(self, splits, m: int, where: str):
        """Row blocks per destination of a skewed split given in rows: the largest slice is
        chunk_factor chunks of R rows, R dividing every slice."""
        rows = [as_int(s, "splits[]", 1, where) for s in splits]
        c = self.chunk_factor
        if len(rows) != self.num_ranks or sum(rows) != m:
            raise TraceError(f"{where}: splits={list(splits)} must give the rows for each of the {self.num_ranks} "
                             f"ranks, summing to m={m}")
        if max(rows) % c or any(s % (max(rows) // c) for s in rows):
            raise TraceError(f"{where}: splits={rows}: the largest slice in chunk_factor={c} chunks makes blocks of "
                             f"{max(rows) / c:g} rows, which must divide every slice")
        return tuple(s // (max(rows) // c) for s in rows)

    def postcondition(self, rank, index):
        if self.compute.splits and index % self.chunk_factor >= self.compute.splits[rank]:
            return None            # padding of a slice shorter than the largest
        return super().postcondition(rank, index)


class AllGatherGemm(Collective):
    """AllGather + GEMM (column-parallel linear with a sequence-parallel input): rank r holds
    A_r [M/n, K] (its input buffer, c row blocks) and b_r [K, N] (N = the rank's N/n
    columns); it ends with C_r = concat_p(A_p) @ b_r [M, N] in its output, n*c row blocks,
    block p*c + i computed from rank p's A block i (`gc3.ir.ComputeSpec` agemm: A and C
    blocks share one chunk grid of R*max(K, N) lanes).  `gemm(rank, "out", j, a=ref)` steps
    compute them from the chunk `ref` that arrived, so the postcondition is output chunk j
    of rank r = agemm(r, j): block j of C made on rank r (with its own b) from A block j.
    A custom collective (name "allgather_gemm"): the IR carries this postcondition.

    return_a: the output also returns the gathered A (torch's fused_all_gather_matmul does by
    default), n*c more chunks after C's: output chunk n*c + j of every rank = A block j as
    the caller gave it, AllGather's postcondition shifted past C (ComputeSpec return_a)."""

    name = "allgather_gemm"

    def __init__(self, num_ranks, chunk_factor=1, m=64, k=32, n=32, dtype="bfloat16", return_a=False):
        super().__init__(num_ranks, chunk_factor, False)
        where = user_location()
        if not isinstance(return_a, bool):
            raise TraceError(f"{where}: AllGatherGemm return_a must be True or False, got {return_a!r}")
        m, k, n = (as_int(v, name, 1, where) for v, name in ((m, "m"), (k, "k"), (n, "n")))
        if m % (self.num_ranks * self.chunk_factor):
            raise TraceError(f"{where}: m={m} rows do not split into {self.num_ranks}*{self.chunk_factor} row "
                             f"blocks (ranks * chunk_factor): a chunk must hold whole rows")
        self.compute = ComputeSpec("agemm", _float_dtype(dtype, "a gemm", where), (("a", (m, k)), ("b", (k, n))),
                                   return_a=return_a)
        self.rows_per_chunk = m // (self.num_ranks * self.chunk_factor)

    def __repr__(self) -> str:
        m, k, n = self.compute.gemm_dims()
        return (f"AllGatherGemm(num_ranks={self.num_ranks}, chunk_factor={self.chunk_factor}, m={m}, k={k}, "
                f"n={n}, dtype={self.compute.dtype!r}" + (", return_a=True)" if self.compute.return_a else ")"))

    @property
    def c_chunks(self) -> int:
        """Output chunks holding C (the gathered A, with return_a, follows them)."""
        return self.num_ranks * self.chunk_factor

    def output_size(self, rank):
        return self.c_chunks * (2 if self.compute.return_a else 1)

    def postcondition(self, rank, index):
        if index >= self.c_chunks:      # the gathered A: block p*c + i is rank p's input chunk i
            return input_chunk(*divmod(index - self.c_chunks, self.chunk_factor))
        return computed_chunk(rank, index, "agemm")
