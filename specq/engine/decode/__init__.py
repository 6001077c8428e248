"""The target's work on kept tokens: sparse prefill (`prefill`), the decode loop (`loop`),
speculative verification (`speculative`), the drafters (`drafters`, `drafters_hidden`), samplers
(`sampling`) and decoded bytes as client text (`textstream`).

May import: `llama`, `prompt`, the engine's `options`, specq.contracts.
"""
