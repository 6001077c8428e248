"""Model work only: scoring, selection, sparse prefill, speculative decoding.

Nothing here imports specq.storage, specq.worker or specq.api: data flows into the engine, never
back up out of it.
"""
