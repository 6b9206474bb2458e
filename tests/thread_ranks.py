"""Ranks as threads of one process, for the CPU tests of code that runs one rank per process."""
import threading


def run_ranks(n: int, rank, timeout: float) -> None:
    """rank(r) on a thread per rank r < n; every thread is joined and must have finished within
    `timeout` seconds of its join (a rank that hangs fails the test rather than passing it)."""
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"ranks {hung} still running after {timeout} s"
