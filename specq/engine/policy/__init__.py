"""Choosing per job: `mode auto`'s rules (`auto`) and the measured quality rows they rest on
(`evidence`). Pure decisions on numbers: no model, no llama.cpp.

May import: the engine's `options` (and specq.contracts).
"""
