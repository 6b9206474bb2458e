"""Developers' benchmarks of the compiler side, which the tests also check: scripts/ wraps each
module's main()."""
