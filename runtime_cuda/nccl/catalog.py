"""Which gc3 algorithms a process may use, in load order.

Sources (the MSCCL contract, made explicit):

* ``GC3_XML_FILES``  colon-separated XML IR files or directories (a directory
  contributes its ``*.xml`` files in name order).  ``MSCCL_XML_FILES`` is read
  the same way, after it.  Each file's own ``minBytes``/``maxBytes``/``redop``/
  ``proto`` attributes are its settings.
* ``GC3_CONFIG``  an XML or JSON file that lists IR files with size ranges and
  protocols (schema below); loaded after the two variables above.
* Without any of the three: for a communicator, the catalog its GPUs' fingerprint
  selects (`machine`: cached, shipped, else the unknown-machine rule); for any
  other caller, the sample index ``ir_samples/index.json`` (JSON schema below).
  A missing index is reported at INFO and leaves the catalog empty, so every call
  goes to NCCL.

JSON schema (``GC3_CONFIG`` *.json and ``ir_samples/index.json``)::

    {"version": 1,
     "algorithms": [
       {"file": "allreduce_allpairs_2r.xml",   # required; relative to the JSON's folder
        "collective": "allreduce",             # optional assertions, checked against
        "ranks": 2,                            #   the XML: a mismatch skips the entry
        "inplace": true,                       #   with a warning
        "outofplace": true,                    # let an in-place IR serve out-of-place calls
                                               #   (the runtime copies the input first, as
                                               #   MSCCL does); default: the XML's outofplace,
                                               #   else not inplace
        "protocol": "LL",                      # optional settings that override or
        "min_bytes": 0,                        #   narrow the XML's own: protocol to run
        "max_bytes": "1MiB",                   #   with, size range (ints or "64KiB";
        "dtypes": ["float32", "bfloat16"],     #   null max = unbounded), allowed dtypes
        "ops": ["sum"],                        #   and reduction ops (absent = any)
        "count_multiple": 8,                   # the element count must divide by it (default 1)
        "root": 0,                             # broadcast/reduce root the IR was built for
        "name": "label for logs"},
       {"kernel": "oneshot",                   # instead of "file": a dedicated small-message
        "collective": "allreduce",             #   kernel (runtime_cuda/ranks/small_allreduce.py): allreduce
        "ranks": 2,                            #   "oneshot" or "twoshot", allgather and reducescatter
        "max_bytes": "256KiB"}],               #   "oneshot" (gc3.limits.SMALL_KERNELS; no collective:
                                               #   allreduce); ranks required; it serves in and out of
                                               #   place; max_bytes at most
                                               #   gc3.limits.SMALL_ALLREDUCE_MAX_BYTES (default
                                               #   SMALL_ALLREDUCE_DEFAULT_BYTES; the scratch is sized
                                               #   for the largest rank's block); protocol, if given, LL
     "provenance": {...}}                      # optional, any object: where the catalog came
                                               #   from (`gc3 tune` writes it); selection
                                               #   ignores it

A top-level list is accepted as the ``algorithms`` list.  ``minBytes``/
``maxBytes`` are accepted as spellings of ``min_bytes``/``max_bytes``.

XML schema (``GC3_CONFIG`` *.xml): a root ``<gc3_config>`` (or ``<msccl_algos>``)
holding ``<load path=".." minBytes=".." maxBytes=".." proto=".." collective=".."
ranks=".." inplace="0|1" outofplace="0|1" dtypes="a,b" ops="a,b" count_multiple=".." root=".."
name=".."/>`` with the
same meanings.

A file that is missing, unreadable, malformed, fails verification, or an entry
that contradicts its XML is reported once as a warning naming the file (and line
or key) and skipped: the catalog never holds an IR it could not trust.

Verification proves each IR computes its collective (`gc3.verify`); an IR it
cannot prove (a custom collective without a postcondition) is skipped like a
wrong one.  Its verdict is cached by the SHA-256 of the file's bytes and of the
verifier's own sources under ``GC3_CACHE_DIR`` (default
``$XDG_CACHE_HOME/gc3`` or ``~/.cache/gc3``), so a process start re-verifies
only files it has not seen; an unwritable cache only costs the time.

``gc3 catalog check FILE`` (`check_config`) loads a catalog file exactly as
this module does and lists every bad entry.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from lxml import etree

from gc3 import limits, settings
from gc3.errors import GC3Error, InputError
from gc3.units import parse_size, strict_int
from gc3.ir import PROTOCOLS, Program
from gc3.ir.xml_io import from_xml

from .call import COLLECTIVES, REDUCING
from .constants import DTYPE_CODES, OP_CODES
from .log import LOGGER_NAME, get_logger

ENV_FILES = ("GC3_XML_FILES", "MSCCL_XML_FILES")
ENV_CONFIG = "GC3_CONFIG"
def user_override(env: Mapping[str, str]) -> bool:
    """Whether the environment names the catalog itself (which then always wins)."""
    return any(env.get(var, "").strip() for var in (*ENV_FILES, ENV_CONFIG))


def default_index() -> Path:
    """The sample index: beside the sources (a checkout or an editable install),
    else where a wheel puts it (pyproject's data-files); ir_samples/machines/ (the
    measured catalogs, `machine`) sits beside it."""
    candidates = [Path(__file__).resolve().parents[2] / "ir_samples" / "index.json",
                  Path(sys.prefix) / "share" / "gc3" / "ir_samples" / "index.json"]
    return next((c for c in candidates if c.is_file()), candidates[0])


DEFAULT_INDEX = default_index()

_ENTRY_KEYS = {"file", "kernel", "collective", "ranks", "inplace", "outofplace", "protocol", "min_bytes", "max_bytes",
               "minBytes", "maxBytes", "dtypes", "ops", "count_multiple", "root", "name"}
_LOAD_ATTRS = {"path", "collective", "ranks", "inplace", "outofplace", "proto", "minBytes", "maxBytes", "minbytes",
               "maxbytes", "dtypes", "ops", "count_multiple", "root", "name"}


class CatalogEntryError(InputError):
    """One catalog source or entry that cannot be used; the catalog skips it."""


@dataclass(frozen=True)
class Candidate:
    """One algorithm that calls may select, with the conditions it serves: an IR
    (`program`) or a dedicated kernel (`kernel`, a name of
    gc3.limits.SMALL_KERNELS[kernel_collective]; then `program` is None)."""
    name: str
    origin: str                  # which variable or file listed it
    path: Path                   # the IR file; for a kernel, the catalog file naming it
    program: Optional[Program]   # protocol already set to the one it runs with
    serves_inplace: bool
    serves_outofplace: bool
    min_bytes: int
    max_bytes: Optional[int]     # None: no upper bound
    dtypes: Optional[frozenset]  # None: any dtype the runtime supports
    ops: Optional[frozenset]     # None: any op (narrowed by the XML's redop)
    root: Optional[int]          # None: not a rooted collective, or unknown
    count_multiple: int = 1      # input element count must be a multiple of it
    kernel: Optional[str] = None
    kernel_ranks: int = 0        # a kernel's communicator size (an IR has its own)
    kernel_collective: str = "allreduce"

    @property
    def collective(self) -> str:
        return self.kernel_collective if self.kernel else self.program.coll

    @property
    def ranks(self) -> int:
        return self.kernel_ranks if self.kernel else self.program.ngpus

    @property
    def proto(self) -> str:
        """The protocol it runs with (the small kernels move LL lines, or LL128 lines)."""
        return limits.small_kernel_protocol(self.kernel) if self.kernel else self.program.proto

    @property
    def run_kwargs(self) -> Dict[str, str]:
        return run_kwargs(self.kernel, self.kernel_collective)


def run_kwargs(kernel: Optional[str], collective: str) -> Dict[str, str]:
    """What a launch group's run_ptrs/reissue take besides the call, to run an entry: a
    small-message kernel's name and collective (one SmallAllreduce group serves them all;
    without the collective it would run an allreduce), nothing for an IR (its group runs
    its own program)."""
    return {"kind": kernel, "coll": collective} if kernel else {}


@dataclass(frozen=True)
class Catalog:
    candidates: Tuple[Candidate, ...]
    sources: Tuple[str, ...]     # what was read, for the "nothing matched" message

    def kernel_bytes(self, ranks: int) -> int:
        """The largest call a small-message kernel entry may serve on `ranks` ranks:
        what a communicator's kernel scratch must hold (sized once, every peer maps it)."""
        return max((limits.small_kernel_block_bytes(c.collective, c.max_bytes, ranks)
                    for c in self.candidates if c.kernel and c.ranks == ranks),
                   default=limits.SMALL_ALLREDUCE_DEFAULT_BYTES)


