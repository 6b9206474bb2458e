"""Stage 3's input and every later stage's vocabulary: the scheduled IR.

`program.py` holds the dataclasses (Program -> Gpu -> Threadblock -> Step) and
the opcode table, `xml_io.py` reads and writes the MSCCL XML, `layout.py` maps
chunks to memory for one call size.  `collectives.py` and `symbolic.py` specify
what each collective computes (sizes, aliasing, pre- and postconditions over
symbolic chunk values): the DSL traces against them and the verifier proves
them.  The names below are the IR's API:
`from gc3.ir import Program, Step, OPCODES`.
"""
from .opcodes import OPCODES, STEP_TYPES, OpcodeInfo  # noqa: F401
from .program import (BUFFERS, PROTOCOLS, ComputeArgs, ComputeSpec, Convention, Gpu, Operand,  # noqa: F401
                      Postcondition, Program, Step, Threadblock, local_input, local_output, step_reads)
