"""Model work only: scoring, selection, sparse prefill, speculative decoding.

Laid out by concern (docs/architecture.md draws it). At the top, what callers outside the engine
import: `pipeline` (`Engine`: one job, tokenize → score → select → sparse prefill → decode),
`group_sparse` (`Engine.run_group`: several questions, one prefill), `options` (every knob),
`result` (the run result), `inputs` (uploaded bytes → a document), `models` (the model
registry) and `calibration` (`specq calibrate`'s unit: one question's baseline, specprefill and
teacher-forced passes). Below them the sub-packages, each importing only those listed before it: `llama`
(bindings), `cache` and `policy` (ground), `prompt`, `decode`, `scoring`; `serving` (many jobs at
once) sits above `pipeline`. Nothing here imports specq.storage, specq.worker, specq.api,
specq.cli, specq.bench or specq.testing: data flows into the engine, never back up out of it
(tests/test_import_graph.py keeps it so).
"""
