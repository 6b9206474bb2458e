"""The catalog a communicator serves (`agree`, every rank together, at its creation), and
first-use tuning (GC3_AUTOTUNE=1): `gc3 tune`'s measured path, run by a communicator's own
processes when it is created on GPUs that no cached or shipped catalog was measured on
(`agree` decides, and holds the fingerprint's lock on rank 0 meanwhile, so one process
tunes at a time).  `agree` lives here rather than in machine.py, which fingerprints and
chooses without measuring: tuning measures through perf_gpu and tune_gpu, which use
machine.py themselves.

The ranks time every candidate over the communicator's rendezvous
(`perf_gpu.Host.over`) against NCCL in the same processes, on the full grid,
within GC3_AUTOTUNE_S seconds of measuring, sizes 1 KiB to
GC3_AUTOTUNE_MAX_BYTES (`machine.autotune_settings`); what the time does not
reach stays with NCCL.  Rank 0 stores the catalog in the cache for the
fingerprint (`machine.store`), where later processes find it.
"""
from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Callable, Optional

from gc3.errors import InputError

from . import machine


def agree(exchange, device: int, env=None, nccl: bool = True, log=None,
          describe: Optional[Callable[[int], machine.Device]] = None) -> machine.Default:
    """machine.choose for a communicator: collective over `exchange` (every rank calls it);
    rank 0 fingerprints the ranks' GPUs and chooses, tuning first under GC3_AUTOTUNE=1,
    and every rank takes its answer, so all serve the same catalog."""
    env = os.environ if env is None else env
    try:
        mine = (describe or machine.local_device)(device)
    except Exception as exc:   # no CUDA to ask: the fingerprint says unknown, the rule then sends calls to NCCL
        mine = machine.Device(socket.gethostname(), f"{machine.UNKNOWN} ({type(exc).__name__}: {exc})", machine.UNKNOWN)
    devices = exchange.allgather(mine)
    with contextlib.ExitStack() as held:
        plan = None
        if exchange.rank == 0:
            try:   # rank 0 must answer whatever happens: its peers wait for it
                fp = machine.fingerprint_of(devices)
                default = machine.choose(fp, env, nccl, log)
                plan = (default, default.origin not in ("cached", "shipped") and _tuning_asked(env, fp, held, log),
                        "")
            except InputError as exc:     # a setting of the user's: every rank stops, naming it
                plan = (None, False, str(exc))
            except Exception as exc:      # gc3's own failure: NCCL serves, and the log says why
                why = f"{type(exc).__name__}: {exc}"
                plan = (machine.Default("?", "error", None if nccl else machine.DEFAULT_INDEX, f"the default catalog could not be "
                                f"chosen ({why}): {'every call goes to NCCL' if nccl else 'the sample index'}"),
                        False, "")
                if log is not None:
                    log.warning("rank 0: %s", plan[0].note)
        default, tune, error = exchange.bcast(plan)
        if error:
            raise InputError(error)
        if tune:
            path = autotune(exchange, device, default.fingerprint, env, log)
            if path is not None:
                default = machine.Default(default.fingerprint, "cached", Path(path),
                                  f"GPUs {default.fingerprint}: the catalog just measured here, {path} (GC3_AUTOTUNE)")
    return default


def _tuning_asked(env, fp: machine.Fingerprint, held: contextlib.ExitStack, log) -> bool:
    """Whether rank 0 should lead a tune now: GC3_AUTOTUNE asks for one and this process
    got the fingerprint's lock (kept in `held` until the tune ends)."""
    if not machine.autotune_settings(env)[0]:
        return False
    got = held.enter_context(machine.tuning_lock(fp, env))
    if not got and log is not None:
        log.warning("GC3_AUTOTUNE: another process is tuning GPUs %s (lock %s held); this one uses the default "
                    "meanwhile", fp, machine.lock_path(str(fp), env))
    return got


def autotune(exchange, device: int, fingerprint: str, env, log) -> Optional[str]:
    """Collective: the cached catalog's path on every rank, or None on every rank
    when measuring or storing failed (the log's warning says where and why)."""
    from . import perf, tune
    from .perf_gpu import Host
    from .tune_gpu import MeasuredTimer

    _, seconds, top = machine.autotune_settings(env)
    ranks, lead = exchange.size, exchange.rank == 0
    if lead:
        log.warning("GC3_AUTOTUNE: measuring a catalog for GPUs %s (%.0f s of measuring at most, sizes up to %d "
                    "bytes); later processes load it from %s", fingerprint, seconds, top, machine.cache_root(env))
    host = Host.over(exchange)
    results = prov = None
    error = ""
    try:
        sizes = perf.sweep(tune.SIZE_RANGE[0], max(top, tune.SIZE_RANGE[0]), tune.SIZE_FACTOR)
        colls = tune.applicable(ranks, 1, tune.COLLECTIVES)
        prior = tune.Prior(tune.ModelTimer(tune.COST, ranks))
        timer = MeasuredTimer(host, max(sizes), device=device)
        try:
            results = tune.tune(ranks, 1, colls, sizes, tune.FULL, timer,
                                (lambda line: log.info("GC3_AUTOTUNE: %s", line)) if lead else (lambda line: None),
                                tune.Budget(seconds, agree=host.bcast), prior)
        finally:
            timer.close()
        prov = tune.provenance(timer, ranks, 1, sizes, tune.FULL, results,
                               f"GC3_AUTOTUNE=1 {machine.ENV_AUTOTUNE_S}={seconds:g} "
                               f"{machine.ENV_AUTOTUNE_MAX}={top} ({ranks} ranks)", prior)
        prov["fingerprint"] = fingerprint      # the communicator's agreed one, which the cache is keyed by
    except Exception as exc:   # every rank learns it below; then the default serves, as without tuning
        error = f"rank {exchange.rank}: {type(exc).__name__}: {exc}"
    errors = [e for e in exchange.allgather(error) if e]
    if errors:
        if lead:
            log.warning("GC3_AUTOTUNE failed, nothing cached: %s", "; ".join(errors))
        return None
    path = None
    if lead:
        try:
            path = str(machine.store(fingerprint, lambda folder: tune.write_catalog(
                results, folder / machine.CATALOG, ranks, prov), env))
            log.warning("GC3_AUTOTUNE: cached %s for GPUs %s", path, fingerprint)
        except Exception as exc:   # an unwritable cache, an IR that fails its proof: say so, serve the default
            log.warning("GC3_AUTOTUNE: measured, but the catalog could not be cached in %s: %s: %s",
                        machine.cache_root(env), type(exc).__name__, exc)
    return exchange.bcast(path)
