"""`gc3.lower`: the compiler's lowering, finished with what it needs of the verifier.

A collective's epilogue goes on the steps that store each output chunk's final
value, and only a symbolic run of the lowered program says which those are
(`gc3.verify.semantics.place_epilogue`), so placing it proves the plain program
first.  The compiler sits below the verifier and takes that step as a parameter
(`gc3.compiler.pipeline.lower(place_epilogue=)`); this module, above both,
passes it.  Whatever compiles a program for use (`gc3.lower`, `gc3 compile`, the
simulator, the runtime's fused programs) lowers through here.
"""
from __future__ import annotations

from typing import Optional

from .compiler import pipeline
from .ir import Program
from .ir.epilogue import Epilogue
from .verify import semantics, verify

__all__ = ["lower", "place_epilogue"]


def place_epilogue(prog: Program, epi: Epilogue) -> None:
    """Prove the plain `prog`, then mark the steps that must apply `epi` (`prog.epilogue` set)."""
    verify(prog)
    semantics.place_epilogue(prog, epi)


def lower(program, *, instances: Optional[int] = None, protocol: Optional[str] = None,
          instr_fusion: Optional[bool] = None, max_tbs: Optional[int] = None,
          absorption: Optional[bool] = None, tb_merge: Optional[bool] = None) -> Program:
    """Compile a `ChunkDAG`, or a traced `GC3Program`'s; keyword arguments override its own settings.

    `absorption` (default: on whenever fusion is) can be turned off alone, to
    get the schedules compiled before it existed (measurements taken on them).
    `tb_merge` (default: on for LL) joins a channel's lone send and lone
    receive threadblocks (threadblocks.merge_lone_pairs).  A collective's
    epilogue is placed on the steps that store final output chunks, after the
    plain program is proven.
    """
    return pipeline.lower(program, instances=instances, protocol=protocol, instr_fusion=instr_fusion,
                          max_tbs=max_tbs, absorption=absorption, tb_merge=tb_merge,
                          place_epilogue=place_epilogue)
