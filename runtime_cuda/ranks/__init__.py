"""The ways ranks run a program on GPUs, over core/'s launch group: all ranks in one launch
(virtual), one process per GPU through CUDA IPC (ipc, and its check ipc_check), one process
driving every GPU through peer access (peer); and the small-message allreduce kernels' group
(small_allreduce), which runs on the same IPC or virtual ranks."""
