"""Which catalog a communicator serves when the user names none: the one measured
on GPUs like its own, found by their fingerprint.

The fingerprint of a communicator's GPUs (`Fingerprint`, canonical as its str):

    <N>x<model>|<links>          e.g. "4xNVIDIA H100 80GB HBM3|NV18-all"

* N: the communicator's ranks; model: the GPU's name as CUDA and nvidia-smi give it,
  or the ranks' names in rank order joined by "+" where they differ.
* links: "<L>-all" when every pair of ranks has the same link L, else the link of
  each pair (0,1), (0,2) .. (0,N-1), (1,2) .. (N-2,N-1), joined by ","; "none" for
  one rank.  L is `nvidia-smi topo -m`'s word for the pair (NV18, PIX, PXB, PHB,
  NODE, SYS), SELF for two ranks on one GPU, NET for ranks on different hosts, and
  "?" where it cannot be known (no nvidia-smi; a pair on a host other than rank 0's).

The GPUs are the communicator's, not the machine's: each rank names its device
(host, PCI bus id, model: `Device`), rank 0 gathers them, reads its host's links
from nvidia-smi (whose GPU numbers it maps by bus id, so CUDA_VISIBLE_DEVICES and
CUDA's device order do not matter) and every rank takes rank 0's answer.

The default, when none of GC3_XML_FILES, MSCCL_XML_FILES and GC3_CONFIG is set
(they always win), is the first of (`choose`; rank 0 chooses, every rank loads it):

1. the cache: the catalog `GC3_AUTOTUNE=1` or `gc3 tune --install` measured for
   this fingerprint, ``<GC3_CACHE_DIR>/catalogs/<slug>/catalog.json``; one whose
   provenance names another fingerprint is refused with a warning;
2. a shipped catalog measured on a matching set: ``ir_samples/machines/<slug>/``;
3. the unknown-machine rule: where every pair of GPUs is NVLink, `SAFE_CATALOG`
   (only the small-message kernels, at the sizes where they beat NCCL on every
   NVLink machine measured; its provenance lists the measurements); elsewhere no
   gc3 algorithm.  NCCL serves everything else.  A communicator with no NCCL
   behind it (`from_mpi`, `without_nccl`: ranks sharing a GPU) has nothing to lose
   to and gets the sample index (`catalog.DEFAULT_INDEX`) instead.

<slug> is the fingerprint with every run of characters other than letters, digits
and "." replaced by "-" (`Fingerprint.slug`).  GC3_DEBUG=INFO logs the choice and
why, once per process.  With GC3_AUTOTUNE=1 and neither 1. nor 2., the
communicator's processes tune one first (`autotune`).

For other code: `catalog_for(fingerprint)` is the measured catalog's path (cache,
then shipped) or None; `fingerprint_of(devices)` computes a fingerprint;
`fingerprint_of_provenance(prov)` reads it from a `gc3 tune` catalog;
`NcclCommunicator.machine` is the `Default` a communicator chose (None under a
user override).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from gc3 import settings

from .catalog import DEFAULT_INDEX, cache_dir

MACHINES = DEFAULT_INDEX.parent / "machines"
SAFE_CATALOG = MACHINES / "unknown-nvlink.json"
CATALOG = "catalog.json"
UNKNOWN, SELF, NET = "?", "SELF", "NET"
_NVLINK = re.compile(r"NV\d+")

# The settings of first-use tuning (README's table): on/off, its time bound, its largest size.
ENV_AUTOTUNE, ENV_AUTOTUNE_S, ENV_AUTOTUNE_MAX = "GC3_AUTOTUNE", "GC3_AUTOTUNE_S", "GC3_AUTOTUNE_MAX_BYTES"
AUTOTUNE_S, AUTOTUNE_MAX_BYTES = settings.default(ENV_AUTOTUNE_S), settings.default(ENV_AUTOTUNE_MAX)
# A replaced cache's IR folder is removed this long after: a process that read the old
# catalog.json a moment before reads its IRs well within it.  A writer's staging folder
# (it proves each IR while writing) is left alone far longer.
_STALE_S, _STAGING_S = 60.0, 3600.0


# --- the fingerprint ----------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """One rank's GPU, as the rank itself sees it."""
    host: str
    bus_id: str     # normalized by `bus_id`: "0000:00:06.0"
    model: str


def bus_id(text: str) -> str:
    """A PCI bus id in one spelling: CUDA says 0000:06:00.0, nvidia-smi 00000000:06:00.0."""
    text = text.strip().lower()
    m = re.fullmatch(r"([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f])", text)
    return f"{int(m[1], 16):04x}:{m[2]}:{m[3]}.{m[4]}" if m else text


