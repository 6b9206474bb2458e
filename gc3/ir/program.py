"""The scheduled IR: Program -> Gpu -> Threadblock -> Step.

This mirrors the MSCCL XML schema one-to-one (attribute names kept) so that
`xml_io` is a plain mapping and a round trip is exact.  Everything that runs an
IR (simulator, CUDA runtime, verifier) reads operands through `local_input` /
`local_output`, never through the raw fields, because the raw fields mean
different things in gc3's XML and in msccl-tools' XML (see `Convention`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .epilogue import Epilogue
from .opcodes import OPCODES, OpcodeInfo

# The three buffers a step may name: input, output, scratch.
BUFFERS = ("i", "o", "s")
PROTOCOLS = ("Simple", "LL", "LL128")


class Convention:
    """How the raw src/dst fields of a step are to be read.

    GC3: every operand is local to the GPU that runs the step.  `s` repeats
    its source in dst, `r`/`rcs` repeat their destination in src, and the
    recv-reduce family (`rrc rrs rrcs`) reduce the received tile with the local
    operand src and store into dst.

    MSCCL (msccl-tools output, recognised by the absence of `gc3version`): a
    receive's src fields hold the *sender's* buffer and offset and a send's dst
    fields the *receiver's*; the recv-reduce family reduce into their own
    destination, so their local operand is dst.
    """

    GC3 = "gc3"
    MSCCL = "msccl"


Operand = Tuple[str, int]  # (buffer, chunk offset); the extent is step.cnt


@dataclass(frozen=True)
class ComputeArgs:
    """What a compute step evaluates: the program's named compute inputs it reads,
    in the operator's order (`ComputeSpec.names`: gemv x, w; ebag tables, indices,
    offsets), and the range [col0, col1) of the operator's split axis
    (`ComputeSpec.axis`: gemv columns of y, ebag samples of the global batch)
    whose results it stores into its dst chunks.  One operand shape for every
    operator, so the XML, the verifier and the simulator read them alike."""

    inputs: Tuple[str, ...]
    col0: int
    col1: int


ACCUMS = ("float32",)       # the types a ComputeSpec's buffers may carry partials in (`accum`)


@dataclass(frozen=True)
class ComputeSpec:
    """The operator of a fused IR (`<compute>`, root `fused="1"`): its kind, the
    element type of its float inputs and output, each named per-rank input's
    shape, and the inputs of another type (`dtypes`: index arrays are int32).

    gemv: inputs x [batch, K] and w [K, N] on every rank (rank r's shard);
    the collective's buffer is y = x @ w, [batch, N], laid out *column block
    by column block*: with c chunks per block, chunk j holds y[:, j*N/c:(j+1)*N/c]
    row-major (batch x N/c elements), so a chunk is one whole column range and
    a compute step writes exactly the chunks of its columns.  For batch 1 that
    is y itself; otherwise y = buffer.reshape(c, batch, N/c).transpose(1, 0, 2).

    ebag (embedding-bag sum, table-wise sharded): tables [T, rows, dim], and for
    the global batch of B samples indices [T, nnz] and offsets [T, B + 1] (int32;
    bag s of table t is indices[t, offsets[t, s]:offsets[t, s + 1]], may be empty).
    pooled[s] = concat_t sum of tables[t, bag] is [B, T*dim]; its buffer is that,
    row-major, so samples [a, b) are one contiguous range (split axis: samples).
    Under AllToAll each rank's input buffer is its own pooled [B, T*dim] (chunk
    p*c + i: samples of rank p's slice); see gc3.collectives.EmbeddingBagAllToAll
    for where they land.

    gemm: inputs a [M, K] and b [K, N] (rank r's operands); the operator's
    result is C = a @ b [M, N], row-major, split by rows: rows [r0, r1) are one
    contiguous range, so a chunk is a whole row block.

    agemm (AllGather + GEMM): a [M, K] is the *gathered* A, of which rank r's
    input buffer holds rows r*M/n .. (r+1)*M/n; b [K, N] is rank r's own.  An
    agemm step reads A row blocks from its src chunks (the ones that arrived)
    and writes those rows of C = a @ b into its dst chunks.  A and C row blocks
    share one chunk grid: a chunk of R rows has R*max(K, N) lanes, holding R
    rows of A (R*K lanes) or of C (R*N lanes) row-major from its start, the
    rest zero padding; the output buffer is C in M/R such chunks.  With
    `return_a` (XML return_a="1" on <compute>) it also returns the gathered A:
    M/R more chunks after C's, chunk M/R + j holding A row block j as the
    caller gave it (a copy, no compute: its postcondition terms name input
    chunks, not agemm leaves; see `output_leaf_kind`).

    accum: what the collective's buffers carry.  "" (gemv, ebag, and the
    default): every stored value is rounded to `dtype`, so a reduction rounds
    at every hop.  "float32" (the GEMM reductions): the compute step
    stores its fp32 accumulator unrounded and the buffers are float32, so the
    cross-rank sum is carried in fp32 and rounded to `dtype` once, when the
    caller takes the output (XML: accum="float32" on <compute>)."""

    op: str
    dtype: str
    inputs: Tuple[Tuple[str, Tuple[int, ...]], ...]
    dtypes: Tuple[Tuple[str, str], ...] = ()      # inputs whose type is not `dtype`
    accum: str = ""
    # gemm under AllToAll with a skewed split: row blocks of C for each destination rank, in
    # rank order (XML: splits="5,1,1,1" on <compute>); () is equal slices.  The buffer keeps
    # AllToAll's grid of n slices of max(splits) chunks, one row block a chunk: block j of C
    # (destination p, i-th of its blocks) is chunk p*max(splits) + i, the rest is padding.
    splits: Tuple[int, ...] = ()
    # agemm only: the output buffer also holds the gathered A after C (see agemm above)
    return_a: bool = False

    def block_chunk(self, block: int) -> int:
        """The buffer chunk of row block `block` of C (itself without `splits`)."""
        if not self.splits:
            return block
        c = max(self.splits)
        for p, s in enumerate(self.splits):
            if block < s:
                return p * c + block
            block -= s
        raise ValueError(f"row block outside the {sum(self.splits)} blocks of the splits {self.splits}")

    def output_leaf_kind(self, chunk: int, nranks: int, chunks_per_rank: int) -> str:
        """What output chunk `chunk` holds in the postcondition: the operator's leaves, or "in"
        (an input chunk as given) for agemm's gathered A, past C's nranks * chunks_per_rank chunks."""
        if self.return_a and chunk >= nranks * chunks_per_rank:
            return "in"
        return self.op

    @property
    def buffer_dtype(self) -> str:
        """The element type of the collective's buffers (and of the steps' tiles)."""
        return self.accum or self.dtype

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        return dict(self.inputs).get(name)

    def input_dtype(self, name: str) -> str:
        return dict(self.dtypes).get(name, self.dtype)

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(name for name, _ in self.inputs)

    def gemv_dims(self) -> Tuple[int, int, int]:
        """(batch, K, N) of a gemv operator; ValueError when its inputs do not say."""
        x, w = self.shape("x"), self.shape("w")
        if self.op != "gemv" or x is None or w is None or len(x) != 2 or len(w) != 2 or x[1] != w[0]:
            raise ValueError(f"a gemv operator needs inputs x [batch, K] and w [K, N]; got {dict(self.inputs)}")
        return x[0], x[1], w[1]

    def ebag_dims(self) -> Tuple[int, int, int, int, int]:
        """(T, rows, dim, nnz, B) of an ebag operator; ValueError when its inputs do not say."""
        t, i, o = self.shape("tables"), self.shape("indices"), self.shape("offsets")
        if (self.op != "ebag" or self.names != ("tables", "indices", "offsets") or len(t) != 3 or len(i) != 2
                or len(o) != 2 or not t[0] == i[0] == o[0] or o[1] < 2
                or self.input_dtype("indices") != "int32" or self.input_dtype("offsets") != "int32"):
            raise ValueError(f"an ebag operator needs inputs tables [T, rows, dim], indices [T, nnz] and offsets "
                             f"[T, B+1] (both int32); got {dict(self.inputs)} typed {dict(self.dtypes)}")
        return t[0], t[1], t[2], i[1], o[1] - 1

    def gemm_dims(self) -> Tuple[int, int, int]:
        """(M, K, N) of a gemm or agemm operator; ValueError when its inputs do not say."""
        a, b = self.shape("a"), self.shape("b")
        if self.op not in ("gemm", "agemm") or self.names != ("a", "b") or len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            raise ValueError(f"a gemm operator needs inputs a [M, K] and b [K, N]; got {dict(self.inputs)}")
        return a[0], a[1], b[1]

    def split(self) -> Tuple[str, int, int]:
        """(axis, length, buffer elements per unit) of the operator's split axis, the one compute
        steps' [col0, col1) index: gemv (column, N, batch); ebag (sample, B, T*dim); gemm (row, M, N).  ValueError
        for an operator this table lacks or inputs it cannot read."""
        if self.op == "gemv":
            batch, _, n = self.gemv_dims()
            return "column", n, batch
        if self.op == "ebag":
            t, _, dim, _, b = self.ebag_dims()
            return "sample", b, t * dim
        if self.op == "gemm":
            m, _, n = self.gemm_dims()
            return "row", m, n
        if self.op == "agemm":
            m, k, n = self.gemm_dims()
            return "row", m, max(k, n)
        raise ValueError(f"unknown compute operator {self.op!r}")

    @property
    def step_inputs(self) -> Tuple[str, ...]:
        """The named inputs a compute step reads (agemm reads its A rows from chunks instead)."""
        return tuple(name for name in self.names if not (self.op == "agemm" and name == "a"))

    def call_elems(self, nranks: int) -> int:
        """Elements of each rank's input buffer in the call the IR describes: the buffer the
        operator fills (gemv, ebag, gemm), or agemm's A rows of the rank, chunk-padded."""
        if self.op == "agemm":
            return self.out_elems // nranks
        return self.out_elems

    @property
    def out_elems(self) -> int:
        """Elements of the collective's buffer the operator fills (gemv: batch * N; ebag: B * T * dim;
        with `splits`, the padded grid)."""
        _, length, unit = self.split()
        if self.splits:
            return len(self.splits) * max(self.splits) * (length // sum(self.splits)) * unit
        return length * unit


# What a collective computes, in the IR's chunks: (rank, output chunk) -> the
# input chunks (rank, index) reduced into it (one: a copy).  Output chunks not
# listed are left unspecified.
Postcondition = Dict[Tuple[int, int], Tuple[Tuple[int, int], ...]]


@dataclass
class Step:
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: bool = False
    compute: Optional[ComputeArgs] = None   # a compute step's operands; None for every other step
    # gc3.ir.epilogue.Epilogue applied to what the step stores into dst (not to what it sends)
    epilogue: Optional["Epilogue"] = None

    @property
    def info(self) -> OpcodeInfo:
        return OPCODES[self.type]


@dataclass
class Threadblock:
    id: int
    send: int = -1
    recv: int = -1
    chan: int = 0
    steps: List[Step] = field(default_factory=list)


@dataclass
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    threadblocks: List[Threadblock] = field(default_factory=list)


@dataclass
class Program:
    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: bool
    gpus: List[Gpu] = field(default_factory=list)
    # Optional attributes: None means "absent from the XML" so MSCCL files
    # that lack them round-trip unchanged.
    outofplace: Optional[bool] = None
    minBytes: Optional[int] = None
    maxBytes: Optional[int] = None
    redop: Optional[str] = None
    gc3version: Optional[str] = None
    # Attributes of <algo> that gc3 does not interpret, kept for round trips.
    extra: Dict[str, str] = field(default_factory=dict)
    # A custom collective's postcondition (<postcondition> in the XML); None
    # for the built-in collectives, whose meaning the verifier knows.
    postcondition: Optional[Postcondition] = None
    # A fused IR's operator (written as <compute> with root fused="1"); None for a plain collective.
    compute: Optional[ComputeSpec] = None
    # What the collective promises on top of its reduction (<epilogue>, root fused="1"):
    # every specified output chunk holds epilogue(its value); None for a plain collective.
    epilogue: Optional["Epilogue"] = None

    @property
    def fused(self) -> bool:
        return self.compute is not None

    @property
    def convention(self) -> str:
        return Convention.GC3 if self.gc3version is not None else Convention.MSCCL

    def ranks_complete(self) -> bool:
        """Whether the <gpu> ids are exactly 0..ngpus-1.  Sized by the <gpu>s
        present, never by ngpus, which may be any number a file claims."""
        return len(self.gpus) == self.ngpus and sorted(g.id for g in self.gpus) == list(range(len(self.gpus)))

    def gpu(self, rank: int) -> Gpu:
        for g in self.gpus:
            if g.id == rank:
                return g
        raise KeyError(f"no <gpu id={rank}> in program {self.name!r}")


def local_input(step: Step, convention: str) -> Optional[Operand]:
    """The local operand a step reads (besides a received tile), or None: its
    opcode's `local_in` role (an accumulator is src in gc3's convention, dst in msccl-tools')."""
    role = step.info.local_in
    if role is None:
        return None
    if role == "acc" and convention != Convention.GC3:
        return (step.dstbuf, step.dstoff)
    return (step.srcbuf, step.srcoff)


def local_output(step: Step, convention: str) -> Optional[Operand]:
    """The local operand a step writes, or None.  `re` also reads it."""
    if step.info.writes:
        return (step.dstbuf, step.dstoff)
    return None


def step_reads(step: Step, convention: str) -> List[Operand]:
    """Every local operand the step reads (for race detection and verification)."""
    ops = []
    src = local_input(step, convention)
    if src is not None:
        ops.append(src)
    if step.info.reads_dst:
        ops.append((step.dstbuf, step.dstoff))
    return ops
