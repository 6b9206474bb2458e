"""NCCL symmetric windows for `gc3 bench --peer symmetric`, on the CPU: the
availability report, the ctypes bindings and their errors (on a stand-in
library, in Python and, where a C compiler exists, as a real shared object),
the buffer's register/deregister/free order, the agreement before registering,
the table's NCCL-sym column and the option.  The GPU run itself is the
multigpu test at the end (2 GPUs, one rank each)."""
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime_cuda.commands import bench, cli
from runtime_cuda.nccl import perf, symmetric

ROOT = Path(__file__).resolve().parents[1]


class FakeNccl:
    """libnccl's four calls as Python callables on ctypes' byref arguments; each
    call is logged, and `fail` maps a call name to the result code it returns."""

    def __init__(self, fail=None):
        self.log, self.fail, self.next = [], dict(fail or {}), 0x7000_0000

    def _result(self, name):
        return self.fail.get(name, 0)

    def ncclMemAlloc(self, pp, size):
        self.log.append(("alloc", size))
        if self._result("ncclMemAlloc"):
            return self._result("ncclMemAlloc")
        self.next += 0x10_0000
        pp._obj.value = self.next
        return 0

    def ncclMemFree(self, ptr):
        self.log.append(("free", ptr))
        return self._result("ncclMemFree")

    def ncclCommWindowRegister(self, comm, ptr, size, win, flags):
        self.log.append(("register", comm, ptr, size, flags))
        if self._result("ncclCommWindowRegister"):
            return self._result("ncclCommWindowRegister")
        win._obj.value = ptr + 1
        return 0

    def ncclCommWindowDeregister(self, comm, win):
        self.log.append(("deregister", comm, win))
        return self._result("ncclCommWindowDeregister")

    def ncclGetErrorString(self, result):
        return b"invalid usage (run with NCCL_DEBUG=WARN for details)" if result == 5 else b"some error"


class Lib:
    """An attribute bag: ctypes sets argtypes/restype on the bound methods'
    functions, which plain methods do not allow, so each is wrapped."""

    def __init__(self, fake, names=symmetric.SYMBOLS + ("ncclGetErrorString",)):
        for name in names:
            if hasattr(fake, name):
                method = getattr(fake, name)
                setattr(self, name, lambda *a, _m=method: _m(*a))


# --- availability -------------------------------------------------------------------

def test_available_with_every_symbol_and_a_new_enough_nccl():
    a = symmetric.availability(Lib(FakeNccl()), version=22809, library="/x/libnccl.so.2", env={})
    assert a and a.version == 22809 and "2.28.9" in a.reason and "/x/libnccl.so.2" in a.reason


@pytest.mark.parametrize("kwargs, env, words", [
    ({"version": 22605}, {}, ["2.26.5", "needs >= 2.27.0"]),
    ({"version": None}, {}, ["unknown", "needs >= 2.27.0"]),
    ({"version": 22809, "missing": ("ncclCommWindowRegister", "ncclMemFree")}, {},
     ["lacks", "ncclMemFree", "ncclCommWindowRegister"]),
    ({"version": 22809}, {"NCCL_CUMEM_ENABLE": "0"}, ["NCCL_CUMEM_ENABLE=0"]),
    ({"version": 22809}, {"NCCL_LOCAL_REGISTER": "0"}, ["NCCL_LOCAL_REGISTER=0"]),
])
def test_unavailable_says_why(kwargs, env, words):
    missing = kwargs.pop("missing", ())
    lib = Lib(FakeNccl(), names=[n for n in symmetric.SYMBOLS if n not in missing])
    a = symmetric.availability(lib, library="/x/libnccl.so.2", env=env, **kwargs)
    assert not a
    for w in words:
        assert w in a.reason, a.reason


def test_unavailable_without_cupy_here():
    pytest.importorskip("numpy")
    if "cupy" in sys.modules or shutil.which("nvidia-smi"):
        pytest.skip("this machine may have CuPy's NCCL")
    a = symmetric.availability()
    assert not a and "cupy.cuda.nccl is not usable" in a.reason


