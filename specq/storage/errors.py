"""Storage exceptions."""

from __future__ import annotations

from ..contracts import InputError


class StorageError(Exception):
    """A storage call could not be done; the message says why."""


class InputTooLarge(InputError):
    """The document is larger than the configured limit (SPECQ_MAX_INPUT_BYTES)."""

    def __init__(self, size_bytes: int, limit_bytes: int):
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"document is {size_bytes} bytes, over the limit of {limit_bytes} bytes (SPECQ_MAX_INPUT_BYTES)"
        )
