"""What a step of a compiled IR waits for: its happens-before set (program order in its
threadblock, depid waits, the send each receive matches), shared by the fused tests."""


def happens_before(prog):
    """(steps {(rank, tb, k): Step}, before(key) -> frozenset of keys that happen before it)."""
    steps = {(g.id, tb.id, k): st for g in prog.gpus for tb in g.threadblocks for k, st in enumerate(tb.steps)}
    sent, recvd = {}, {}
    for g in prog.gpus:
        for tb in g.threadblocks:
            for k, st in enumerate(tb.steps):
                if st.info.send:
                    sent.setdefault((g.id, tb.send, tb.chan), []).append((g.id, tb.id, k))
                if st.info.recv:
                    recvd.setdefault((tb.recv, g.id, tb.chan), []).append((g.id, tb.id, k))
    sender = {rv: sd for c in recvd for sd, rv in zip(sent.get(c, []), recvd[c])}   # k-th send -> k-th receive
    memo = {}

    def before(key):
        if key not in memo:
            r, t, k = key
            st = steps[key]
            out = set()
            preds = [(r, t, k - 1)] if k else []
            if st.depid >= 0:
                preds.append((r, st.depid, st.deps))
            if key in sender:
                preds.append(sender[key])
            for p in preds:
                out |= before(p) | {p}
            memo[key] = frozenset(out)
        return memo[key]

    return steps, before
