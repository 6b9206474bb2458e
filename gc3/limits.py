"""Limits that the verifier checks and the CUDA runtime is built with.

They live in one place so that a schedule `gc3 check` accepts is one the
runtime can execute: the runtime sizes its FIFOs and tables from these values.
"""

# Slots per (peer, channel) connection FIFO.  A send step occupies one slot
# until the receiver's matching step has consumed it.
FIFO_SLOTS = {"Simple": 8, "LL": 8, "LL128": 8}

# Threadblocks per rank: all TBs of a rank run as one cooperative launch, so
# they must be co-resident.  132 SMs on H100/H200; keep headroom for the copy
# engines and a second communicator.
MAX_TBS = 128
MAX_STEPS_PER_TB = 1024
MAX_CNT = 256              # chunks one step may move
# 64: on 2 GPUs a 2-TB-per-channel schedule needs 64 channels to put 64 SMs on the link.
MAX_CHANNELS = 64
MAX_REDUCE_FANIN = 8       # consecutive `re` steps into one dst fused into one pass

# --- FIFO slots and tiles ------------------------------------------------------
# Bytes per FIFO slot (the runtime's default; GC3_SLOT_BYTES_<PROTO> overrides
# it there).  LL slots hold 16-byte lines carrying 8 data bytes; LL128 slots
# hold 128-byte lines of 16 8-byte words, 15 of data and one flag.
SLOT_BYTES = {"Simple": 256 << 10, "LL": 32 << 10, "LL128": 256 << 10}
TILE_GRANULE_BYTES = 16    # the runtime tiles in whole 16-byte granules
LL128_LINE_BYTES = 128
LL128_LINE_DATA_BYTES = 120
# Protocols whose slots carry their ready flag inside the data (no tail word):
# a receiver reads each line as it lands.
FLAGGED_PROTOCOLS = ("LL", "LL128")


def slot_data_bytes(proto: str, slot_bytes: int) -> int:
    """Data bytes a slot of `slot_bytes` holds under `proto`."""
    if proto == "LL":
        return slot_bytes // 2
    if proto == "LL128":
        return slot_bytes // LL128_LINE_BYTES * LL128_LINE_DATA_BYTES
    return slot_bytes


def slot_align(proto: str) -> int:
    """Slot sizes must be multiples of this: an LL128 line must not straddle
    a 128-byte boundary, or its store is no longer one transaction."""
    return LL128_LINE_BYTES if proto == "LL128" else 64


def tile_granule_bytes(proto: str) -> int:
    """Tiles are whole multiples of this many bytes.  LL128: 240, the least
    common multiple of the 16-byte granule and a line's 120 data bytes, so
    every chunk-tile fills whole lines and cnt tiles fit the slot's lines."""
    return 240 if proto == "LL128" else TILE_GRANULE_BYTES


