"""Send/receive matching: the k-th receive on a connection takes the k-th send.

A connection is a FIFO, so pairing is positional.  Counts must agree for the
pair to move the same tile; in msccl-tools' convention the remote operands
each side names must also agree with the other side's local ones.
"""
from __future__ import annotations

from ..errors import FifoOrderError, UnmatchedTransferError
from ..ir import Convention, Step
from .model import Model


def check(m: Model) -> int:
    """Raise on the first connection whose transfers do not pair up; return the number of pairs."""
    pairs = 0
    msccl = m.prog.convention == Convention.MSCCL
    for conn in m.connections:
        sends = m.sends.get(conn, [])
        recvs = m.recvs.get(conn, [])
        if len(sends) != len(recvs):
            raise UnmatchedTransferError(_unmatched(m, conn, sends, recvs))
        for k, ((st_tb, st_k), (rt_tb, rt_k)) in enumerate(zip(sends, recvs)):
            s = m.tbs[st_tb].steps[st_k]
            r = m.tbs[rt_tb].steps[rt_k]
            pair = f"send #{k} on {conn} ({m.tbs[st_tb].at(st_k)}) and its receive ({m.tbs[rt_tb].at(rt_k)})"
            if s.cnt != r.cnt:
                raise FifoOrderError(f"{pair} move different counts: cnt={s.cnt} vs cnt={r.cnt}")
            if msccl:
                _check_msccl_operands(pair, s, r)
        pairs += len(sends)
    return pairs


def _check_msccl_operands(pair: str, s: Step, r: Step) -> None:
    # msccl-tools writes a send's dst as the receiver's location and a
    # receive's src as the sender's.  A fused receive-and-send keeps its own
    # location only in dst (msccl-tools fuses only when the two locations are
    # equal), so the sender's location is comparable only for a plain `s`.
    if (s.dstbuf, s.dstoff) != (r.dstbuf, r.dstoff):
        raise FifoOrderError(
            f"{pair}: the send targets {s.dstbuf}[{s.dstoff}] but the receiver stores into {r.dstbuf}[{r.dstoff}]")
    if s.type == "s" and (s.srcbuf, s.srcoff) != (r.srcbuf, r.srcoff):
        raise FifoOrderError(
            f"{pair}: the receive names the source {r.srcbuf}[{r.srcoff}] but the sender reads {s.srcbuf}[{s.srcoff}]")


def _unmatched(m: Model, conn, sends, recvs) -> str:
    if not recvs:
        tb, k = sends[0]
        if conn not in m.receiver:
            return (f"{m.tbs[tb].at(k)} sends to rank {conn.dst} on chan {conn.chan}, "
                    f"but no threadblock of rank {conn.dst} receives from rank {conn.src} on chan {conn.chan}")
    if not sends and conn not in m.sender:
        tb, k = recvs[0]
        return (f"{m.tbs[tb].at(k)} receives from rank {conn.src} on chan {conn.chan}, "
                f"but no threadblock of rank {conn.src} sends to rank {conn.dst} on chan {conn.chan}")
    n = min(len(sends), len(recvs))
    if len(recvs) > n:
        tb, k = recvs[n]
        return (f"{m.tbs[tb].at(k)} is receive #{n} on {conn}, but the connection carries only "
                f"{len(sends)} sends ({len(recvs)} receives): it would wait forever")
    tb, k = sends[n]
    return (f"{m.tbs[tb].at(k)} is send #{n} on {conn}, but the connection has only "
            f"{len(recvs)} receives ({len(sends)} sends): the tile is never consumed")
