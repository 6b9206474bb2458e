"""Symbolic chunk values: what a chunk holds, as a function of the inputs.

Tracing never touches data.  Each slot holds a `Value`, the multiset of input
chunks that were reduced into it: a copied input chunk is one term, a
reduction the union of its operands' terms.  A multiset, not a set, so that a
program that adds the same input twice is caught.  `Value` does not model the
order of a reduction: the reduction ops gc3 supports are commutative and
associative (up to rounding, which the simulator checks on data).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

# (rank, index) of an input chunk, as the user addresses it; (rank, index, op)
# for the index-th output chunk of compute operator `op` (e.g. "gemv") on rank
# `rank`: a leaf produced by a compute step rather than given by the caller.
Term = Tuple

_SHOWN_TERMS = 6


@dataclass(frozen=True)
class Value:
    terms: Tuple[Term, ...]   # sorted

    def __add__(self, other: "Value") -> "Value":
        if not isinstance(other, Value):
            return NotImplemented
        return Value(tuple(sorted(self.terms + other.terms)))

    def __radd__(self, other):
        # lets sum(values) start from 0
        if other == 0:
            return self
        return NotImplemented

    def __str__(self) -> str:
        names = [term_name(t) for t in self.terms]
        if len(names) <= _SHOWN_TERMS:
            return "+".join(names)
        return f"sum of {len(names)} chunks " + "+".join(names[:3]) + "+...+" + names[-1]


def input_chunk(rank: int, index: int) -> Value:
    """The value input chunk `index` of rank `rank` holds before the collective runs."""
    return Value(((rank, index),))


def computed_chunk(rank: int, index: int, op: str) -> Value:
    """The value a compute step of operator `op` produces for output chunk `index` on `rank`."""
    return Value(((rank, index, op),))


def as_computed(v: Value, op: str) -> Value:
    """`v` with each input chunk leaf in(r, i) replaced by the compute leaf op(r, i): a fused
    collective's postcondition is its plain collective's over computed chunks."""
    return Value(tuple((t[0], t[1], op) for t in v.terms))


def term_name(t: Term) -> str:
    return f"in({t[0]},{t[1]})" if len(t) == 2 else f"{t[2]}({t[0]},{t[1]})"


def reduction(values: Iterable[Value]) -> Value:
    """The reduction of `values` (a multiset union of their terms)."""
    terms = []
    for v in values:
        terms.extend(v.terms)   # not tuple +=, which is quadratic in the number of ranks
    return Value(tuple(sorted(terms)))


def reduced_inputs(terms: Iterable[Term]) -> Value:
    """The reduction of input chunks (rank, index): `reduction` of their
    `input_chunk`s, without a Value per chunk (the built-in postconditions
    list n of them for every chunk of n ranks)."""
    return Value(tuple(sorted(terms)))


def describe(value: Optional[Value]) -> str:
    return "uninitialized" if value is None else str(value)


def difference(expected: Value, got: Value) -> str:
    """Which input chunks `got` lacks or has in excess, for error messages."""
    want, have = Counter(expected.terms), Counter(got.terms)
    parts = []
    missing = want - have
    extra = have - want
    if missing:
        parts.append("missing " + ", ".join(_counted(missing)))
    if extra:
        parts.append("extra " + ", ".join(_counted(extra)))
    return "; ".join(parts)


def _counted(c: Counter):
    shown = []
    for t, n in sorted(c.items())[:_SHOWN_TERMS]:
        shown.append(term_name(t) + (f" x{n}" if n > 1 else ""))
    if len(c) > _SHOWN_TERMS:
        shown.append(f"... ({len(c) - _SHOWN_TERMS} more)")
    return shown
