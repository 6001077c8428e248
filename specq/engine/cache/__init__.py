"""Saved KV states: the byte-budgeted store and the speculator's window cache (`speculator`), the
target's prompt cache by common prefix (`prefix`) and their disk copy (`disk`).

May import: specq.contracts only (contexts are handed in; nothing here loads a model).
"""