def test_the_loaded_library_is_found_in_the_maps():
    maps = ("7f00-7f10 r-xp 00000000 08:01 123 /usr/lib/libcudart.so.13\n"
            "7f20-7f30 r-xp 00000000 08:01 456 /opt/site/nvidia/nccl/lib/libnccl.so.2\n"
            "7f40-7f50 rw-p 00000000 00:00 0 \n")
    assert symmetric.loaded_library_path(maps) == "/opt/site/nvidia/nccl/lib/libnccl.so.2"
    assert symmetric.loaded_library_path("7f00-7f10 r-xp 0 08:01 1 /lib/libc.so.6\n") is None


# --- the calls and their errors ----------------------------------------------------------

def test_buffer_allocates_registers_then_deregisters_before_freeing():
    fake = FakeNccl()
    api = symmetric.Api(Lib(fake))
    buf = symmetric.SymmetricBuffer(api, 0xC0, 4096)
    buf.register()
    buf.register()                         # once only: registration is collective
    ptr, win = buf.ptr, buf.window
    buf.close()
    buf.close()
    assert fake.log == [("alloc", 4096), ("register", 0xC0, ptr, 4096, symmetric.WIN_COLL_SYMMETRIC),
                        ("deregister", 0xC0, win), ("free", ptr)]
    with pytest.raises(symmetric.SymmetricError, match="closed"):
        buf.register()


def test_an_unregistered_buffer_is_only_freed():
    fake = FakeNccl()
    with symmetric.SymmetricBuffer(symmetric.Api(Lib(fake)), 0xC0, 64):
        pass
    assert [e[0] for e in fake.log] == ["alloc", "free"]


def test_errors_name_the_call_and_the_result():
    fake = FakeNccl(fail={"ncclCommWindowRegister": 5})
    buf = symmetric.SymmetricBuffer(symmetric.Api(Lib(fake)), 0xC0, 4096)
    with pytest.raises(symmetric.SymmetricError) as err:
        buf.register()
    text = str(err.value)
    assert "ncclCommWindowRegister(comm 0xc0" in text and "4096 bytes" in text
    assert "returned 5 (ncclInvalidUsage): invalid usage" in text
    with pytest.raises(symmetric.SymmetricError, match=r"ncclMemAlloc\(64 bytes\) returned 1 "
                                                       r"\(ncclUnhandledCudaError\): some error"):
        symmetric.SymmetricBuffer(symmetric.Api(Lib(FakeNccl(fail={"ncclMemAlloc": 1}))), 0xC0, 64)
    with pytest.raises(symmetric.SymmetricError, match="positive size"):
        symmetric.SymmetricBuffer(symmetric.Api(Lib(FakeNccl())), 0xC0, 0)


def test_a_window_that_fails_to_deregister_keeps_its_memory():
    fake = FakeNccl(fail={"ncclCommWindowDeregister": 3})
    buf = symmetric.SymmetricBuffer(symmetric.Api(Lib(fake)), 0xC0, 64)
    buf.register()
    with pytest.raises(symmetric.SymmetricError, match="ncclCommWindowDeregister.*ncclInternalError"):
        buf.close()
    buf.close()
    assert "free" not in [e[0] for e in fake.log]


_C_STANDIN = r"""
#include <stddef.h>
#include <stdlib.h>
static size_t registered;
int ncclMemAlloc(void **p, size_t n) { *p = malloc(n); return *p ? 0 : 1; }
int ncclMemFree(void *p) { free(p); return 0; }
int ncclCommWindowRegister(void *comm, void *buf, size_t n, void **win, int flags) {
  if (flags != 1 || comm == NULL) return 4;
  registered = n; *win = (char *)buf + 1; return 0; }
int ncclCommWindowDeregister(void *comm, void *win) { return win && registered ? 0 : 5; }
size_t registered_bytes(void) { return registered; }
const char *ncclGetErrorString(int r) { return r == 4 ? "invalid argument" : "other"; }
"""


