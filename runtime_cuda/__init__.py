"""gc3's CUDA runtime: runs gc3/MSCCL XML IR with an interpreter kernel."""
