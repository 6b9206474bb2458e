"""Which algorithm serves a call: the first catalog candidate, in load order,
whose every condition holds; otherwise NCCL.

The conditions, checked in this order (the first that fails is the reason a
candidate is rejected, and that field is named in the log):

    collective  the IR's coll equals the call's collective
    ranks       the IR's ngpus equals the communicator size
    inplace     an in-place call needs inplace="1"; an out-of-place call needs
                outofplace="1" (XML or config entry), or inplace="0" where
                outofplace is absent
    minBytes    minBytes <= bytes   (bytes = nccl-tests' size column, see Call.nbytes)
    maxBytes    bytes <= maxBytes   (absent = unbounded)
    count       a non-empty call whose input element count divides by the entry's
                count_multiple and that gc3.ir.layout accepts for this rank
    dtype       the entry's dtypes list (absent = any)
    op          the entry's ops list or the IR's redop (reducing collectives only)
    root        broadcast/reduce: the root the IR was built for (default 0)
    runtime     whatever the gc3 runtime itself cannot serve (it says why)

With GC3_DEBUG=INFO a fallback is logged once per (collective, size bucket)
with every rejected candidate and its failed field, and a gc3 algorithm once
per (collective, size bucket, algorithm); GC3_DEBUG=TRACE logs every call.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

from gc3.errors import GC3Error
from gc3.ir.layout import Layout, layout_for

from .call import REDUCING, ROOTED, Call
from .catalog import Candidate, Catalog
from .sizes import bucket_label, size_bucket

# The gc3 runtime's own verdict on a (candidate, call): None when it can run it,
# else a sentence saying why not.
RuntimeCheck = Callable[[Candidate, Call], Optional[str]]

FIELDS = ("collective", "ranks", "inplace", "minBytes", "maxBytes", "count", "dtype", "op", "root", "runtime")


@dataclass(frozen=True)
class Rejection:
    candidate: str
    field: str
    detail: str

    def __str__(self) -> str:
        return f"{self.candidate}: {self.field} ({self.detail})"


@dataclass
class Decision:
    call: Call
    candidate: Optional[Candidate] = None
    layout: Optional[Layout] = None
    rejections: List[Rejection] = field(default_factory=list)

    @property
    def uses_gc3(self) -> bool:
        return self.candidate is not None


def check(cand: Candidate, call: Call, runtime: Optional[RuntimeCheck] = None):
    """A Layout (None for a dedicated kernel) when `cand` serves `call`, else the Rejection
    naming the first failed field."""
    def no(field_name: str, detail: str) -> Rejection:
        return Rejection(cand.name, field_name, detail)

    if cand.collective != call.coll:
        return no("collective", f"IR is {cand.collective}, call is {call.coll}")
    if cand.ranks != call.nranks:
        return no("ranks", f"IR has {cand.ranks} ranks, communicator has {call.nranks}")
    if call.inplace and not cand.serves_inplace:
        return no("inplace", "call is in-place, IR is out-of-place only")
    if not call.inplace and not cand.serves_outofplace:
        return no("inplace", "call is out-of-place, IR is in-place only")
    if call.nbytes < cand.min_bytes:
        return no("minBytes", f"{call.nbytes} B < minBytes {cand.min_bytes}")
    if cand.max_bytes is not None and call.nbytes > cand.max_bytes:
        return no("maxBytes", f"{call.nbytes} B > maxBytes {cand.max_bytes}")
    if call.in_elems == 0:
        return no("count", "the call moves no elements")
    if call.in_elems % cand.count_multiple:
        return no("count", f"{call.in_elems} input elements, not a multiple of {cand.count_multiple}")
    try:
        # A dedicated kernel takes any count: it has no IR chunk layout.
        layout = None if cand.kernel else layout_for(cand.program, call.in_elems, call.rank)
    except (KeyError, GC3Error) as exc:
        return no("count", str(exc))
    if cand.dtypes is not None and call.dtype_name not in cand.dtypes:
        return no("dtype", f"{call.dtype_name} not in {', '.join(sorted(cand.dtypes))}")
    if call.coll in REDUCING and cand.ops is not None and call.op_name not in cand.ops:
        return no("op", f"{call.op_name} not in {', '.join(sorted(cand.ops))}")
    if call.coll in ROOTED:
        root = 0 if cand.root is None else cand.root
        if root != call.root:
            return no("root", f"IR is for root {root}, call has root {call.root}")
    if runtime is not None:
        reason = runtime(cand, call)
        if reason:
            return no("runtime", reason)
    return layout


def select(catalog: Catalog, call: Call, runtime: Optional[RuntimeCheck] = None) -> Decision:
    decision = Decision(call)
    for cand in catalog.candidates:
        verdict = check(cand, call, runtime)
        if isinstance(verdict, Rejection):
            decision.rejections.append(verdict)
            continue
        decision.candidate, decision.layout = cand, verdict
        break
    return decision


class Selector:
    """`select` plus the GC3_DEBUG log, remembering what it has already said.

    Decisions are cached by everything selection reads from a call (not its
    addresses or stream), so a repeated call costs one dictionary lookup."""

    def __init__(self, catalog: Catalog, logger: logging.Logger, runtime: Optional[RuntimeCheck] = None):
        self.catalog = catalog
        self.log = logger
        self.runtime = runtime
        self._said: Set[Tuple] = set()
        self._cache: Dict[Tuple, Decision] = {}

    def choose(self, call: Call) -> Decision:
        key = (call.coll, call.count, call.dtype, call.op, call.root, call.nranks, call.rank, call.inplace)
        hit = self._cache.get(key)
        if hit is not None:
            if self.log.isEnabledFor(logging.DEBUG):
                self._report(hit)
            return Decision(call, hit.candidate, hit.layout, hit.rejections)
        decision = select(self.catalog, call, self.runtime)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = decision
        self._report(decision)
        return decision

    def forget(self) -> None:
        """Drop cached decisions (the runtime's answer changed, e.g. a set-up failed)."""
        self._cache.clear()

    def report_fallback(self, call: Call, reason: str) -> None:
        """Log a fallback decided outside selection (a group with an unsupported member, ...)."""
        key = ("fallback", call.coll, size_bucket(call.nbytes), reason)
        self.log.debug("rank %d: %s -> NCCL: %s", call.rank, call.describe(), reason)
        if key not in self._said and self.log.isEnabledFor(logging.INFO):
            self._said.add(key)
            self.log.info("rank %d: %s (size bucket %s) -> NCCL: %s", call.rank, call.describe(),
                          bucket_label(size_bucket(call.nbytes)), reason)

    def _report(self, d: Decision) -> None:
        call = d.call
        bucket = size_bucket(call.nbytes)
        if d.uses_gc3:
            self.log.debug("rank %d: %s -> gc3 %s", call.rank, call.describe(), d.candidate.name)
            key = ("gc3", call.coll, bucket, d.candidate.name)
        else:
            self.log.debug("rank %d: %s -> NCCL", call.rank, call.describe())
            key = ("fallback", call.coll, bucket)
        if key in self._said or not self.log.isEnabledFor(logging.INFO):
            return
        self._said.add(key)
        where = f"size bucket {bucket_label(bucket)}"
        if d.uses_gc3:
            self.log.info("rank %d: %s (%s) -> gc3 algorithm %s (%s, proto %s, from %s)", call.rank,
                          call.describe(), where, d.candidate.name, d.candidate.path, d.candidate.proto,
                          d.candidate.origin)
        elif not self.catalog.candidates:
            self.log.info("rank %d: %s (%s) -> NCCL: no gc3 algorithm loaded%s", call.rank, call.describe(),
                          where, f" (read {'; '.join(self.catalog.sources)})" if self.catalog.sources else
                          " (set GC3_XML_FILES or GC3_CONFIG)")
        else:
            self.log.info("rank %d: %s (%s) -> NCCL: no gc3 algorithm matches:%s", call.rank, call.describe(),
                          where, "".join(f"\n  {r}" for r in d.rejections))