def local_device(index: int) -> Device:
    """CUDA device `index` of this process."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return Device(socket.gethostname(), bus_id(cupy.cuda.runtime.deviceGetPCIBusId(index)), name)


@dataclass(frozen=True)
class Fingerprint:
    models: Tuple[str, ...]     # per rank
    links: Tuple[str, ...]      # per rank pair, (0,1), (0,2), .., (N-2,N-1)

    def __str__(self) -> str:
        model = self.models[0] if len(set(self.models)) == 1 else "+".join(self.models)
        if not self.links:
            links = "none"
        elif len(set(self.links)) == 1:
            links = f"{self.links[0]}-all"
        else:
            links = ",".join(self.links)
        return f"{len(self.models)}x{model}|{links}"

    @property
    def ranks(self) -> int:
        return len(self.models)

    @property
    def all_nvlink(self) -> bool:
        return bool(self.links) and all(_NVLINK.fullmatch(link) for link in self.links)

    @property
    def slug(self) -> str:
        return slug(str(self))


def slug(fingerprint: str) -> str:
    """The folder name of a fingerprint's catalog."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", fingerprint).strip("-")


def parse_topology(text: str) -> Dict[str, object]:
    """The GPU-to-GPU link of every pair in `nvidia-smi topo -m` output ({"GPU0-GPU1": "NV18", ...})
    and a one-line summary; {"unknown": why} when the output has no GPU matrix."""
    rows = [line.split() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
    head = next((r for r in rows if r and re.fullmatch(r"GPU\d+", r[0])
                 and (len(r) == 1 or not re.fullmatch(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC", r[1]))), None)
    if head is None:
        return {"unknown": "no GPU matrix in `nvidia-smi topo -m` output"}
    gpus = [c for c in head if re.fullmatch(r"GPU\d+", c)]
    matrix = {r[0]: r[1:1 + len(gpus)] for r in rows if len(r) > len(gpus) and r[0] in gpus and r is not head}
    links = {f"{a}-{b}": matrix[a][j] for i, a in enumerate(gpus) for j, b in enumerate(gpus)
             if j > i and a in matrix}
    kinds = Counter(links.values())
    summary = "; ".join(f"{k} between {'all ' if n == len(links) else ''}{n} GPU pair{'s' if n > 1 else ''}"
                        for k, n in kinds.most_common())
    return {"source": "nvidia-smi topo -m", "gpus": len(gpus), "links": links,
            "summary": summary or f"{len(gpus)} GPU, no pairs"}


def _nvidia_smi(args: Sequence[str], run: Callable) -> Tuple[Optional[str], str]:
    """(stdout, "") or (None, why it could not be asked)."""
    cmd = ["nvidia-smi", *args]
    try:
        res = run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{' '.join(cmd)}: {exc}"
    if res.returncode != 0:
        return None, f"{' '.join(cmd)} exited {res.returncode}: {(res.stderr or '').strip()[:200]}"
    return res.stdout, ""


def topology(run: Callable = subprocess.run) -> Dict[str, object]:
    """How this machine's GPUs are linked, as `nvidia-smi topo -m` says (what a tuned
    catalog was measured over: NV18 everywhere is not the same machine as PCIe pairs);
    {"unknown": why} where it cannot be asked."""
    out, why = _nvidia_smi(["topo", "-m"], run)
    return {"unknown": why} if out is None else parse_topology(out)


def parse_bus_ids(text: str) -> Dict[str, int]:
    """{bus id: nvidia-smi's GPU number} from `nvidia-smi --query-gpu=index,pci.bus_id
    --format=csv,noheader` (the numbers `topo -m` uses)."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            out[bus_id(parts[1])] = int(parts[0])
    return out


@dataclass(frozen=True)
class HostLinks:
    """The links between this host's GPUs, by bus id; `why` says what is unknown and why."""
    numbers: Dict[str, int]
    links: Dict[str, str]
    why: str = ""

    def link(self, a: str, b: str) -> str:
        i, j = self.numbers.get(a), self.numbers.get(b)
        if i is None or j is None:
            return UNKNOWN
        return self.links.get(f"GPU{min(i, j)}-GPU{max(i, j)}", UNKNOWN)


def host_links(run: Callable = subprocess.run) -> HostLinks:
    topo = topology(run)
    ids, why = _nvidia_smi(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"], run)
    return HostLinks(parse_bus_ids(ids or ""), dict(topo.get("links") or {}), "; ".join(
        w for w in (topo.get("unknown", ""), why) if w))


@lru_cache(maxsize=1)
def _this_host() -> HostLinks:
    return host_links()      # once per process: nvidia-smi takes a good fraction of a second


def fingerprint_of(devices: Sequence[Device], links: Optional[HostLinks] = None) -> Fingerprint:
    """The fingerprint of these ranks' GPUs (rank order), as seen from devices[0]'s host,
    where this runs; `links`: that host's links (default: nvidia-smi's, asked once and
    only where two ranks have different GPUs on it)."""
    out = []
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            if a.host != b.host:
                out.append(NET)
            elif a.bus_id == b.bus_id:
                out.append(SELF)
            elif a.host != devices[0].host:
                out.append(UNKNOWN)
            else:
                links = links or _this_host()
                out.append(links.link(a.bus_id, b.bus_id))
    return Fingerprint(tuple(d.model for d in devices), tuple(out))


def fingerprint_of_provenance(prov: Mapping) -> Optional[str]:
    """The fingerprint a `gc3 tune` catalog was measured on: its "fingerprint", else
    (catalogs written before tune recorded it) what its device, rank and GPU counts and
    topology determine; None when they do not (a model-only catalog; processes sharing
    some GPUs; links that differ between pairs, whose GPUs are not recorded)."""
    given = prov.get("fingerprint")
    if isinstance(given, str):
        return given
    model, ranks, gpus = prov.get("device"), prov.get("ranks"), prov.get("gpus")
    if not prov.get("measured") or not isinstance(model, str) or prov.get("nodes", 1) != 1:
        return None
    if not isinstance(ranks, int) or not isinstance(gpus, int) or ranks < 1:
        return None
    pairs = ranks * (ranks - 1) // 2
    kinds = set(((prov.get("topology") or {}).get("links") or {}).values())
    if gpus == 1:
        link = SELF
    elif gpus == ranks and len(kinds) == 1:
        link = kinds.pop()      # every pair of the machine has it, so every pair of its ranks has
    else:
        return None
    return str(Fingerprint((model,) * ranks, (link,) * pairs))


# --- catalogs per fingerprint ---------------------------------------------------------

def cache_root(env: Optional[Mapping[str, str]] = None) -> Path:
    return cache_dir(env) / "catalogs"


def _matching(path: Path, fingerprint: str, what: str, log) -> Optional[Path]:
    """`path` when it is a catalog measured on `fingerprint`; else None, saying why
    (a log's warning) when it exists."""
    if not path.is_file():
        return None
    try:
        prov = json.loads(path.read_text()).get("provenance") or {}
        have = fingerprint_of_provenance(prov) if isinstance(prov, dict) else None
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        have, why = None, f"unreadable ({exc})"
    else:
        why = f"measured on {have!r}" if have else "its provenance names no fingerprint"
    if have == fingerprint:
        return path
    if log is not None:
        log.warning("%s %s is refused for this communicator's GPUs %r: %s (stale or foreign; GC3_AUTOTUNE=1 or "
                    "`gc3 tune --install` measures one for them)", what, path, fingerprint, why)
    return None


def cached_catalog(fingerprint: Union[str, Fingerprint], env=None, log=None) -> Optional[Path]:
    fp = str(fingerprint)
    return _matching(cache_root(env) / slug(fp) / CATALOG, fp, "cached catalog", log)


def shipped_catalog(fingerprint: Union[str, Fingerprint], log=None) -> Optional[Path]:
    fp = str(fingerprint)
    return _matching(MACHINES / slug(fp) / CATALOG, fp, "shipped catalog", log)


def shipped_catalogs() -> Dict[str, Path]:
    """{fingerprint: catalog} of every catalog shipped in ir_samples/machines/."""
    out = {}
    for path in sorted(MACHINES.glob(f"*/{CATALOG}")):
        fp = fingerprint_of_provenance(json.loads(path.read_text()).get("provenance") or {})
        if fp is not None:
            out[fp] = path
    return out


def catalog_for(fingerprint: Union[str, Fingerprint], env=None, log=None) -> Optional[Path]:
    """The measured catalog for GPUs with this fingerprint: the cache's, else the shipped
    one; None when neither exists (the unknown-machine rule then serves)."""
    return cached_catalog(fingerprint, env, log) or shipped_catalog(fingerprint, log)


@dataclass(frozen=True)
class Default:
    """What a communicator serves with no user override, and why (`note`: the INFO line)."""
    fingerprint: str
    origin: str                 # cached, shipped, unknown machine, no NCCL
    path: Optional[Path]        # None: no gc3 algorithm, NCCL serves every call
    note: str


def choose(fingerprint: Fingerprint, env=None, nccl: bool = True, log=None) -> Default:
    """The default catalog for these GPUs (the module's docstring gives the order)."""
    fp = str(fingerprint)
    path = cached_catalog(fp, env, log)
    if path is not None:
        return Default(fp, "cached", path, f"GPUs {fp}: the catalog measured on this machine kind, {path} (cached)")
    path = shipped_catalog(fp, log)
    if path is not None:
        return Default(fp, "shipped", path, f"GPUs {fp}: the catalog measured on a matching set, {path} (shipped)")
    none = f"GPUs {fp}: no measured catalog matches (none cached in {cache_root(env)}, none shipped in {MACHINES})"
    if not nccl:
        return Default(fp, "no NCCL", DEFAULT_INDEX, f"{none}; no NCCL behind this communicator, so the sample "
                                                     f"index {DEFAULT_INDEX} serves what it has")
    tune = "; GC3_AUTOTUNE=1 or `gc3 tune --install` measures one"
    proven = sorted({e.get("ranks") for e in json.loads(SAFE_CATALOG.read_text())["algorithms"]})
    if fingerprint.all_nvlink and fingerprint.ranks not in proven:
        return Default(fp, "unknown machine", None, f"{none}; no small-message kernel is proven faster than NCCL at "
                                                    f"{fingerprint.ranks} ranks ({SAFE_CATALOG} covers "
                                                    f"{', '.join(map(str, proven))}): every call goes to NCCL{tune}")
    if fingerprint.all_nvlink:
        return Default(fp, "unknown machine", SAFE_CATALOG,
                       f"{none}; serving only the small-message kernels proven faster than NCCL on any NVLink set "
                       f"({SAFE_CATALOG}); every other collective and size goes to NCCL{tune}")
    return Default(fp, "unknown machine", None, f"{none} and not every GPU pair is NVLink: every call goes to "
                                                f"NCCL{tune}")


def autotune_settings(env: Mapping[str, str]) -> Tuple[bool, float, int]:
    """GC3_AUTOTUNE (on?), GC3_AUTOTUNE_S (seconds of measuring), GC3_AUTOTUNE_MAX_BYTES."""
    return settings.get(ENV_AUTOTUNE, env), settings.get(ENV_AUTOTUNE_S, env), settings.get(ENV_AUTOTUNE_MAX, env)


# --- the cache, written atomically --------------------------------------------------

def lock_path(fingerprint: Union[str, Fingerprint], env=None) -> Path:
    return cache_root(env) / slug(str(fingerprint)) / ".lock"


@contextlib.contextmanager
def tuning_lock(fingerprint: Union[str, Fingerprint], env=None) -> Iterator[bool]:
    """Yields True while this process holds the fingerprint's tuning lock (one tuner at
    a time), False when another holds it.  An flock: a tuner that dies releases it."""
    import fcntl

    path = lock_path(fingerprint, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def store(fingerprint: Union[str, Fingerprint], write: Callable[[Path], None], env=None) -> Path:
    """Put a catalog into the cache for `fingerprint` and return its path.  `write(folder)`
    writes catalog.json and the IR files it names (relative to it) into an empty folder;
    the catalog's provenance must name this fingerprint.

    A reader sees the old catalog or the new one, never a mix: the IRs go into a
    folder of their own renamed into place, then catalog.json (now naming that folder)
    replaces the old one with os.replace; folders of replaced catalogs are removed once
    no reader can still be on its way to them."""
    fp = str(fingerprint)
    root = cache_root(env) / slug(fp)
    root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write(staged)
        catalog = json.loads((staged / CATALOG).read_text())
        have = fingerprint_of_provenance(catalog.get("provenance") or {})
        if have != fp:
            raise ValueError(f"the catalog to cache for {fp!r} was measured on {have!r}")
        (staged / CATALOG).unlink()
        irs = f"ir-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        for entry in catalog.get("algorithms", []):
            if "file" in entry:
                entry["file"] = f"{irs}/{entry['file']}"
        os.rename(staged, root / irs)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    fd, tmp = tempfile.mkstemp(prefix=".catalog-", suffix=".tmp", dir=root)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(catalog, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / CATALOG)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        shutil.rmtree(root / irs, ignore_errors=True)
        raise
    _sweep(root, keep=irs)
    return root / CATALOG


def _sweep(root: Path, keep: str) -> None:
    """Remove IR folders no catalog names any more and a dead writer's leftovers, once old."""
    try:
        named = {e["file"].split("/")[0] for e in json.loads((root / CATALOG).read_text()).get("algorithms", [])
                 if "file" in e}
    except (OSError, ValueError):
        return
    now = time.time()
    for p in root.iterdir():
        if p.name == keep or p.name in named or not p.name.startswith((".tmp-", ".catalog-", "ir-")):
            continue
        try:
            if now - p.stat().st_mtime > (_STALE_S if p.name.startswith("ir-") else _STAGING_S):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        except OSError:
            pass