# ---------------------------------------------------------------------------
# Settings shared by both config formats


@dataclass
class _Settings:
    collective: Optional[str] = None
    ranks: Optional[int] = None
    inplace: Optional[bool] = None
    outofplace: Optional[bool] = None
    protocol: Optional[str] = None
    min_bytes: Optional[int] = None
    max_bytes: Optional[int] = None
    max_unbounded: bool = False
    dtypes: Optional[frozenset] = None
    ops: Optional[frozenset] = None
    root: Optional[int] = None
    count_multiple: int = 1
    name: Optional[str] = None
    kernel: Optional[str] = None


def _names(value, known: Mapping[str, int], what: str) -> frozenset:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"{what} must be a non-empty list of names")
    out = frozenset(str(i).strip().lower() for i in items)
    unknown = sorted(out - set(known))
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
    return out


def _as_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value) in ("0", "1"):
        return str(value) == "1"
    raise ValueError(f"expected true/false or 0/1, got {value!r}")


def _as_int(value, low: int = 0, high: int = limits.INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected an integer, got {value!r}")
    return strict_int(value, low, high)


def _settings(raw: Mapping[str, object]) -> _Settings:
    s = _Settings()
    for key, value in raw.items():
        try:
            if key == "collective":
                s.collective = str(value)
            elif key == "ranks":
                s.ranks = _as_int(value, 1, limits.MAX_RANKS)
            elif key == "inplace":
                s.inplace = _as_bool(value)
            elif key == "outofplace":
                s.outofplace = _as_bool(value)
            elif key in ("protocol", "proto"):
                if value not in PROTOCOLS:
                    raise ValueError(f"expected one of {', '.join(PROTOCOLS)}")
                s.protocol = str(value)
            elif key in ("min_bytes", "minBytes", "minbytes"):
                s.min_bytes = parse_size(value)
            elif key in ("max_bytes", "maxBytes", "maxbytes"):
                if value is None or str(value).lower() in ("inf", "none", ""):
                    s.max_unbounded = True
                else:
                    s.max_bytes = parse_size(value)
            elif key == "dtypes":
                s.dtypes = _names(value, DTYPE_CODES, "dtypes")
            elif key == "ops":
                s.ops = _names(value, OP_CODES, "ops")
            elif key == "root":
                s.root = _as_int(value, 0, limits.MAX_RANKS - 1)
            elif key == "count_multiple":
                s.count_multiple = _as_int(value, 1)
            elif key == "name":
                s.name = str(value)
            elif key == "kernel":
                kinds = sorted({k for ks in limits.SMALL_KERNELS.values() for k in ks})
                if value not in kinds:
                    raise ValueError(f"expected one of {', '.join(kinds)}")
                s.kernel = str(value)
        except ValueError as exc:
            raise CatalogEntryError(f"{key}={value!r}: {exc}") from None
    return s


def cache_dir(env: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if env is None else env
    given = settings.get("GC3_CACHE_DIR", env) or settings.get("GC3_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gc3"


_VERIFIER_ID: Optional[str] = None


def _verifier_id() -> str:
    """A digest of the verifier's sources: a cached verdict is void once they change."""
    global _VERIFIER_ID
    if _VERIFIER_ID is None:
        import gc3
        root = Path(gc3.__file__).parent
        h = hashlib.sha256(gc3.__version__.encode())
        for f in sorted([*root.joinpath("verify").glob("*.py"), *root.joinpath("ir").glob("*.py"),
                         root / "limits.py", root / "dsl" / "collectives.py"]):
            h.update(f.name.encode() + f.read_bytes())
        _VERIFIER_ID = h.hexdigest()[:16]
    return _VERIFIER_ID


def _verify(prog: Program, path: Path, digest: str, cache: Optional[Path]) -> None:
    """Prove the IR with gc3's verifier (an IR that fails could hang or be wrong), or
    reuse the verdict cached for these bytes."""
    entry = cache / "verified" / f"{_verifier_id()}-{digest}" if cache is not None else None
    try:
        if entry is not None and entry.is_file():
            reason = entry.read_text()
            if reason == "ok":
                return
            raise CatalogEntryError(f"{path}: fails verification (cached verdict): {reason}")
    except OSError:
        pass
    from gc3.verify import verify
    reason = "ok"
    try:
        verify(prog)
    except GC3Error as exc:
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a verifier bug must not take the user's job down
        raise CatalogEntryError(f"{path}: verifier raised {type(exc).__name__}: {exc}") from None
    if entry is not None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(reason)
            tmp.replace(entry)     # atomic: concurrent ranks never read half a verdict
        except OSError:
            pass
    if reason != "ok":
        raise CatalogEntryError(f"{path}: fails verification: {reason}")


def _candidate(path: Path, origin: str, s: _Settings, cache: Optional[Path] = None) -> Candidate:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CatalogEntryError(f"{path}: cannot read: {exc.strerror}") from None
    prog = from_xml(data, source=str(path))
    for field, want, have in (("collective", s.collective, prog.coll), ("ranks", s.ranks, prog.ngpus),
                              ("inplace", s.inplace, prog.inplace)):
        if want is not None and want != have:
            raise CatalogEntryError(f"entry says {field}={want!r} but {path} has {field}={have!r}")
    if prog.coll not in COLLECTIVES:
        raise CatalogEntryError(f"{path}: collective {prog.coll!r} has no NCCL call (NCCL has {', '.join(COLLECTIVES)})")
    if prog.fused:
        raise CatalogEntryError(f"{path}: a fused IR ({prog.compute.op} + {prog.coll}) is no NCCL call's algorithm: "
                                f"its compute steps read inputs that no NCCL call passes (runtime_cuda.fused runs it)")
    from ..core.tables import refuse_not_on_device
    try:
        refuse_not_on_device(prog)
    except GC3Error as exc:
        raise CatalogEntryError(str(exc)) from None
    if prog.epilogue is not None:
        raise CatalogEntryError(f"{path}: carries the epilogue {prog.epilogue}, which no NCCL call asks for "
                                f"(its named inputs are not an NCCL argument)")
    _verify(prog, path, hashlib.sha256(data).hexdigest(), cache)
    overridden = s.protocol is not None and s.protocol != prog.proto
    if overridden:
        prog = dataclasses.replace(prog, proto=s.protocol)
    ops = s.ops
    if ops is None and prog.redop and prog.redop.lower() not in ("nop", "none") and prog.coll in REDUCING:
        if prog.redop.lower() not in OP_CODES:
            raise CatalogEntryError(f"{path}: redop={prog.redop!r} is not one of {', '.join(OP_CODES)}")
        ops = frozenset([prog.redop.lower()])
    root = s.root
    if root is None and "root" in prog.extra:
        try:
            root = strict_int(prog.extra["root"], 0, prog.ngpus - 1)
        except ValueError:
            raise CatalogEntryError(f"{path}: <algo root={prog.extra['root']!r}> is not an integer") from None
    min_bytes = s.min_bytes if s.min_bytes is not None else (prog.minBytes or 0)
    max_bytes = None if s.max_unbounded else (s.max_bytes if s.max_bytes is not None else prog.maxBytes)
    if max_bytes is not None and min_bytes > max_bytes:
        raise CatalogEntryError(f"{path}: min_bytes={min_bytes} > max_bytes={max_bytes}: the entry serves no size")
    outofplace = s.outofplace if s.outofplace is not None else (
        prog.outofplace if prog.outofplace is not None else not prog.inplace)
    label = s.name or path.name + (f"[{prog.proto}]" if overridden else "")
    return Candidate(name=label, origin=origin, path=path, program=prog, serves_inplace=prog.inplace,
                     serves_outofplace=outofplace, min_bytes=min_bytes, max_bytes=max_bytes,
                     dtypes=s.dtypes, ops=ops, root=root, count_multiple=s.count_multiple)


def _kernel_candidate(path: Path, origin: str, s: _Settings) -> Candidate:
    """A catalog entry naming a dedicated small-message kernel (allreduce when the entry names no collective)."""
    what = f"{path}: kernel {s.kernel!r}"
    coll = s.collective or "allreduce"
    if s.kernel not in limits.SMALL_KERNELS.get(coll, ()):
        have = "; ".join(f"{c}: {', '.join(k)}" for c, k in limits.SMALL_KERNELS.items())
        raise CatalogEntryError(f"{what}: no such kernel for collective={coll!r} (have {have})")
    if s.ranks is None:
        raise CatalogEntryError(f"{what} needs 'ranks' (the communicator size it serves)")
    proto = limits.small_kernel_protocol(s.kernel)
    if s.protocol not in (None, proto):
        raise CatalogEntryError(f"{what} moves {proto} lines; the entry asks for protocol {s.protocol}")
    if s.root is not None:
        raise CatalogEntryError(f"{what}: an {coll} has no root")
    top = limits.SMALL_ALLREDUCE_MAX_BYTES
    if s.max_unbounded or (s.max_bytes is not None and s.max_bytes > top):
        raise CatalogEntryError(f"{what} serves at most {top} bytes (its scratch is sized for that); "
                                f"max_bytes={'unbounded' if s.max_unbounded else s.max_bytes}")
    max_bytes = limits.SMALL_ALLREDUCE_DEFAULT_BYTES if s.max_bytes is None else s.max_bytes
    min_bytes = s.min_bytes or 0
    if min_bytes > max_bytes:
        raise CatalogEntryError(f"{what}: min_bytes={min_bytes} > max_bytes={max_bytes}: the entry serves no size")
    inplace = True if s.inplace is None else s.inplace
    outofplace = True if s.outofplace is None else s.outofplace
    if not (inplace or outofplace):
        raise CatalogEntryError(f"{what}: inplace and outofplace both false: the entry serves no call")
    return Candidate(name=s.name or f"{s.kernel}_{coll}_{s.ranks}r", origin=origin, path=path, program=None,
                     serves_inplace=inplace, serves_outofplace=outofplace, min_bytes=min_bytes,
                     max_bytes=max_bytes, dtypes=s.dtypes, ops=s.ops, root=None,
                     count_multiple=s.count_multiple, kernel=s.kernel, kernel_ranks=s.ranks,
                     kernel_collective=coll)


# ---------------------------------------------------------------------------
# Readers: each yields (path, settings, where) and reports its own bad entries


def _xml_paths(spec: str, var: str, log: logging.Logger) -> List[Path]:
    paths: List[Path] = []
    for part in spec.split(":"):
        if not part.strip():
            continue
        p = Path(part.strip()).expanduser()
        if p.is_dir():
            found = sorted(p.glob("*.xml"))
            if not found:
                log.warning("%s: directory %s holds no .xml files; nothing loaded from it", var, p)
            paths.extend(found)
        else:
            paths.append(p)
    return paths


def _json_entries(path: Path, data) -> Iterable[Tuple[Path, Dict, str]]:
    if isinstance(data, dict):
        if "algorithms" not in data:
            raise CatalogEntryError(f"{path}: a JSON object must have an 'algorithms' list")
        version = data.get("version", 1)
        if version != 1:
            raise CatalogEntryError(f"{path}: version {version!r} is not supported (expected 1)")
        data = data["algorithms"]
    if not isinstance(data, list):
        raise CatalogEntryError(f"{path}: 'algorithms' must be a list of entries")
    for i, entry in enumerate(data):
        where = f"{path}: algorithms[{i}]"
        if not isinstance(entry, dict) or ("file" in entry) == ("kernel" in entry):
            yield None, {}, f"{where}: an entry must be an object with a 'file' key (an IR) or a 'kernel' key"
            continue
        unknown = sorted(set(entry) - _ENTRY_KEYS)
        if unknown:
            yield None, {}, f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_ENTRY_KEYS))})"
            continue
        if "kernel" in entry:     # no IR file: the entry itself is the whole description
            yield path, dict(entry), where
            continue
        raw = {k: v for k, v in entry.items() if k != "file"}
        yield path.parent / str(entry["file"]), raw, where


