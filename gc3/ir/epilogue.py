"""Elementwise epilogues: what a step applies to the chunks it stores.

CoCoNet's AllReduce + elementwise fusion: `y = allreduce(x); y = cast(y*s + bias + residual)`
done as the reduced chunks are stored, not as a second pass over y.  An epilogue
is an ordered list of items, written `scale(0.25),bias(b),residual(r),cast(bfloat16)`:

  scale(s)     y *= s                         (float dtypes only)
  avg          y = y / nranks, NCCL's ncclAvg rule for the call's dtype (below)
  bias(name)   y += name[e % len(name)]        (a per-column vector: e is the element's
                                                index in the output buffer, row-major)
  residual(n)  y += n[e]                       (a buffer of the output's layout)
  cast(dtype)  the result is delivered in `dtype` (last item; the arithmetic before
               it is done in float64 on the CPU, fp32 or fp64 on the GPU)

Where it lives in the IR (gc3 extension; the root then carries fused="1" so an
MSCCL runtime refuses it): the root's `<epilogue ops=".." cols=".."/>` says what
the collective promises (the postcondition: every specified output chunk holds
epilogue(its reduction)); each step that stores a final chunk carries the same text
in its `epilogue` attribute.  A step applies it to what it stores into its dst
only; what it sends is the raw value, so a receiver applies its own (the
semantic checker proves each output chunk gets it exactly once).

`avg` and MSCCL: MSCCL XML has no avg redop.  A gc3 IR expresses avg as a sum
program (redop absent or "sum") whose final stores carry the `avg` epilogue; a
plain sum program run with op avg (the NCCL drop-in) sums, then divides the
output in a second pass by the same rule.  The rule, as NCCL implements ncclAvg
(enqueue.cc hostToDevRedOp, reduce_kernel.h FuncSumPostDiv): integers sum with
wrap-around, then divide by nranks truncating toward zero (the sum read as signed
for signed types); floats multiply by 1/nranks (NCCL premultiplies each input by
1/nranks rounded to the dtype; gc3 scales the sum once, in the accumulation type:
the same result where sum/n is exact, e.g. integer-valued data and n a power of two).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import GC3Error


class EpilogueError(GC3Error):
    """A malformed epilogue, or one the data cannot take."""


# item -> whether it takes an argument
ITEMS: Dict[str, bool] = {"scale": True, "avg": False, "bias": True, "residual": True, "cast": True}
_ITEM = re.compile(r"^([a-z]+)(?:\(([^()]*)\))?$")


@dataclass(frozen=True)
class Epilogue:
    items: Tuple[Tuple[str, Optional[str]], ...]
    cols: Optional[int] = None      # length of the bias vector (the output's row length); with bias only

    @property
    def text(self) -> str:
        return ",".join(k if a is None else f"{k}({a})" for k, a in self.items)

    def __str__(self) -> str:
        return self.text

    def arg(self, name: str) -> Optional[str]:
        for k, a in self.items:
            if k == name:
                return a
        return None

    @property
    def names(self) -> Tuple[str, ...]:
        """The named inputs it reads (bias, residual), in order."""
        return tuple(a for k, a in self.items if k in ("bias", "residual"))

    @property
    def cast(self) -> Optional[str]:
        return self.arg("cast")

    @property
    def scale(self) -> Optional[float]:
        s = self.arg("scale")
        return None if s is None else float(s)


def parse(text: str, cols: Optional[int] = None, where: str = "epilogue", check_cols: bool = True) -> Epilogue:
    """`scale(0.5),bias(b)` -> Epilogue; EpilogueError naming `where` and the bad item."""
    if not isinstance(text, str) or not text.strip():
        raise EpilogueError(f"{where}: an epilogue is a non-empty list like 'scale(0.5),bias(b)', got {text!r}")
    items = []
    for part in text.split(","):
        m = _ITEM.match(part.strip())
        if not m or m.group(1) not in ITEMS:
            raise EpilogueError(f"{where}: {part.strip()!r} is not an epilogue item (known: "
                                f"{', '.join(k + '(..)' if a else k for k, a in ITEMS.items())})")
        key, arg = m.group(1), m.group(2)
        if ITEMS[key] != (arg is not None and arg != ""):
            raise EpilogueError(f"{where}: {key} {'needs an argument' if ITEMS[key] else 'takes no argument'}, "
                                f"got {part.strip()!r}")
        items.append((key, arg))
    return make(items, cols, where, check_cols)


def make(items, cols: Optional[int] = None, where: str = "epilogue", check_cols: bool = True) -> Epilogue:
    """Validate and build from [(item, arg-or-None), ...] or ["avg", ("scale", 0.5), ...]."""
    norm = []
    for it in items:
        key, arg = (it, None) if isinstance(it, str) else (it[0], None if it[1] is None else str(it[1]))
        if key not in ITEMS:
            raise EpilogueError(f"{where}: unknown epilogue item {key!r} (known: {', '.join(ITEMS)})")
        if ITEMS[key] and not arg:
            raise EpilogueError(f"{where}: {key} needs an argument")
        if key == "scale":
            try:
                v = float(arg)
            except ValueError:
                raise EpilogueError(f"{where}: scale({arg}) is not a number") from None
            if not np.isfinite(v):
                raise EpilogueError(f"{where}: scale({arg}) is not finite")
            arg = repr(v)      # one spelling per value, so texts compare as values
        if key == "cast":
            from ..dtypes import dtype_info
            arg = dtype_info(arg).name
        if key in ("bias", "residual") and not re.match(r"^[A-Za-z_]\w*$", arg):
            raise EpilogueError(f"{where}: {key}({arg}): a named input is an identifier")
        norm.append((key, arg))
    if not norm:
        raise EpilogueError(f"{where}: an empty epilogue")
    keys = [k for k, _ in norm]
    if "cast" in keys and keys.index("cast") != len(keys) - 1:
        raise EpilogueError(f"{where}: cast must be the last item (got {','.join(keys)})")
    if keys.count("cast") > 1:
        raise EpilogueError(f"{where}: more than one cast")
    names = [a for k, a in norm if k in ("bias", "residual")]
    if len(set(names)) != len(names):
        raise EpilogueError(f"{where}: bias and residual inputs must have distinct names, got {names}")
    if check_cols and ("bias" in keys) != (cols is not None):
        raise EpilogueError(f"{where}: cols (the bias length) is given exactly when there is a bias "
                            f"(bias: {'bias' in keys}, cols={cols})")
    if cols is not None and (not isinstance(cols, int) or isinstance(cols, bool) or cols < 1):
        raise EpilogueError(f"{where}: cols must be a positive int, got {cols!r}")
    return Epilogue(tuple(norm), cols)


def avg_divide(x: np.ndarray, nranks: int) -> np.ndarray:
    """NCCL's ncclAvg on an already-summed (wrapped) array: floats x * (1/n) in the
    accumulation type, integers |x| // n with the sign restored (truncation toward zero)."""
    dt = x.dtype
    from ..dtypes import dtype_info
    if dtype_info(dt).is_float:
        return (x.astype(np.float64) * (1.0 / nranks)).astype(dt)
    if np.issubdtype(dt, np.unsignedinteger):
        return x // dt.type(nranks)
    # |x| as unsigned, so the most negative value's magnitude (2**(bits-1)) is representable
    neg = x < 0
    mag = np.where(neg, np.negative(x), x).view(np.dtype(f"u{dt.itemsize}"))
    q = (mag // np.dtype(f"u{dt.itemsize}").type(nranks)).view(dt)
    return np.where(neg, np.negative(q), q).astype(dt)


def apply(epi: Epilogue, tile: np.ndarray, index: np.ndarray, nranks: int,
          inputs: Dict[str, np.ndarray], where: str = "epilogue") -> np.ndarray:
    """The epilogue on values `tile` (the call's dtype) at output elements `index`
    (same shape); `inputs` holds the rank's bias/residual arrays.  Returns the
    values as stored (rounded to cast's dtype, in the tile's dtype)."""
    from ..dtypes import dtype_info
    dt = tile.dtype
    is_float = dtype_info(dt).is_float
    y = tile
    for key, arg in epi.items:
        if key == "avg":
            y = avg_divide(y.astype(dt), nranks)
            continue
        if key == "cast":
            y = np.asarray(y).astype(dtype_info(arg).np)
            continue
        if not is_float:
            raise EpilogueError(f"{where}: {key} on integer data ({dtype_info(dt).name}); only avg and cast are "
                                f"defined for integers")
        y = np.asarray(y, dtype=np.float64)
        if key == "scale":
            y = y * float(arg)
        else:
            arr = inputs.get(arg)
            if arr is None:
                raise EpilogueError(f"{where}: no input named {arg!r} for {key}({arg})")
            arr = np.asarray(arr).reshape(-1)
            if key == "bias":
                if arr.size != epi.cols:
                    raise EpilogueError(f"{where}: bias {arg!r} has {arr.size} elements, the epilogue says cols="
                                        f"{epi.cols}")
                y = y + arr.astype(np.float64)[index % epi.cols]
            else:
                if index.size and index.max() >= arr.size:
                    raise EpilogueError(f"{where}: residual {arg!r} has {arr.size} elements; element "
                                        f"{int(index.max())} of the output is asked for")
                y = y + arr.astype(np.float64)[index]
    # cast rounds once, to the delivered type; the value stays in the call's type for the caller
    return np.asarray(y).astype(out_dtype(epi, dt)).astype(dt)


def reference(epi: Epilogue, reduced: np.ndarray, nranks: int, inputs: Dict[str, np.ndarray]) -> np.ndarray:
    """The unfused epilogue on a whole reduced output buffer, delivered in cast's dtype."""
    out = apply(epi, reduced, np.arange(reduced.size), nranks, inputs)
    return out.astype(out_dtype(epi, reduced.dtype))


def out_dtype(epi: Optional[Epilogue], dtype) -> np.dtype:
    from ..dtypes import dtype_info
    return dtype_info(epi.cast).np if epi is not None and epi.cast else np.dtype(dtype_info(dtype).np)


def make_inputs(epi: Epilogue, out_elems: int, dtype, nranks: int, seed: int = 0) -> list:
    """Per-rank bias/residual arrays of small integers (exact in every float type)."""
    from ..dtypes import dtype_info
    dt = dtype_info(dtype).np
    out = []
    for r in range(nranks):
        rng = np.random.default_rng([seed, r, 16])
        named = {}
        for key, arg in epi.items:
            if key == "bias":
                named[arg] = rng.integers(-8, 9, size=epi.cols).astype(dt)
            elif key == "residual":
                named[arg] = rng.integers(-8, 9, size=out_elems).astype(dt)
        out.append(named)
    return out

