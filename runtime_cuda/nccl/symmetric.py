"""NCCL's symmetric windows, reached through ctypes on the libnccl CuPy loaded.

NCCL >= 2.27 runs "symmetric" kernels for buffers that every rank allocated
with `ncclMemAlloc` and registered on the communicator with
`ncclCommWindowRegister(comm, buff, size, &win, NCCL_WIN_COLL_SYMMETRIC)`.
`cupy.cuda.nccl` cannot register windows, so this module binds the four calls
itself, on the very library CuPy already loaded (found in /proc/self/maps, so
no second libnccl with its own globals can sneak in) -- no wheel to carry.
The raw `ncclComm_t` is `cupy.cuda.nccl.NcclCommunicator.comm` (an intptr).

Facts from NCCL's src/nccl.h.in (2.27 .. 2.29, github.com/NVIDIA/nccl):
    ncclResult_t ncclMemAlloc(void** ptr, size_t size);
    ncclResult_t ncclMemFree(void* ptr);
    ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                        ncclWindow_t* win, int winFlags);
    ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
    #define NCCL_WIN_COLL_SYMMETRIC 0x01

Registration is collective and blocking: every rank must register the same
size in the same order, so a rank that cannot allocate must not register (its
peers would wait forever); `SymmetricBuffer.allocate` and `.register` are
separate steps so a caller can agree on the allocation first (perf_gpu does,
over MPI).  The window is deregistered before the memory is freed.

This is opt-in: nothing here ever registers a buffer it did not allocate.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from gc3.errors import CommunicatorError

WIN_COLL_SYMMETRIC = 0x01
MIN_VERSION = 22700          # 2.27.0: the first NCCL with ncclCommWindowRegister
SYMBOLS = ("ncclMemAlloc", "ncclMemFree", "ncclCommWindowRegister", "ncclCommWindowDeregister")

# ncclResult_t, as nccl.h numbers it (ncclTimeout appeared in 2.29).
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
           4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
           8: "ncclTimeout"}

# Settings under which NCCL registers nothing symmetric (it then silently runs its
# default kernels, and the column would measure default NCCL under another name).
_DISABLING_ENV = {"NCCL_CUMEM_ENABLE": "ncclMemAlloc needs cuMem", "NCCL_LOCAL_REGISTER": "window registration"}


class SymmetricError(CommunicatorError):
    """A symmetric-window call failed, or symmetric windows are not available here."""


def version_string(code: int) -> str:
    """NCCL's version code (22809) as 2.28.9."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def loaded_library_path(maps: Optional[str] = None) -> Optional[str]:
    """The libnccl mapped into this process (after `import cupy.cuda.nccl`), or None."""
    if maps is None:
        try:
            with open("/proc/self/maps") as fh:
                maps = fh.read()
        except OSError:
            return None
    for line in maps.splitlines():
        fields = line.split(None, 5)          # address perms offset dev inode path
        if len(fields) == 6 and "/libnccl.so" in fields[5]:
            return fields[5].strip()
    return None


@dataclass
class Availability:
    ok: bool
    reason: str          # why not, or what will be used
    version: int = 0     # NCCL's version code, 0 when unknown
    library: str = ""    # the libnccl file

    def __bool__(self) -> bool:
        return self.ok


def availability(lib=None, version: Optional[int] = None, library: str = "",
                 env: Mapping[str, str] = os.environ) -> Availability:
    """Whether this process can run NCCL on symmetric windows, with the reason.
    Without arguments it inspects the libnccl CuPy loaded; tests pass a stand-in
    `lib` (anything with the symbols as attributes) and a `version`."""
    if lib is None:
        try:
            from cupy.cuda import nccl
            version = nccl.get_version()
        except Exception as exc:   # ImportError, or cupy built without NCCL
            return Availability(False, f"cupy.cuda.nccl is not usable ({exc})")
        library = loaded_library_path() or ""
        if not library:
            return Availability(False, "cannot find the libnccl CuPy loaded in /proc/self/maps", version)
        try:
            lib = ctypes.CDLL(library)
        except OSError as exc:
            return Availability(False, f"cannot open {library}: {exc}", version, library)
    if version is None or version < MIN_VERSION:
        found = "unknown" if version is None else version_string(version)
        return Availability(False, f"NCCL {found} has no symmetric windows (needs >= {version_string(MIN_VERSION)})",
                            version or 0, library)
    missing = [s for s in SYMBOLS if not hasattr(lib, s)]
    if missing:
        return Availability(False, f"{library or 'libnccl'} ({version_string(version)}) lacks "
                            f"{', '.join(missing)}", version, library)
    for var, what in _DISABLING_ENV.items():
        if env.get(var, "").strip() == "0":
            return Availability(False, f"{var}=0 disables {what}", version, library)
    return Availability(True, f"NCCL {version_string(version)} ({library or 'libnccl'})", version, library)


