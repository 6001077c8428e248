"""SpecPrefill's choice of tokens: the speculator's scoring passes (`scorer`) and their score math on
the device (`score_torch`), chunk selection (`selection`, `blocks`), kept spans in document
coordinates (`kept_spans`) and scoring interleaved with the target's prefill (`pipelined`).

May import: `llama`, `prompt`, `decode` (the sparse prefill `pipelined` drives), the engine's
`options`, specq.contracts.
"""
