"""Saved KV states: the byte-budgeted store and the speculator's window cache (`speculator`), the
target's prompt cache by common prefix (`prefix`) and their disk copy (`disk`).

May import: specq.contracts and `llama` (contexts are handed in; nothing here loads a model; the prompt
cache reports prefill progress through llama's `progress.counted`).
"""
