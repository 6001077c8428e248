"""The document size limit, shared by the job and document stores (jobs.py, documents.py) and the API."""

from __future__ import annotations

import os

#: default cap on a document's UTF-8 size; SPECQ_MAX_INPUT_BYTES overrides it
DEFAULT_MAX_INPUT_BYTES = 8 * 1024 * 1024


def max_input_bytes() -> int:
    """The document size limit in bytes: SPECQ_MAX_INPUT_BYTES, default 8 MiB."""
    raw = os.environ.get("SPECQ_MAX_INPUT_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_INPUT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"SPECQ_MAX_INPUT_BYTES must be a whole number of bytes, not {raw!r}") from None
    if value <= 0:
        raise ValueError("SPECQ_MAX_INPUT_BYTES must be > 0")
    return value


__all__ = ["DEFAULT_MAX_INPUT_BYTES", "max_input_bytes"]
