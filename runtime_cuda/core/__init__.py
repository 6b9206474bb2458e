"""The launch machinery every mode shares: the kernel ABI and build (abi, module), the device
tables and per-block rows (tables, block_rows), connections and buffer binding, the launch
(launcher) and the launch group's call path (group), stream discipline (streams), and the
host-side helpers around a launch (checking, perf, faults, stuck, avg).  It imports no other
subpackage of runtime_cuda."""