class Api:
    """The four calls, typed, on one library; every non-zero result raises
    SymmetricError naming the call, the result code and NCCL's own text."""

    def __init__(self, lib):
        self.lib = lib
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for name, args in (("ncclMemAlloc", [ctypes.POINTER(vp), sz]), ("ncclMemFree", [vp]),
                           ("ncclCommWindowRegister", [vp, vp, sz, ctypes.POINTER(vp), ctypes.c_int]),
                           ("ncclCommWindowDeregister", [vp, vp])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        err = getattr(lib, "ncclGetErrorString", None)
        if err is not None:
            err.argtypes, err.restype = [ctypes.c_int], ctypes.c_char_p
        self._error_string: Optional[Callable[[int], bytes]] = err

    @classmethod
    def load(cls) -> "Api":
        """On the libnccl CuPy loaded; SymmetricError with the reason when unavailable."""
        avail = availability()
        if not avail:
            raise SymmetricError(f"NCCL symmetric windows are not available: {avail.reason}")
        return cls(ctypes.CDLL(avail.library))

    def check(self, call: str, result: int) -> None:
        if result == 0:
            return
        text = ""
        if self._error_string is not None:
            raw = self._error_string(result)
            text = ": " + (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw))
        raise SymmetricError(f"{call} returned {result} ({RESULTS.get(result, 'unknown ncclResult_t')}){text}")

    def mem_alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self.check(f"ncclMemAlloc({nbytes} bytes)", self.lib.ncclMemAlloc(ctypes.byref(ptr), nbytes))
        if not ptr.value:
            raise SymmetricError(f"ncclMemAlloc({nbytes} bytes) returned success but a null pointer")
        return ptr.value

    def mem_free(self, ptr: int) -> None:
        self.check(f"ncclMemFree({ptr:#x})", self.lib.ncclMemFree(ptr))

    def window_register(self, comm: int, ptr: int, nbytes: int, flags: int = WIN_COLL_SYMMETRIC) -> int:
        win = ctypes.c_void_p()
        self.check(f"ncclCommWindowRegister(comm {comm:#x}, {ptr:#x}, {nbytes} bytes, flags {flags:#x})",
                   self.lib.ncclCommWindowRegister(comm, ptr, nbytes, ctypes.byref(win), flags))
        if not win.value:
            raise SymmetricError(f"ncclCommWindowRegister(comm {comm:#x}, {ptr:#x}) returned success but no window")
        return win.value

    def window_deregister(self, comm: int, win: int) -> None:
        self.check(f"ncclCommWindowDeregister(comm {comm:#x}, window {win:#x})",
                   self.lib.ncclCommWindowDeregister(comm, win))


class SymmetricBuffer:
    """`nbytes` of ncclMemAlloc'd memory, registered on `comm` (a raw ncclComm_t)
    as a symmetric window by `register()` (collective: every rank, same size,
    same order).  `close()` deregisters (if registered) and then frees; closing
    twice does nothing.  `array(cupy)` views it as a CuPy uint8 array that does
    not own the memory."""

    def __init__(self, api: Api, comm: int, nbytes: int):
        if nbytes <= 0:
            raise SymmetricError(f"a symmetric buffer needs a positive size (got {nbytes} bytes)")
        self.api, self.comm, self.nbytes = api, int(comm), int(nbytes)
        self.ptr: Optional[int] = api.mem_alloc(self.nbytes)
        self.window: Optional[int] = None

    def register(self) -> None:
        if self.ptr is None:
            raise SymmetricError("register() on a closed symmetric buffer")
        if self.window is None:
            self.window = self.api.window_register(self.comm, self.ptr, self.nbytes, WIN_COLL_SYMMETRIC)

    def array(self, cupy):
        if self.ptr is None:
            raise SymmetricError("array() on a closed symmetric buffer")
        # ncclMemAlloc allocates on the current device; naming it spares CuPy a
        # pointer-attribute query on cuMem-mapped memory.
        mem = cupy.cuda.UnownedMemory(self.ptr, self.nbytes, self, cupy.cuda.Device().id)
        return cupy.ndarray((self.nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def close(self) -> None:
        # A window that failed to deregister keeps its memory: freeing memory NCCL
        # still maps for its peers would turn one error into a crash elsewhere.
        if self.window is not None:
            win, self.window = self.window, None
            try:
                self.api.window_deregister(self.comm, win)
            except SymmetricError:
                self.ptr = None          # leaked on purpose, see above
                raise
        if self.ptr is not None:
            ptr, self.ptr = self.ptr, None
            self.api.mem_free(ptr)

    def __enter__(self) -> "SymmetricBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