def _xml_config_entries(path: Path) -> Iterable[Tuple[Path, Dict, str]]:
    try:
        root = etree.parse(str(path), etree.XMLParser(resolve_entities=False)).getroot()
    except etree.XMLSyntaxError as exc:
        raise CatalogEntryError(f"{path}:{exc.lineno}: not well-formed XML: {exc.msg}") from None
    if root.tag not in ("gc3_config", "msccl_algos"):
        raise CatalogEntryError(f"{path}:{root.sourceline}: root element must be <gc3_config> or <msccl_algos>")
    for el in root:
        if not isinstance(el.tag, str):
            continue
        where = f"{path}:{el.sourceline}: <{el.tag}>"
        if el.tag != "load" or "path" not in el.attrib:
            yield None, {}, f"{where} expected <load path=...>"
            continue
        unknown = sorted(set(el.attrib) - _LOAD_ATTRS)
        if unknown:
            yield None, {}, f"{where} unknown attribute(s) {', '.join(unknown)}"
            continue
        raw = {k: v for k, v in el.attrib.items() if k != "path"}
        yield path.parent / el.get("path"), raw, where


def _config_entries(path: Path) -> Iterable[Tuple[Path, Dict, str]]:
    if not path.is_file():
        raise CatalogEntryError(f"{path}: no such file")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogEntryError(f"{path}: cannot read: {exc}") from None
        except json.JSONDecodeError as exc:
            raise CatalogEntryError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        return list(_json_entries(path, data))
    return list(_xml_config_entries(path))