def tile_elems(cs: int, itemsize: int, slot_data: int, max_cnt: int, tiles: int = 1, min_bytes: int = 0,
               granule_bytes: int = TILE_GRANULE_BYTES) -> int:
    """Elements per tile of a chunk of `cs` elements (the runtime's rule, which
    the cost model replays): as many as a slot of `slot_data` bytes holds for
    the largest transfer (`max_cnt` chunks), in whole granules, and no more than
    the chunk needs -- or, with `tiles` > 1, small enough that a chunk makes
    `tiles` tiles (so the steps of one chunk pipeline across FIFO slots) but no
    smaller than `min_bytes`.  0 when a slot cannot hold one granule per chunk.
    `granule_bytes`: tile_granule_bytes(proto)."""
    g = max(granule_bytes // itemsize, 1)
    fit = slot_data // (max_cnt * itemsize) // g * g
    if fit < g:
        return 0
    lanes = cs
    if tiles > 1:
        lanes = min(cs, max(-(-cs // tiles), min_bytes // itemsize))
    return min(fit, max(g, -(-lanes // g) * g))

# --- input bounds -------------------------------------------------------------
# Every reader (XML, DSL, CLI, catalog) checks sizes against these before it
# allocates anything, so a bad input is refused in milliseconds and little
# memory, and every accepted value fits the runtime's int32 tables.
MAX_RANKS = 1024               # ranks of one program (ngpus, num_ranks)
MAX_CHUNKS = 1 << 16           # chunks of one buffer of one rank (i/o/s_chunks, chunk offsets)
MAX_TOTAL_CHUNKS = 1 << 20     # chunks of all buffers of all ranks together
MAX_INSTANCES = 64             # instances= / --instances
MAX_BYTES = 1 << 40            # bytes of one call's buffer (sizes, minBytes/maxBytes, --size)
MAX_SIMULATED_BYTES = 8 << 30  # default of GC3_SIM_MAX_BYTES: `gc3 simulate`'s estimated peak memory
INT32_MAX = (1 << 31) - 1      # any other integer field of the IR (ids, deps, step numbers)

# --- Small-message allreduce kernels (runtime_cuda/ranks/small_allreduce.py) -----------
# The dedicated one-shot/two-shot LL kernels serve allreduce calls up to
# SMALL_ALLREDUCE_MAX_BYTES; each rank's scratch is sized once per communicator
# for the largest call its catalog gives them (SMALL_ALLREDUCE_DEFAULT_BYTES
# where it says nothing).  A call runs one LL line (8 data bytes) per thread,
# in as many blocks as that takes (of small_allreduce_threads each), up to
# SMALL_ALLREDUCE_BLOCKS per rank (fewer where the GPU cannot hold them all):
# through the drop-in on 2x H200 (2026-11-23), 256 KiB took 7.4 us with 16
# blocks and 5.8 with 64; 2 MiB 36 us with 16, 17.5 with 128 and 16.9 with 240.
# "oneshot_ll128" and "twoshot_ll128" are the same on LL128 lines (LL128_LINE_DATA_BYTES of
# data and a flag word in each 128-byte line, 8 threads a line), where LL lines carry as many
# flag bytes as data: fewer bytes across the links for the same call, and a second read of
# each line after its flag (prims_ll128.cuh) on the way.
SMALL_ALLREDUCE_KERNELS = ("oneshot", "twoshot", "oneshot_ll128", "twoshot_ll128")
SMALL_LL128_KERNELS = ("oneshot_ll128", "twoshot_ll128")
SMALL_TWO_SHOT_KERNELS = ("twoshot", "twoshot_ll128")
# The same kernel and scratch serve allgather and reducescatter in one shot (a
# rank puts its block, or each peer's segment, straight into that peer's
# scratch); their sizes are nccl-tests' (the larger buffer), so one rank's block
# is 1/n of it and the scratch holds blocks of up to its max bytes.
SMALL_KERNELS = {"allreduce": SMALL_ALLREDUCE_KERNELS, "allgather": ("oneshot", "oneshot_ll128"),
                 "reducescatter": ("oneshot", "oneshot_ll128")}
SMALL_ALLREDUCE_MAX_BYTES = 2 << 20
SMALL_ALLREDUCE_DEFAULT_BYTES = 256 << 10
SMALL_ALLREDUCE_BLOCKS = 128
SMALL_ALLREDUCE_THREADS = 512       # the most a block has (the kernels' launch bound)
SMALL_ALLREDUCE_MIN_THREADS = 128
SMALL_ALLREDUCE_LINE_DATA_BYTES = 8


def small_kernel_block_bytes(collective: str, nbytes: int, nranks: int) -> int:
    """Bytes of one rank's block in a small-kernel call of nccl-tests size `nbytes`:
    what its scratch slots and its grid are sized by (allreduce: the whole buffer)."""
    return nbytes if collective == "allreduce" else -(-nbytes // max(nranks, 1))


def small_kernel_protocol(kernel: str) -> str:
    """The lines a small-message kernel moves."""
    return "LL128" if kernel in SMALL_LL128_KERNELS else "LL"


def small_kernel_phases(kernel: str) -> int:
    """Rounds of lines a call of a small-message kernel waits for: 1 (one-shot: every rank's
    input), or 2 (two-shot: a reduce-scatter's lines, then the owners' reduced segments)."""
    return 2 if kernel in SMALL_TWO_SHOT_KERNELS else 1


def small_kernel_lanes(nbytes: int, kernel: str = "oneshot") -> int:
    """Threads one rank's block of `nbytes` keeps busy in a small-kernel call: an LL line
    (SMALL_ALLREDUCE_LINE_DATA_BYTES) each, or for an LL128 kernel 8 a 128-byte line."""
    if small_kernel_protocol(kernel) == "LL128":
        return -(-nbytes // LL128_LINE_DATA_BYTES) * (LL128_LINE_BYTES // 16)
    return -(-nbytes // SMALL_ALLREDUCE_LINE_DATA_BYTES)


def small_allreduce_threads(nbytes: int, max_blocks: int = SMALL_ALLREDUCE_BLOCKS, kernel: str = "oneshot") -> int:
    """Threads a block of one small-kernel call of `nbytes`: a lane per thread in at most
    `max_blocks` blocks, in whole warps, at least SMALL_ALLREDUCE_MIN_THREADS.  Small blocks
    start sooner: on 4 and 2 H100s (2026-11-27) a 1-64 KiB call replayed in a CUDA graph took
    0.1-0.4 us less in blocks of 64-256 threads than of 512, and a call with more lines than
    the blocks' threads (256 KiB at 2 ranks) took 0.6 us more in blocks of 128."""
    lines = small_kernel_lanes(nbytes, kernel)
    per_block = -(-lines // max(max_blocks, 1))
    warps = -(-per_block // 32)
    return max(SMALL_ALLREDUCE_MIN_THREADS, min(SMALL_ALLREDUCE_THREADS, 32 * warps))


def small_allreduce_blocks(nbytes: int, max_blocks: int = SMALL_ALLREDUCE_BLOCKS,
                           threads: int = SMALL_ALLREDUCE_THREADS, kernel: str = "oneshot") -> int:
    """Blocks per rank of one small-kernel call of `nbytes` in blocks of `threads`: a lane per
    thread, within [1, max_blocks]."""
    lines = small_kernel_lanes(nbytes, kernel)
    return max(1, min(max_blocks, -(-lines // threads)))