def test_the_bindings_on_a_real_shared_object(tmp_path):
    """The argtypes (pointer out-parameters, size_t, int flags) through ctypes into C."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, so = tmp_path / "standin.c", tmp_path / "libstandin.so"
    src.write_text(_C_STANDIN)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    assert symmetric.availability(lib, version=22809, library=str(so), env={})
    api = symmetric.Api(lib)
    with symmetric.SymmetricBuffer(api, 0xC0, 1 << 20) as buf:
        buf.register()
        assert buf.window == buf.ptr + 1 and lib.registered_bytes() == 1 << 20
    with pytest.raises(symmetric.SymmetricError, match=r"returned 4 \(ncclInvalidArgument\): invalid argument"):
        api.window_register(0, 0x1000, 64)


# --- agreeing before registering (perf_gpu.SymmetricPeer) ----------------------------------

class TwoRankHost:
    """What rank 0 sees of a 2-rank Host: rank 1's texts to `first`, in call order."""

    def __init__(self, *others):
        self.rank, self.size, self.others = 0, 2, list(others)

    def first(self, text):
        other = self.others.pop(0) if self.others else ""
        return text or other

    def bcast(self, obj):
        return obj


@pytest.fixture
def peer_env(monkeypatch):
    from runtime_cuda.nccl import perf_gpu

    fake = FakeNccl()
    monkeypatch.setattr(symmetric, "availability",
                        lambda: symmetric.Availability(True, "fake", 22809, "/x/libnccl.so.2"))
    monkeypatch.setattr(symmetric.Api, "load", classmethod(lambda cls: cls(Lib(fake))))
    monkeypatch.setattr(perf_gpu, "_nccl_comm", lambda host: type("Comm", (), {"comm": 0xC0})())
    monkeypatch.setattr(symmetric.SymmetricBuffer, "array", lambda self, cupy: ("array", self.ptr))
    monkeypatch.setitem(sys.modules, "cupy", type(sys)("cupy"))
    return perf_gpu, fake


def test_the_peer_registers_both_buffers_once_all_ranks_allocated(peer_env):
    perf_gpu, fake = peer_env
    peer = perf_gpu.SymmetricPeer(TwoRankHost(), 1 << 20)
    assert [e[0] for e in fake.log] == ["alloc", "alloc", "register", "register"]
    assert peer.sendbuf[1] != peer.recvbuf[1]
    peer.close()
    assert [e[0] for e in fake.log[4:]] == ["deregister", "free", "deregister", "free"]


def test_no_rank_registers_when_one_could_not_allocate(peer_env):
    perf_gpu, fake = peer_env
    with pytest.raises(symmetric.SymmetricError, match="cannot allocate its buffers: rank 1: ncclMemAlloc"):
        perf_gpu.SymmetricPeer(TwoRankHost("", "rank 1: ncclMemAlloc(1048576 bytes) returned 1"), 1 << 20)
    assert [e[0] for e in fake.log] == ["alloc", "alloc", "free", "free"]


def test_no_rank_goes_on_when_one_lacks_windows(peer_env, monkeypatch):
    perf_gpu, fake = peer_env
    with pytest.raises(symmetric.SymmetricError, match="not available: rank 1: NCCL 2.26.5"):
        perf_gpu.SymmetricPeer(TwoRankHost("rank 1: NCCL 2.26.5 has no symmetric windows"), 64)
    assert fake.log == []


# --- the table and the option ------------------------------------------------------------------

