"""AllReduce with a fused elementwise epilogue (CoCoNet's AllReduce + elementwise
fusion): y = cast(scale * sum_r x_r + bias + residual), stored as each reduced
chunk is, with no second pass over y.

Parameters (positional ints, defaults in brackets): ranks N [4], variant [2]
(1: one-shot, 2: ring), cols [64] (the row length of y: the bias is a vector of
cols elements broadcast over rows), cast [1] (1: deliver bfloat16, for fp32
calls: fp32 accumulation, bf16 out; 0: the call's dtype).  The scale is 1/N.
From Python, `epilogue` (items as gc3.ir.epilogue.make takes them, e.g.
[("scale", 0.5), ("bias", "bias")]) replaces that default and `cast`; `cols`
then counts only with a bias.  runtime_cuda.fused.allreduce_epilogue runs it on
the GPU (without cast, which the interpreter does not apply).

The epilogue (gc3.ir.epilogue) is a collective option; the compiler puts it on the
step that stores each output chunk's final value (in the ring, the last
reduction and every all-gather receive: each rank applies it to what it stores
and forwards the raw sum), and `gc3 check` proves every output chunk gets it
exactly once.  Named inputs: `bias` [cols], `residual` (the output's layout).

    gc3 compile gc3/algorithms/fused/allreduce_epilogue.py -o ar_epi.xml && gc3 simulate ar_epi.xml
"""
from gc3 import Check, GC3Program, chunk, int_args
from gc3.ir.collectives import AllReduce
from gc3.topology import fully_connected


def allreduce_epilogue(num_ranks: int = 4, variant: int = 2, cols: int = 64, cast: int = 1,
                       epilogue=None) -> GC3Program:
    n = num_ranks
    if variant not in (1, 2):
        raise ValueError(f"variant must be 1 (one-shot) or 2 (ring), got {variant}")
    if epilogue is None:
        items = [("scale", 1.0 / n), ("bias", "bias"), ("residual", "residual")]
        items += [("cast", "bfloat16")] if cast else []
    else:
        items = list(epilogue)
    has_bias = any((it if isinstance(it, str) else it[0]) == "bias" for it in items)
    c = n if variant == 2 else 1
    coll = AllReduce(num_ranks=n, chunk_factor=c, inplace=True, epilogue=items, cols=cols if has_bias else None)
    name = "allreduce_epilogue_" + ("ring" if variant == 2 else "oneshot")
    with GC3Program(name, coll, topology=fully_connected(n), protocol="Simple") as prog:
        if variant == 2:
            for r in range(n):
                ch = chunk((r + 1) % n, "in", r)
                for step in range(1, n):
                    ch = chunk((r + 1 + step) % n, "in", r).reduce(ch)
                for step in range(n - 1):
                    ch = ch.copy((r + 1 + step) % n, "in", r)
        else:
            for r in range(n):
                for k, peer in enumerate(p for p in range(n) if p != r):
                    chunk(peer, "in", 0).copy(r, "scratch", k)
            for r in range(n):
                mine = chunk(r, "in", 0)
                for k in range(n - 1):
                    mine = mine.reduce(chunk(r, "scratch", k))
        Check()
    return prog


def main(argv=None) -> GC3Program:
    return allreduce_epilogue(*int_args(argv, ranks=4, variant=2, cols=64, cast=1))


if __name__ == "__main__":
    main()
