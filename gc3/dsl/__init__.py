"""Stage 1, what users write and what tracing records: `program.py` (GC3Program,
chunk, Check), `chunk_ref.py` (references and their copy/reduce), `ops.py` (the
traced records), `chunk_dag.py` (the Chunk DAG: those records with the facts
lowering needs, the only thing lowering reads), `collectives.py`
and `symbolic.py` (what a collective must compute), `topology.py`."""