def sym_rows():
    rows = []
    for nbytes, g, n, s in ((1024, 5.0, 20.0, 10.0), (1 << 20, 30.0, 30.0, 60.0)):
        r = perf.Row("allreduce", nbytes, nbytes // 4, "float32", "sum", 0, 2)
        r.results["gc3"] = {p: perf.measure("allreduce", nbytes, 2, g, 0, "ll.xml") for p in perf.PLACES}
        r.results["nccl"] = {p: perf.measure("allreduce", nbytes, 2, n, 0, "NCCL") for p in perf.PLACES}
        r.results["nccl-sym"] = {p: perf.measure("allreduce", nbytes, 2, s, 0, "NCCL-sym") for p in perf.PLACES}
        rows.append(r)
    return rows


def test_the_table_has_a_symmetric_column_and_a_speedup_against_it():
    rows = sym_rows()
    impls = bench.impl_names("both", "symmetric")
    assert impls == ("gc3", "nccl", "nccl-sym")
    head = perf.header("allreduce", 2, "float32", "sum", impls)
    lines = [perf.format_row(r, impls) for r in rows]
    assert "NCCL-sym out-of-place" in head[1] and "vs NCCL-sym" in head[1]
    assert "speedup (NCCL time / gc3 time)" in head[1]
    bars = {tuple(i for i, ch in enumerate(line) if ch == "|") for line in head[2:] + lines}
    assert len({b[:6] for b in bars}) == 1 and len(next(iter(bars))) >= 6
    # 1 KiB: gc3 5 us, NCCL 20 us (4x), NCCL-sym 10 us (2x); 1 MiB: 1x and 2x
    assert lines[0].split("|")[-2].split() == ["4.00x", "4.00x"]
    assert lines[0].split("|")[-1].split() == ["2.00x", "2.00x", "ll.xml"]
    assert lines[1].split("|")[-1].split() == ["2.00x", "2.00x", "ll.xml"]
    foot = perf.footer(rows, impls)
    assert foot[2].startswith("# NCCL-sym: out of bounds values: 0 OK")
    rows[0].results["nccl-sym"]["ip"].wrong = 2
    assert perf.format_row(rows[0], impls).endswith("<- WRONG")
    assert perf.wrong_details(rows[0]) == ["#   NCCL-sym in-place 1024 B: 2 wrong; first: ?"]
    flat = perf.flat(rows[0])
    assert flat["speedup_oop"] == pytest.approx(4.0) and flat["speedup_sym_oop"] == pytest.approx(2.0)
    assert flat["nccl-sym_oop_time_us"] == 10.0


def test_the_default_table_is_unchanged_by_the_option():
    assert bench.impl_names("both", "default") == ("gc3", "nccl")
    assert bench.impl_names("nccl", "symmetric") == ("nccl", "nccl-sym")
    head = perf.header("allreduce", 2, "float32", "sum", ("nccl", "nccl-sym"))
    assert "speedup" not in " ".join(head)          # no gc3: nothing to compare


def test_the_option_is_parsed():
    main = cli()
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "--peer", "sym"])
    assert bad.exit_code == 2 and "'sym' is not one of 'default', 'symmetric'" in bad.output
    assert "--peer [default|symmetric]" in runner.invoke(main, ["bench", "--help"]).output
    try:
        import cupy  # noqa: F401
    except ImportError:
        out = runner.invoke(main, ["bench", "--peer", "symmetric", "-b", "1K", "-e", "4K"])
        assert out.exit_code == 2 and "needs cupy" in out.output


# --- on two GPUs --------------------------------------------------------------------------------

@pytest.mark.multigpu
def test_bench_with_the_symmetric_peer_on_two_gpus():
    """One rank per GPU (NCCL refuses two on one): every side checked at every size."""
    exe = shutil.which("mpirun")
    assert exe, "mpirun is not on PATH: the multi-process GPU tests need Open MPI"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [exe, "-np", "2", sys.executable, "-m", "runtime_cuda", "bench", "--peer", "symmetric",
           "-c", "allreduce", "-b", "1K", "-e", "1M", "-w", "2", "-n", "5"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "NCCL-sym out-of-place" in out and "vs NCCL-sym" in out, out[-3000:]
    rows = [line for line in out.splitlines() if line.strip() and not line.startswith("#")
            and line.split()[0].isdigit()]
    assert len(rows) == 11, out[-3000:]                   # 1 KiB .. 1 MiB, x2
    for line in rows:
        wrongs = [field.split()[-1] for field in line.split("|")[1:7]]
        assert wrongs == ["0"] * 6, line                  # gc3, NCCL, NCCL-sym; oop and ip
    assert "# NCCL-sym: out of bounds values: 0 OK" in out
