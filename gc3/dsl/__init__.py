"""Stage 1, what users write and what tracing records: `program.py` (GC3Program,
chunk, Check), `chunk_ref.py` (references and their copy/reduce), `ops.py` (the
traced records), `chunk_dag.py` (the Chunk DAG: those records with the facts
lowering needs, the only thing lowering reads), `topology.py`.  What a
collective must compute (`gc3/ir/collectives.py`, `gc3/ir/symbolic.py`) sits
below, with the IR, since the verifier reads it too; `collectives.py` here
re-exports it."""