def _add(out: List[Candidate], path: Path, raw: Dict, origin: str, log: logging.Logger,
         cache: Optional[Path]) -> Optional[str]:
    """Append the entry's candidate; or log why it is skipped and return that."""
    try:
        s = _settings(raw)
        out.append(_kernel_candidate(path, origin, s) if s.kernel else _candidate(path, origin, s, cache))
    except GC3Error as exc:
        log.warning("%s: skipped: %s", origin, exc)
        return f"{origin}: {exc}"
    return None


def _load_config(origin: str, path: Path, out: List[Candidate], log: logging.Logger,
                 cache: Optional[Path]) -> List[str]:
    """Add every usable entry of config file `path`; return why the others were
    skipped.  Raises CatalogEntryError if the file itself cannot be read."""
    entries = _config_entries(path)
    problems = []
    for xml_path, raw, where in entries:
        if xml_path is None:
            log.warning("%s: skipped %s", origin, where)
            problems.append(f"{origin}: {where}")
        else:
            problem = _add(out, xml_path, raw, f"{origin} {where}", log, cache)
            if problem:
                problems.append(problem)
    return problems


def check_config(path: Path, env: Optional[Mapping[str, str]] = None) -> Tuple[List[Candidate], List[str]]:
    """Load catalog file `path` (JSON or XML) exactly as GC3_CONFIG would be loaded:
    the candidates it yields and one line per entry it would skip."""
    out: List[Candidate] = []
    log = logging.getLogger(LOGGER_NAME + ".check")
    log.disabled = True      # the caller reports the problems itself
    return out, _load_config(str(path), Path(path), out, log, cache_dir(env))  # raises if unreadable


