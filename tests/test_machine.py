"""The default catalog by the GPUs' fingerprint (runtime_cuda/nccl/machine.py), on the CPU:
the fingerprint from `nvidia-smi` text, the shipped catalogs, the unknown-machine rule,
the cache (atomic, refused when foreign, safe under concurrent writers) and the
communicator's agreement on all of it."""
import json
import logging
import multiprocessing
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gc3.errors import InputError
from runtime_cuda.nccl import autotune
from runtime_cuda.nccl import machine as m
from runtime_cuda.nccl.call import Call
from runtime_cuda.nccl.catalog import DEFAULT_INDEX, load_catalog
from runtime_cuda.nccl.constants import NCCL_FLOAT32, NCCL_SUM
from runtime_cuda.nccl.selection import select

ROOT = Path(__file__).resolve().parents[1]
TOPO = (ROOT / "tests" / "data" / "nvidia_smi_topo_4xh100.txt").read_text()   # 4x H100, 2026-11-26
# `nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader` on that machine
BUS_IDS = "0, 00000000:00:06.0\n1, 00000000:00:07.0\n2, 00000000:00:08.0\n3, 00000000:00:09.0\n"
H100 = "NVIDIA H100 80GB HBM3"
MIXED_TOPO = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tNV12\tSYS\tSYS\t0-31
GPU1\tNV12\t X \tSYS\tSYS\t0-31
GPU2\tSYS\tSYS\t X \tNV12\t32-63
GPU3\tSYS\tSYS\tNV12\t X \t32-63
"""


def links_of(topo_text=TOPO, ids=BUS_IDS):
    def run(cmd, **kw):
        import subprocess
        return subprocess.CompletedProcess(cmd, 0, topo_text if "topo" in cmd else ids, "")
    return m.host_links(run)


def dev(i, host="node0", model=H100):
    """CUDA's bus id spelling for nvidia-smi's GPU i of the test machine."""
    return m.Device(host, m.bus_id(f"0000:00:0{6 + i}.0"), model)


def fp(n, link="NV18", model=H100):
    return m.Fingerprint((model,) * n, (link,) * (n * (n - 1) // 2))


# --- the fingerprint ---------------------------------------------------------------------

def test_the_fingerprint_of_the_measured_machine_and_of_its_subsets():
    links = links_of()
    assert str(m.fingerprint_of([dev(i) for i in range(4)], links)) == "4xNVIDIA H100 80GB HBM3|NV18-all"
    # CUDA_VISIBLE_DEVICES=1,3: the communicator's two GPUs, not the machine's four
    two = m.fingerprint_of([dev(3), dev(1)], links)
    assert str(two) == "2xNVIDIA H100 80GB HBM3|NV18-all" and two.ranks == 2 and two.all_nvlink
    assert two.slug == "2xNVIDIA-H100-80GB-HBM3-NV18-all"


def test_pairs_that_differ_are_listed_in_rank_order():
    links = links_of(MIXED_TOPO)
    got = m.fingerprint_of([dev(0), dev(1), dev(2)], links)
    assert got.links == ("NV12", "SYS", "SYS") and str(got) == "3xNVIDIA H100 80GB HBM3|NV12,SYS,SYS"
    assert not got.all_nvlink
    assert m.fingerprint_of([dev(2), dev(3)], links).all_nvlink


def test_shared_gpus_other_hosts_and_unknown_links():
    links = links_of()
    assert str(m.fingerprint_of([dev(0), dev(0)], links)) == "2xNVIDIA H100 80GB HBM3|SELF-all"
    four = m.fingerprint_of([dev(0), dev(1), dev(0, "node1"), dev(1, "node1")], links)
    assert four.links == ("NV18", "NET", "NET", "NET", "NET", "?")   # node1's own pair: not rank 0's host
    no_smi = m.host_links(lambda cmd, **kw: (_ for _ in ()).throw(FileNotFoundError(2, "No such file", "nvidia-smi")))
    assert "No such file" in no_smi.why
    unknown = m.fingerprint_of([dev(0), dev(1)], no_smi)
    assert str(unknown) == "2xNVIDIA H100 80GB HBM3|?-all" and not unknown.all_nvlink
    mixed = m.fingerprint_of([dev(0), dev(1, model="NVIDIA H200")], links)
    assert str(mixed) == "2xNVIDIA H100 80GB HBM3+NVIDIA H200|NV18-all"
    assert str(m.fingerprint_of([dev(0)], links)) == "1xNVIDIA H100 80GB HBM3|none"


def test_bus_ids_are_compared_in_one_spelling():
    assert m.bus_id("00000000:0A:00.0") == m.bus_id("0000:0a:00.0") == "0000:0a:00.0"
    assert m.parse_bus_ids(BUS_IDS) == {f"0000:00:0{6 + i}.0": i for i in range(4)}


def test_the_fingerprint_of_a_tune_catalogs_provenance():
    prov = {"measured": True, "device": H100, "ranks": 2, "gpus": 2, "nodes": 1,
            "topology": m.parse_topology(TOPO)}            # the whole machine's 4 GPUs, NV18 between all
    assert m.fingerprint_of_provenance(prov) == "2xNVIDIA H100 80GB HBM3|NV18-all"
    assert m.fingerprint_of_provenance(dict(prov, gpus=1)) == "2xNVIDIA H100 80GB HBM3|SELF-all"
    assert m.fingerprint_of_provenance(dict(prov, topology=m.parse_topology(MIXED_TOPO))) is None
    assert m.fingerprint_of_provenance(dict(prov, measured=False)) is None
    assert m.fingerprint_of_provenance(dict(prov, ranks=4, gpus=2)) is None
    assert m.fingerprint_of_provenance(dict(prov, fingerprint="anything said")) == "anything said"


# --- what is shipped ------------------------------------------------------------------------

def shipped_folders():
    return sorted(p for p in m.MACHINES.iterdir() if p.is_dir())


def test_each_shipped_catalog_sits_in_its_fingerprints_folder():
    shipped = m.shipped_catalogs()
    assert set(shipped) >= {"4xNVIDIA H100 80GB HBM3|NV18-all", "2xNVIDIA H100 80GB HBM3|NV18-all"}
    assert sorted(p.parent for p in shipped.values()) == shipped_folders()
    for fingerprint, path in shipped.items():
        assert path.parent.name == m.slug(fingerprint)
        prov = json.loads(path.read_text())["provenance"]
        assert prov["measured"] is True and prov["shippable"] is True, path
        assert prov["ranks"] == int(fingerprint.split("x")[0])


@pytest.mark.parametrize("catalog", [m.SAFE_CATALOG] + [f / m.CATALOG for f in shipped_folders()],
                         ids=lambda p: p.parent.name if p.name == m.CATALOG else p.name)
def test_gc3_catalog_check_passes_every_shipped_catalog(catalog):
    from runtime_cuda.commands import cli

    res = CliRunner().invoke(cli(), ["catalog", "check", str(catalog)])
    assert res.exit_code == 0, res.output
    used = {e["file"] for e in json.loads(catalog.read_text())["algorithms"] if "file" in e}
    assert {p.name for p in catalog.parent.glob("*.xml")} == (used if catalog != m.SAFE_CATALOG else set()), \
        "a shipped folder holds exactly the IRs its catalog names"


def test_the_wheel_carries_every_shipped_folder():
    # (tomllib would read it, but only from Python 3.11; gc3 supports 3.10)
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    for folder in shipped_folders():
        rel = folder.relative_to(ROOT).as_posix()
        assert f'"share/gc3/{rel}" = ["{rel}/*"]' in lines, f"pyproject.toml's data-files lacks {rel}"
    assert '"share/gc3/ir_samples/machines" = ["ir_samples/machines/*.json"]' in lines


# --- the default, by fingerprint ---------------------------------------------------------------

@pytest.fixture
def cache(tmp_path):
    return {"GC3_CACHE_DIR": str(tmp_path / "cache")}


def call(nbytes, ranks, coll="allreduce", inplace=True):
    count = nbytes // 4 if coll == "allreduce" else nbytes // 4 // ranks
    buf = 1 << 20
    send = buf if inplace or coll != "allgather" else buf + 99 * nbytes
    if inplace and coll == "allgather":
        send = buf
    return Call(coll, send, buf if inplace else buf + 100 * nbytes, count, NCCL_FLOAT32,
                NCCL_SUM if coll != "allgather" else None, 0, ranks, 0, 0)


def test_a_fake_fingerprint_gets_only_the_safe_entries(cache):
    fake = m.Fingerprint(("Fake GPU 9000",) * 4, ("NV12",) * 6)
    default = m.choose(fake, cache)
    assert (default.origin, default.path) == ("unknown machine", m.SAFE_CATALOG)
    cands = load_catalog(cache, default).candidates
    safe = json.loads(m.SAFE_CATALOG.read_text())["algorithms"]
    assert [c.name for c in cands] == [e["name"] for e in safe]
    assert all(c.kernel and c.max_bytes <= 256 << 10 for c in cands)
    assert {c.ranks for c in cands} == {2, 4}
    # the old hand-picked 4-rank sample entries are not among them: 1 MiB goes to NCCL
    assert select(load_catalog(cache, default), call(1 << 20, 4)).candidate is None
    assert select(load_catalog(cache, default), call(64 << 10, 4)).candidate.name == "oneshot_allreduce_4r"
    assert select(load_catalog(cache, default), call(64 << 10, 4, inplace=False)).candidate.name == \
        "twoshot_allreduce_4r"
    for coll in ("alltoall", "broadcast", "reduce"):
        assert not [c for c in cands if c.collective == coll]
    eight = m.choose(m.Fingerprint(("Fake GPU 9000",) * 8, ("NV18",) * 28), cache)
    assert eight.path is None and "at 8 ranks" in eight.note, "8 ranks were never measured: NCCL serves them"


def test_gpus_not_all_on_nvlink_get_no_gc3_algorithm(cache, caplog):
    default = m.choose(m.Fingerprint((H100,) * 3, ("NV12", "SYS", "SYS")), cache)
    assert default.path is None
    assert load_catalog(cache, default).candidates == ()


def test_without_nccl_behind_it_a_communicator_keeps_the_sample_index(cache):
    default = m.choose(fp(2, "SELF"), cache, nccl=False)
    assert (default.origin, default.path) == ("no NCCL", DEFAULT_INDEX)


def test_a_matching_fingerprint_gets_the_shipped_catalog(cache):
    for n in (2, 4):
        default = m.choose(fp(n), cache)
        assert default.origin == "shipped" and default.path == m.MACHINES / fp(n).slug / m.CATALOG
        assert m.catalog_for(fp(n), cache) == default.path == m.catalog_for(str(fp(n)), cache)
        entries = json.loads(default.path.read_text())["algorithms"]
        assert len(load_catalog(cache, default).candidates) == len(entries)
    # a subset of the 4-GPU machine is a 2-GPU machine of its own: its own catalog
    assert m.choose(fp(2), cache).path != m.choose(fp(4), cache).path
    assert m.catalog_for(fp(3), cache) is None


def test_info_says_which_fingerprint_and_that_the_rest_goes_to_nccl(cache, capsys):
    env = dict(cache, GC3_DEBUG="INFO")
    load_catalog(env, m.choose(m.Fingerprint(("Fake GPU",) * 2, ("NV6",)), env))
    err = capsys.readouterr().err
    line = next(l for l in err.splitlines() if "no measured catalog matches" in l)
    assert "2xFake GPU|NV6-all" in line and "every other collective and size goes to NCCL" in line
    assert str(m.SAFE_CATALOG) in line


def test_a_user_override_always_wins(cache):
    env = dict(cache, GC3_CONFIG=str(DEFAULT_INDEX))
    cands = load_catalog(env, m.choose(fp(4), cache)).candidates
    assert {c.origin.split()[0] for c in cands} == {"GC3_CONFIG"}


# --- the cache -------------------------------------------------------------------------------

def small_catalog(fingerprint, tag="a"):
    """write(folder) for m.store: one IR (a sample) and one kernel entry, tagged to tell writes apart."""
    def write(folder: Path):
        shutil.copy(ROOT / "ir_samples" / "allreduce_ring_2r_Simple_i64.xml", folder / "ring.xml")
        folder.joinpath(m.CATALOG).write_text(json.dumps({"version": 1, "provenance": {
            "fingerprint": str(fingerprint), "tag": tag}, "algorithms": [
            {"file": "ring.xml", "collective": "allreduce", "ranks": 2, "name": f"ring_{tag}"},
            {"kernel": "oneshot", "ranks": 2, "max_bytes": 1024, "name": f"oneshot_{tag}"}]}))
    return write


def test_a_cached_catalog_comes_before_the_shipped_one(cache):
    path = m.store(fp(2), small_catalog(fp(2)), cache)
    assert path == m.cache_root(cache) / fp(2).slug / m.CATALOG
    default = m.choose(fp(2), cache)
    assert (default.origin, default.path) == ("cached", path) and m.catalog_for(fp(2), cache) == path
    assert [c.name for c in load_catalog(cache, default).candidates] == ["ring_a", "oneshot_a"]


def test_a_foreign_or_stale_cache_is_refused_by_fingerprint(cache, caplog):
    other = m.Fingerprint((H100,) * 2, ("PIX",))
    m.store(other, small_catalog(other), cache)
    # copied (or left) where this machine's fingerprint looks
    shutil.copytree(m.cache_root(cache) / other.slug, m.cache_root(cache) / fp(2).slug)
    log = logging.getLogger("test.machine")
    with caplog.at_level(logging.WARNING, logger="test.machine"):
        default = m.choose(fp(2), cache, log=log)
    assert default.origin == "shipped"
    msg = caplog.text
    assert "cached catalog" in msg and "refused" in msg and str(fp(2)) in msg and str(other) in msg
    # and a catalog that says nothing about its GPUs is no better
    (m.cache_root(cache) / fp(2).slug / m.CATALOG).write_text('{"version": 1, "algorithms": []}')
    assert m.cached_catalog(fp(2), cache) is None


def test_store_refuses_a_catalog_measured_on_other_gpus(cache):
    with pytest.raises(ValueError, match="measured on"):
        m.store(fp(2), small_catalog(fp(4)), cache)
    assert not list((m.cache_root(cache) / fp(2).slug).glob("ir-*"))
    assert not list((m.cache_root(cache) / fp(2).slug).glob(".tmp-*"))


def test_a_write_that_fails_midway_leaves_the_old_catalog_whole(cache, monkeypatch):
    first = m.store(fp(2), small_catalog(fp(2), "old"), cache)
    before = first.read_text()

    def broken(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(m.os, "replace", broken)
    with pytest.raises(OSError):
        m.store(fp(2), small_catalog(fp(2), "new"), cache)
    assert first.read_text() == before
    assert [c.name for c in load_catalog(cache, m.choose(fp(2), cache)).candidates] == ["ring_old", "oneshot_old"]
    folder = first.parent
    assert not list(folder.glob(".catalog-*")) and len(list(folder.glob("ir-*"))) == 1


def _writer(cache_dir, tag, rounds):
    env = {"GC3_CACHE_DIR": cache_dir}
    for _ in range(rounds):
        m.store(fp(2), small_catalog(fp(2), tag), env)


def test_two_concurrent_writers_never_leave_a_torn_cache(tmp_path):
    env = {"GC3_CACHE_DIR": str(tmp_path / "cache")}
    m.store(fp(2), small_catalog(fp(2), "seed"), env)
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_writer, args=(env["GC3_CACHE_DIR"], tag, 40)) for tag in ("x", "y")]
    for w in writers:
        w.start()
    reads = 0
    path = m.cached_catalog(fp(2), env)
    while any(w.is_alive() for w in writers) or reads < 20:
        catalog = json.loads(path.read_text())       # never half written
        tag = catalog["provenance"]["tag"]
        assert tag in ("seed", "x", "y")
        for e in catalog["algorithms"]:
            assert e["name"].endswith(tag)
            if "file" in e:
                assert (path.parent / e["file"]).is_file(), "a catalog names IRs that are gone"
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    final = load_catalog(env, m.choose(fp(2), env))
    assert len(final.candidates) == 2 and final.candidates[0].name in ("ring_x", "ring_y")


def _hold_lock(cache_dir, held, release):
    with m.tuning_lock(fp(2), {"GC3_CACHE_DIR": cache_dir}) as got:
        assert got
        held.set()
        release.wait(20)


def test_one_tuner_at_a_time(tmp_path):
    env = {"GC3_CACHE_DIR": str(tmp_path / "cache")}
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_lock, args=(env["GC3_CACHE_DIR"], held, release))
    other.start()
    assert held.wait(20)
    with m.tuning_lock(fp(2), env) as got:
        assert got is False
    release.set()
    other.join()
    with m.tuning_lock(fp(2), env) as got:
        assert got is True


# --- the communicator's agreement ------------------------------------------------------------

class Rank0Exchange:
    """Rank 0 of a 2-rank exchange whose peer describes `peer`; records what went over it."""

    def __init__(self, peer):
        self.peer, self.said, self.rank, self.size = peer, [], 0, 2

    def allgather(self, obj):
        self.said.append(("allgather", obj))
        return [obj, self.peer]

    def bcast(self, obj, root=0):
        self.said.append(("bcast", obj))
        return obj


@pytest.fixture
def this_host(monkeypatch):
    monkeypatch.setattr(m, "_this_host", lambda: links_of())


def test_agree_fingerprints_the_ranks_gpus_and_shares_rank_0s_choice(cache, this_host):
    ex = Rank0Exchange(dev(1))
    default = autotune.agree(ex, 0, cache, describe=lambda i: dev(i))
    assert default.origin == "shipped" and default.fingerprint == str(fp(2))
    assert [k for k, _ in ex.said] == ["allgather", "bcast"]
    unknown = autotune.agree(Rank0Exchange(dev(1, model="Fake")), 0, cache, describe=lambda i: dev(i))
    assert unknown.origin == "unknown machine" and unknown.path == m.SAFE_CATALOG


def test_a_rank_without_cuda_still_takes_part(cache, this_host):
    def no_cuda(i):
        raise ImportError("No module named 'cupy'")
    default = autotune.agree(Rank0Exchange(dev(1)), 0, cache, describe=no_cuda)
    assert default.origin == "unknown machine" and default.path is None     # "?" is no NVLink: NCCL serves


def test_bad_autotune_settings_stop_every_rank_naming_the_variable(cache, this_host):
    env = dict(cache, GC3_AUTOTUNE="1", GC3_AUTOTUNE_S="soon")
    ex = Rank0Exchange(dev(1, model="Fake"))
    with pytest.raises(InputError, match="GC3_AUTOTUNE_S='soon'"):
        autotune.agree(ex, 0, env, describe=lambda i: dev(i))
    assert ex.said[-1][0] == "bcast", "rank 0 answered its peers before stopping"
    with pytest.raises(InputError, match="GC3_AUTOTUNE_MAX_BYTES"):
        m.autotune_settings({"GC3_AUTOTUNE_MAX_BYTES": "lots"})
    assert m.autotune_settings({}) == (False, m.AUTOTUNE_S, m.AUTOTUNE_MAX_BYTES)
    assert m.autotune_settings({"GC3_AUTOTUNE": "1", "GC3_AUTOTUNE_S": "20", "GC3_AUTOTUNE_MAX_BYTES": "64K"}) == \
        (True, 20.0, 65536)


def test_autotune_waits_for_no_one_when_another_process_tunes(cache, this_host, monkeypatch, caplog):
    env = dict(cache, GC3_AUTOTUNE="1")
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    fake = m.Fingerprint(("Fake",) * 2, ("?",))     # what agree computes for these devices on this host
    other = ctx.Process(target=_hold_lock_for, args=(env["GC3_CACHE_DIR"], str(fake), held, release))
    other.start()
    try:
        assert held.wait(20)
        import runtime_cuda.nccl.autotune as at
        monkeypatch.setattr(at, "autotune", lambda *a: pytest.fail("tuned while another process held the lock"))
        log = logging.getLogger("test.machine")
        with caplog.at_level(logging.WARNING, logger="test.machine"):
            default = autotune.agree(Rank0Exchange(m.Device("h", "x", "Fake")), 0, env, log=log,
                              describe=lambda i: m.Device("h", "y", "Fake"))
        assert default.origin == "unknown machine" and "another process is tuning" in caplog.text
    finally:
        release.set()
        other.join()


def _hold_lock_for(cache_dir, fingerprint, held, release):
    with m.tuning_lock(fingerprint, {"GC3_CACHE_DIR": cache_dir}) as got:
        assert got
        held.set()
        release.wait(20)


def test_autotune_runs_when_asked_and_the_next_choice_is_its_cache(cache, this_host, monkeypatch):
    import runtime_cuda.nccl.autotune as at
    env = dict(cache, GC3_AUTOTUNE="1")
    fake = m.Fingerprint(("Fake",) * 2, ("?",))
    tuned = []

    def fake_tune(exchange, device, fingerprint, env_, log):
        tuned.append(fingerprint)
        return str(m.store(fingerprint, small_catalog(fingerprint), env_))
    monkeypatch.setattr(at, "autotune", fake_tune)
    first = autotune.agree(Rank0Exchange(m.Device("h", "x", "Fake")), 0, env, describe=lambda i: m.Device("h", "y", "Fake"))
    assert tuned == [str(fake)] and first.origin == "cached"
    again = autotune.agree(Rank0Exchange(m.Device("h", "x", "Fake")), 0, env, describe=lambda i: m.Device("h", "y", "Fake"))
    assert tuned == [str(fake)] and (again.origin, again.path) == ("cached", first.path)


def test_the_communicator_serves_its_machines_catalog(cache, this_host, monkeypatch):
    from test_nccl_dispatch import RecordingGc3, RecordingNccl, stand_in_comm

    for var in ("GC3_CONFIG", "GC3_XML_FILES", "MSCCL_XML_FILES", "GC3_AUTOTUNE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GC3_CACHE_DIR", cache["GC3_CACHE_DIR"])
    monkeypatch.setattr(m, "local_device", lambda i: dev(i))

    def comm_for(peer, **kw):
        log = []
        return stand_in_comm(RecordingNccl(log), 2, 0, lambda *a: RecordingGc3(log), exchange=Rank0Exchange(peer),
                             **kw), log

    comm, log = comm_for(dev(1))
    assert comm.machine.origin == "shipped" and comm.machine.fingerprint == str(fp(2))
    shipped = json.loads(comm.machine.path.read_text())["algorithms"]
    first = next(e for e in shipped if e["collective"] == "allreduce" and e["inplace"] and e["min_bytes"] == 0)
    assert comm.submit("allreduce", 0x1000, 0x1000, 256, NCCL_FLOAT32, NCCL_SUM, 7) == first["name"]

    comm, log = comm_for(dev(1, model="Fake GPU"))
    assert comm.machine.path == m.SAFE_CATALOG
    assert comm.submit("allreduce", 0x1000, 0x1000, 1 << 18, NCCL_FLOAT32, NCCL_SUM, 7) == "NCCL"   # 1 MiB
    assert comm.submit("allreduce", 0x1000, 0x1000, 256, NCCL_FLOAT32, NCCL_SUM, 7) == "oneshot_allreduce_2r"

    comm, _ = comm_for(dev(0, model="Fake GPU"), nccl=False)      # ranks sharing a GPU, no NCCL behind them
    assert comm.machine.path == DEFAULT_INDEX

    monkeypatch.setenv("GC3_CONFIG", str(DEFAULT_INDEX))
    ex = Rank0Exchange(dev(1))
    comm = stand_in_comm(RecordingNccl([]), 2, 0, lambda *a: RecordingGc3([]), exchange=ex)
    assert comm.machine is None and ex.said == [], "a user override costs no fingerprinting"


def test_gc3_tune_install_is_measured_and_replaces_o():
    from runtime_cuda.commands import cli

    res = CliRunner().invoke(cli(), ["tune", "--model-only", "--ranks", "2", "--install"])
    assert res.exit_code == 2 and "--install stores a measured catalog" in res.output
    res = CliRunner().invoke(cli(), ["tune", "--model-only", "--ranks", "2"])
    assert res.exit_code == 2 and "-o FILE" in res.output


def test_the_readme_lists_every_shipped_catalog():
    readme = (ROOT / "README.md").read_text()
    for fingerprint in m.shipped_catalogs():
        assert f"`{fingerprint}`" in readme, f"README.md does not list the shipped catalog for {fingerprint}"


def test_a_host_over_a_rendezvous_sums_as_mpi_would():
    """What autotune measures over: perf_gpu.Host on the communicator's exchange, not on MPI."""
    from runtime_cuda.nccl.perf_gpu import Host

    class TwoRanks:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def allgather(self, obj):
            return [3, obj]

        def bcast(self, obj, root=0):
            return "rank 0's"

    host = Host.over(TwoRanks())
    assert (host.rank, host.size) == (1, 2)
    assert host.total(4) == 7 and host.mean(5.0) == 4.0 and host.bcast("mine") == "rank 0's"
    with pytest.raises(NotImplementedError):
        host.comm.allreduce(1, op="min")
