"""Stage 2, lowering: a Chunk DAG (traced or built by hand) -> a scheduled `gc3.ir.Program`.

`pipeline.py` names the passes in the order they run; each other module is one pass."""
