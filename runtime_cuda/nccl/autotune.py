"""First-use tuning (GC3_AUTOTUNE=1): `gc3 tune`'s measured path, run by a
communicator's own processes when it is created on GPUs that no cached or
shipped catalog was measured on (`machine.agree` decides, and holds the
fingerprint's lock on rank 0 meanwhile, so one process tunes at a time).

The ranks time every candidate over the communicator's rendezvous
(`perf_gpu.Host.over`) against NCCL in the same processes, on the full grid,
within GC3_AUTOTUNE_S seconds of measuring, sizes 1 KiB to
GC3_AUTOTUNE_MAX_BYTES (`machine.autotune_settings`); what the time does not
reach stays with NCCL.  Rank 0 stores the catalog in the cache for the
fingerprint (`machine.store`), where later processes find it.
"""
from __future__ import annotations

from typing import Optional

from . import machine


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
