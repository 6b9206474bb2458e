"""Reading and writing the XML IR (MSCCL schema) with lxml.

The writer lays attributes out in msccl-tools' order and indentation so that
an msccl-tools file read and written again is byte-identical.  The reader is
strict: anything it cannot interpret is an `IRFormatError` naming the element,
the attribute and the source line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Union

from lxml import etree

from .. import limits
from ..errors import IRFormatError
from ..units import strict_int
from . import BUFFERS, PROTOCOLS, STEP_TYPES, ComputeArgs, ComputeSpec, Gpu, Postcondition, Program, Step, Threadblock
from .opcodes import COMPUTE
from .program import ACCUMS

# A custom collective's postcondition is one extra child of <algo>, after the
# <gpu>s: MSCCL's hand-written reader looks for <gpu> children by name and
# skips any other element, so a file that carries it still loads there.  Each
# <term> says: output chunks out..out+cnt-1 of `rank` each include input chunk
# in+k of `src` (several terms for one output chunk: a reduction).  Five short
# attributes, far inside MSCCL's attribute count and length bounds.
POSTCONDITION = "postcondition"
_TERM = "term"

# A fused IR (gc3 extension): root attribute fused="1", compute steps
# (`gemv`, `ebag`) with three more attributes (inputs="x,w" col0 col1), and one
# <compute op dtype> child after the <gpu>s declaring each named per-rank input:
# <input name="x" shape="1,2048"/>, with dtype="int32" where it is not the operator's.  MSCCL's runtime would reject the step
# types anyway; fused="1" says so up front, and the reader insists that it,
# the <compute> element and the compute steps come together.
COMPUTE_EL = "compute"
# Elementwise epilogue (gc3.ir.epilogue): <epilogue ops="scale(0.5),bias(b)" cols="N"/> after the
# <gpu>s, and epilogue="..." on each step that stores a final chunk; root fused="1" as well.
EPILOGUE_EL = "epilogue"
_INPUT = "input"
FUSED = "fused"

_ALGO_REQUIRED = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")
_ALGO_OPTIONAL = ("outofplace", "minBytes", "maxBytes", "redop", "gc3version")
# <algo root="r">: a broadcast/reduce's root, which gc3 writes and the drop-in reads; kept in Program.extra.
_ALGO_EXTRA = ("root",)

# Every attribute each element may carry.  The MSCCL ones are all that MSCCL's
# reader and msccl-tools' writers use (<algo>: name proto nchannels nchunksperloop
# ngpus coll inplace outofplace minBytes maxBytes redop); the rest are gc3's.  A
# name outside these is a typo far more often than an extension, and a misspelt
# optional attribute (maxbytes) would otherwise take its default silently.
_ATTRIBUTES = {
    "algo": frozenset(_ALGO_REQUIRED + _ALGO_OPTIONAL + _ALGO_EXTRA + (FUSED,)),
    "gpu": frozenset(("id", "i_chunks", "o_chunks", "s_chunks")),
    "tb": frozenset(("id", "send", "recv", "chan")),
    "step": frozenset(("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep",
                       "inputs", "col0", "col1", "epilogue")),
    POSTCONDITION: frozenset(),
    _TERM: frozenset(("rank", "out", "src", "in", "cnt")),
    COMPUTE_EL: frozenset(("op", "dtype", "accum", "splits", "return_a")),
    _INPUT: frozenset(("name", "shape", "dtype")),
    EPILOGUE_EL: frozenset(("ops", "cols")),
}


def closest(name: str, known, shape: str = "{}") -> str:
    """"; did you mean `x`?" for the known name nearest to `name` (case aside),
    written as `shape` says ("<{}>" for an element), or ""."""
    from difflib import get_close_matches

    by_lower = {k.lower(): k for k in known}
    match = get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean `{shape.format(by_lower[match[0]])}`?" if match else ""


def _known_attributes(el, source: str) -> None:
    known = _ATTRIBUTES[el.tag]
    for name in el.attrib:
        if name not in known:
            raise IRFormatError(f"{source}:{el.sourceline}: `{name}`: unknown attribute of `<{el.tag}>`"
                                + (closest(name, known) or f" (it takes {', '.join(sorted(known)) or 'none'})"))


def _where(el, source: str) -> str:
    return f"{source}:{el.sourceline}: <{el.tag}>"


def _attr(el, name: str, source: str, conv: Callable = str, default=None, required=True):
    raw = el.get(name)
    if raw is None:
        if required:
            raise IRFormatError(f"{_where(el, source)} is missing attribute {name!r}")
        return default
    try:
        return conv(raw)
    except (ValueError, TypeError) as exc:
        raise IRFormatError(f"{_where(el, source)} attribute {name}={raw!r}: {exc}") from None



def _bounded(low: int, high: int) -> Callable[[str], int]:
    def conv(raw: str) -> int:
        return strict_int(raw, low, high)
    return conv


# Integer attributes: ASCII digits only, and bounded (gc3.limits) so that
# nothing downstream allocates or overflows on a hostile value.
_int = _bounded(-1, limits.INT32_MAX)                 # ids, peers, deps, offsets: -1 = none
_chunks = _bounded(0, limits.MAX_CHUNKS)              # buffer sizes
_ranks = _bounded(1, limits.MAX_RANKS)
_channels = _bounded(1, limits.MAX_CHANNELS)
_nbytes = _bounded(0, limits.MAX_BYTES)


def _bool(raw: str) -> bool:
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError("expected 0 or 1")


def _choice(options):
    def conv(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return raw
    return conv


def _int_list(raw: str):
    return tuple(strict_int(v, 1, limits.INT32_MAX) for v in raw.split(","))


def _children(el, tag: str, source: str, also=()):
    out = []
    for child in el:
        if not isinstance(child.tag, str):  # comments, processing instructions
            continue
        if child.tag in also:
            _known_attributes(child, source)
            continue
        if child.tag != tag:
            known = (tag,) + tuple(also)
            raise IRFormatError(f"{source}:{child.sourceline}: `<{child.tag}>`: unknown element inside `<{el.tag}>`"
                                + (closest(str(child.tag), known, "<{}>") or f" (expected <{tag}>)"))
        _known_attributes(child, source)
        out.append(child)
    return out


def _read_compute_args(el, source: str) -> ComputeArgs:
    names = tuple(_attr(el, "inputs", source).split(","))
    col0 = _attr(el, "col0", source, _bounded(0, limits.INT32_MAX))
    col1 = _attr(el, "col1", source, _bounded(0, limits.INT32_MAX))
    if col1 <= col0:
        raise IRFormatError(f"{_where(el, source)} col0={col0} col1={col1}: an empty column range")
    return ComputeArgs(names, col0, col1)


def _read_step(el, source: str) -> Step:
    typ = _attr(el, "type", source, _choice(STEP_TYPES))
    return Step(
        s=_attr(el, "s", source, _int),
        type=typ,
        srcbuf=_attr(el, "srcbuf", source, _choice(BUFFERS)),
        srcoff=_attr(el, "srcoff", source, _int),
        dstbuf=_attr(el, "dstbuf", source, _choice(BUFFERS)),
        dstoff=_attr(el, "dstoff", source, _int),
        cnt=_attr(el, "cnt", source, _int),
        depid=_attr(el, "depid", source, _int, default=-1, required=False),
        deps=_attr(el, "deps", source, _int, default=-1, required=False),
        hasdep=_attr(el, "hasdep", source, _bool, default=False, required=False),
        compute=_read_compute_args(el, source) if typ in COMPUTE else None,
        epilogue=_read_epilogue(el, "epilogue", None, source) if el.get("epilogue") is not None else None,
    )


def _read_epilogue(el, key: str, cols, source: str):
    from .epilogue import EpilogueError, parse
    try:
        # a step's bias length is the root's (cols), filled in by _read_fused
        return parse(el.get(key), cols, where=f"{_where(el, source)} attribute {key}", check_cols=key != "epilogue")
    except EpilogueError as exc:
        raise IRFormatError(str(exc)) from None


def _read_tb(el, source: str) -> Threadblock:
    tb = Threadblock(
        id=_attr(el, "id", source, _int),
        send=_attr(el, "send", source, _int),
        recv=_attr(el, "recv", source, _int),
        chan=_attr(el, "chan", source, _int, default=0, required=False),
    )
    tb.steps = [_read_step(s, source) for s in _children(el, "step", source)]
    for i, st in enumerate(tb.steps):
        if st.s != i:
            raise IRFormatError(f"{source}: <tb id={tb.id}> step number {st.s} at position {i}; steps must be numbered 0,1,2,...")
    return tb


def _read_gpu(el, source: str) -> Gpu:
    g = Gpu(
        id=_attr(el, "id", source, _int),
        i_chunks=_attr(el, "i_chunks", source, _chunks),
        o_chunks=_attr(el, "o_chunks", source, _chunks),
        s_chunks=_attr(el, "s_chunks", source, _chunks),
    )
    g.threadblocks = [_read_tb(t, source) for t in _children(el, "tb", source)]
    return g


def from_element(root, source: str = "<xml>") -> Program:
    if root.tag != "algo":
        raise IRFormatError(f"{_where(root, source)} root element must be <algo>")
    _known_attributes(root, source)
    prog = Program(
        name=_attr(root, "name", source),
        proto=_attr(root, "proto", source, _choice(PROTOCOLS)),
        nchannels=_attr(root, "nchannels", source, _channels),
        nchunksperloop=_attr(root, "nchunksperloop", source, _chunks),
        ngpus=_attr(root, "ngpus", source, _ranks),
        coll=_attr(root, "coll", source),
        inplace=_attr(root, "inplace", source, _bool),
        outofplace=_attr(root, "outofplace", source, _bool, required=False),
        minBytes=_attr(root, "minBytes", source, _nbytes, required=False),
        maxBytes=_attr(root, "maxBytes", source, _nbytes, required=False),
        redop=_attr(root, "redop", source, required=False),
        gc3version=_attr(root, "gc3version", source, required=False),
        extra={k: root.get(k) for k in _ALGO_EXTRA if root.get(k) is not None},
    )
    gpus = _children(root, "gpu", source, also=(POSTCONDITION, COMPUTE_EL, EPILOGUE_EL))
    if len(gpus) > prog.ngpus:
        raise IRFormatError(f"{_where(gpus[prog.ngpus], source)} is <gpu> number {prog.ngpus + 1}, "
                            f"but ngpus={prog.ngpus}")
    prog.gpus = [_read_gpu(g, source) for g in gpus]
    total = sum(g.i_chunks + g.o_chunks + g.s_chunks for g in prog.gpus)
    if total > limits.MAX_TOTAL_CHUNKS:
        raise IRFormatError(f"{source}: the <gpu>s declare {total} chunks in all, more than gc3.limits."
                            f"MAX_TOTAL_CHUNKS={limits.MAX_TOTAL_CHUNKS}")
    posts = root.findall(POSTCONDITION)
    if len(posts) > 1:
        raise IRFormatError(f"{_where(posts[1], source)} a second <{POSTCONDITION}>; at most one")
    if posts:
        prog.postcondition = _read_postcondition(posts[0], source, prog.ngpus)
    _read_fused(root, source, prog)
    return prog


def _read_fused(root, source: str, prog: Program) -> None:
    fused = _attr(root, FUSED, source, _bool, default=False, required=False)
    epis = root.findall(EPILOGUE_EL)
    if len(epis) > 1:
        raise IRFormatError(f"{_where(epis[1], source)} a second <{EPILOGUE_EL}>; at most one")
    if epis:
        if not fused:
            raise IRFormatError(f'{_where(root, source)} has an <{EPILOGUE_EL}> but not {FUSED}="1"')
        cols = epis[0].get("cols")
        prog.epilogue = _read_epilogue(epis[0], "ops", None if cols is None else _attr(epis[0], "cols", source, _int),
                                       source)
    if prog.epilogue is None and any(st.epilogue for g in prog.gpus for tb in g.threadblocks for st in tb.steps):
        raise IRFormatError(f"{source}: steps carry an epilogue but the root has no <{EPILOGUE_EL}>")
    if prog.epilogue is not None:
        from .epilogue import Epilogue
        for st in (st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.epilogue):
            if "bias" in dict(st.epilogue.items):
                st.epilogue = Epilogue(st.epilogue.items, prog.epilogue.cols)
        fused = bool(root.findall(COMPUTE_EL))   # fused="1" is accounted for by the epilogue
    els = root.findall(COMPUTE_EL)
    if len(els) > 1:
        raise IRFormatError(f"{_where(els[1], source)} a second <{COMPUTE_EL}>; at most one")
    steps = [st for g in prog.gpus for tb in g.threadblocks for st in tb.steps if st.compute is not None]
    if fused != bool(els) or (steps and not fused):
        what = "compute steps" if steps else f"<{COMPUTE_EL}>" if els else f'{FUSED}="1"'
        raise IRFormatError(f"{_where(root, source)} has {what} but not all of {FUSED}=\"1\", a <{COMPUTE_EL}> "
                            f"element and compute steps: a fused IR carries the three together")
    if not els:
        return
    el = els[0]
    inputs, dtypes = [], []
    for i in _children(el, _INPUT, source):
        try:
            shape = tuple(strict_int(d, 1, limits.INT32_MAX) for d in _attr(i, "shape", source).split(","))
        except ValueError as exc:
            raise IRFormatError(f"{_where(i, source)} attribute shape={i.get('shape')!r}: {exc}") from None
        inputs.append((_attr(i, "name", source), shape))
        if i.get("dtype") is not None:
            dtypes.append((inputs[-1][0], _attr(i, "dtype", source)))
    spec = ComputeSpec(op=_attr(el, "op", source, _choice(sorted(COMPUTE))),
                       dtype=_attr(el, "dtype", source), inputs=tuple(inputs), dtypes=tuple(dtypes),
                       accum=_attr(el, "accum", source, _choice(ACCUMS), default="", required=False),
                       splits=_attr(el, "splits", source, _int_list, default=(), required=False),
                       return_a=_attr(el, "return_a", source, _bool, default=False, required=False))
    try:
        spec.split()
        if spec.return_a and spec.op != "agemm":
            raise ValueError(f"return_a=\"1\" (the gathered A after C) needs the agemm operator, not {spec.op}")
        if spec.splits and (spec.op != "gemm" or spec.split()[1] % sum(spec.splits)):
            raise ValueError(f"splits={spec.splits} need a gemm whose rows divide into {sum(spec.splits)} blocks")
    except ValueError as exc:
        raise IRFormatError(f"{_where(el, source)} {exc}") from None
    prog.compute = spec


def _read_postcondition(el, source: str, ngpus: int) -> Postcondition:
    post: Dict = {}
    for t in _children(el, _TERM, source):
        vals = {k: _attr(t, k, source, _chunks) for k in ("rank", "out", "src", "in", "cnt")}
        for k, v in vals.items():
            if v < 0 or (k in ("rank", "src") and v >= ngpus) or (k == "cnt" and v < 1):
                want = f"a rank in 0..{ngpus - 1}" if k in ("rank", "src") else "an integer >= 1" if k == "cnt" \
                    else "an integer >= 0"
                raise IRFormatError(f"{_where(t, source)} attribute {k}={t.get(k)!r}: expected {want}")
        for j in range(vals["cnt"]):
            key = (vals["rank"], vals["out"] + j)
            term = (vals["src"], vals["in"] + j)
            terms = post.setdefault(key, set())
            if term in terms:
                raise IRFormatError(f"{_where(t, source)} names input chunk {term} for output chunk {key} twice")
            terms.add(term)
    return {key: tuple(sorted(terms)) for key, terms in post.items()}


def postcondition_terms(post: Postcondition):
    """(rank, out, src, in, cnt) runs covering `post`: consecutive output chunks
    fed by consecutive input chunks of one rank share a term."""
    singles = sorted((r, src, o - i, o) for (r, o), terms in post.items() for src, i in terms)
    runs = []
    for r, src, delta, o in singles:
        last = runs[-1] if runs else None
        if last and last[:2] == [r, src] and last[2] - last[3] == delta and last[2] + last[4] == o:
            last[4] += 1
        else:
            runs.append([r, src, o, o - delta, 1])
    return [(r, o, src, i, cnt) for r, src, o, i, cnt in runs]


def _postcondition_element(post: Postcondition):
    el = etree.Element(POSTCONDITION)
    for r, o, src, i, cnt in postcondition_terms(post):
        etree.SubElement(el, _TERM, {"rank": str(r), "out": str(o), "src": str(src), "in": str(i),
                                     "cnt": str(cnt)})
    return el


def from_xml(text: Union[str, bytes], source: str = "<xml>") -> Program:
    """Parse XML text into a Program; malformed input raises IRFormatError."""
    if isinstance(text, str):
        text = text.encode()
    try:
        root = etree.fromstring(text, parser=etree.XMLParser(remove_blank_text=True, resolve_entities=False))
    except etree.XMLSyntaxError as exc:
        raise IRFormatError(f"{source}:{exc.lineno}: not well-formed XML: {exc.msg}") from None
    return from_element(root, source)


def read_xml(path: Union[str, Path]) -> Program:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise IRFormatError(f"{path}: cannot read: {exc.strerror}") from None
    return from_xml(data, source=str(path))


def _b(v: bool) -> str:
    return "1" if v else "0"


def _algo_attrs(prog: Program) -> Dict[str, str]:
    attrs: Dict[str, str] = {
        "name": prog.name,
        "proto": prog.proto,
        "nchannels": str(prog.nchannels),
        "nchunksperloop": str(prog.nchunksperloop),
        "ngpus": str(prog.ngpus),
        "coll": prog.coll,
        "inplace": _b(prog.inplace),
    }
    if prog.outofplace is not None:
        attrs["outofplace"] = _b(prog.outofplace)
    for key in ("minBytes", "maxBytes", "redop", "gc3version"):
        val = getattr(prog, key)
        if val is not None:
            attrs[key] = str(val)
    if prog.compute is not None or prog.epilogue is not None:
        attrs[FUSED] = "1"
    attrs.update(prog.extra)
    return attrs


def to_element(prog: Program):
    root = etree.Element("algo")
    for k, v in _algo_attrs(prog).items():
        root.set(k, v)
    for g in prog.gpus:
        ge = etree.SubElement(root, "gpu")
        for k in ("id", "i_chunks", "o_chunks", "s_chunks"):
            ge.set(k, str(getattr(g, k)))
        for tb in g.threadblocks:
            te = etree.SubElement(ge, "tb")
            for k in ("id", "send", "recv", "chan"):
                te.set(k, str(getattr(tb, k)))
            for st in tb.steps:
                se = etree.SubElement(te, "step")
                for k in ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps"):
                    se.set(k, str(getattr(st, k)))
                se.set("hasdep", _b(st.hasdep))
                if st.compute is not None:
                    se.set("inputs", ",".join(st.compute.inputs))
                    se.set("col0", str(st.compute.col0))
                    se.set("col1", str(st.compute.col1))
                if st.epilogue is not None:
                    se.set("epilogue", st.epilogue.text)
    if prog.postcondition is not None:
        root.append(_postcondition_element(prog.postcondition))
    if prog.compute is not None:
        ce = etree.SubElement(root, COMPUTE_EL, {"op": prog.compute.op, "dtype": prog.compute.dtype})
        if prog.compute.accum:          # absent: values rounded to dtype at every hop
            ce.set("accum", prog.compute.accum)
        if prog.compute.splits:         # absent: equal slices
            ce.set("splits", ",".join(map(str, prog.compute.splits)))
        if prog.compute.return_a:       # absent: the output is C alone
            ce.set("return_a", "1")
        typed = dict(prog.compute.dtypes)
        for name, shape in prog.compute.inputs:
            ie = etree.SubElement(ce, _INPUT, {"name": name, "shape": ",".join(map(str, shape))})
            if name in typed:       # only inputs not of the operator's dtype say theirs
                ie.set("dtype", typed[name])
    if prog.epilogue is not None:
        ee = etree.SubElement(root, EPILOGUE_EL, {"ops": prog.epilogue.text})
        if prog.epilogue.cols is not None:
            ee.set("cols", str(prog.epilogue.cols))
    return root


def _to_xml_lxml(prog: Program) -> str:
    root = to_element(prog)
    etree.indent(root, space="  ")
    return etree.tostring(root, encoding="unicode") + "\n"


_STEP_TYPES = frozenset(STEP_TYPES)
_BUFS = frozenset(BUFFERS)


def to_xml(prog: Program) -> str:
    """The program as MSCCL XML text, laid out as `etree.indent` + `tostring` would.

    Large schedules have 10^5 steps, and building an lxml element per step
    costs about 15 us, so the <gpu>/<tb>/<step> lines (integers and fixed
    keywords only) are formatted directly; <algo>, whose strings may need
    escaping, is still serialized by lxml.  A step with a type or buffer
    outside the IR's keywords takes the all-lxml path, so the text is
    always exactly what lxml writes (tests compare the two).
    """
    if prog.postcondition is not None or prog.compute is not None or prog.epilogue is not None:   # small programs
        return _to_xml_lxml(prog)
    head = etree.tostring(etree.Element("algo", _algo_attrs(prog)), encoding="unicode")
    if not prog.gpus:
        return head + "\n"
    out = [head[:-2], ">\n"]
    add = out.append
    for g in prog.gpus:
        gpu = f'  <gpu id="{g.id}" i_chunks="{g.i_chunks}" o_chunks="{g.o_chunks}" s_chunks="{g.s_chunks}"'
        if not g.threadblocks:
            add(gpu + "/>\n")
            continue
        add(gpu + ">\n")
        for tb in g.threadblocks:
            head_tb = f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}"'
            if not tb.steps:
                add(head_tb + "/>\n")
                continue
            add(head_tb + ">\n")
            for st in tb.steps:
                if st.type not in _STEP_TYPES or st.srcbuf not in _BUFS or st.dstbuf not in _BUFS:
                    return _to_xml_lxml(prog)
                add(f'      <step s="{st.s}" type="{st.type}" srcbuf="{st.srcbuf}" srcoff="{st.srcoff}" '
                    f'dstbuf="{st.dstbuf}" dstoff="{st.dstoff}" cnt="{st.cnt}" depid="{st.depid}" '
                    f'deps="{st.deps}" hasdep="{"1" if st.hasdep else "0"}"/>\n')
            add("    </tb>\n")
        add("  </gpu>\n")
    add("</algo>\n")
    return "".join(out)


def write_xml(prog: Program, path: Union[str, Path]) -> None:
    Path(path).write_text(to_xml(prog))
