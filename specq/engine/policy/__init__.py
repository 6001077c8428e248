"""Choosing per job: `mode auto`'s rules (`auto`) and the measured quality rows they rest on
(`evidence`, with its key `evidence_key` and bounds `evidence_bound`; the shipped rows are the package
data `evidence_rows.json`; `calibration_rows` turns calibration units into such rows, for `specq calibrate`
and for calibrations run through the service alike). Decisions on numbers: no model is loaded and no llama.cpp is called here;
`evidence_key` hashes model files (through `models` and `cache.speculator`'s file hash).

May import: the engine's `options`, `models` and `cache` (and specq.contracts).
"""