def load_catalog(env: Optional[Mapping[str, str]] = None, machine=None) -> Catalog:
    """Read every source named by the environment, in load order; with none named,
    `machine`'s catalog (a `machine.Default`: what a communicator's GPUs get), else the
    sample index."""
    env = os.environ if env is None else env
    log = get_logger(env)
    cache = cache_dir(env)
    out: List[Candidate] = []
    sources: List[str] = []
    for var in ENV_FILES:
        spec = env.get(var, "")
        if not spec.strip():
            continue
        sources.append(f"{var}={spec}")
        for p in _xml_paths(spec, var, log):
            _add(out, p, {}, var, log, cache)
    configs = [(ENV_CONFIG, Path(env[ENV_CONFIG]).expanduser())] if env.get(ENV_CONFIG, "").strip() else []
    if not sources and not configs and machine is not None:
        log.info("%s", machine.note)
        if machine.path is None:
            return Catalog((), (f"GPUs {machine.fingerprint}: {machine.origin}, no gc3 algorithm",))
        configs = [(f"{machine.origin} catalog", machine.path)]
    if not sources and not configs:
        if not DEFAULT_INDEX.is_file():
            log.info("no GC3_XML_FILES, MSCCL_XML_FILES or GC3_CONFIG set and no default index %s: "
                     "every call goes to NCCL", DEFAULT_INDEX)
            return Catalog((), ())
        configs = [("default index", DEFAULT_INDEX)]
    for origin, path in configs:
        sources.append(f"{origin}={path}")
        try:
            _load_config(origin, path, out, log, cache)
        except CatalogEntryError as exc:
            log.warning("%s: skipped: %s", origin, exc)
    log.info("catalog: %d algorithm(s) from %s%s", len(out), "; ".join(sources),
             "".join(f"\n  {i}: {c.name} ({c.collective}, {c.ranks} ranks, {c.proto})"
                     for i, c in enumerate(out)))
    return Catalog(tuple(out), tuple(sources))
