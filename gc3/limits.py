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
