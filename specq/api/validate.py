"""Can the job store hold this string? PostgreSQL's text and JSONB refuse NUL characters, every
UTF-8 encoder refuses lone surrogates (JSON can spell both: "\\u0000", "\\ud800"), and a few columns
have a size (file names 255 characters). The API checks every string of a request here, before
anything is stored, so such input is a 422 instead of a half-done 500.
"""

from __future__ import annotations

from typing import Any

from ..contracts import InputError

#: the longest file name (job_inputs.filename, jobs.custom_id)
MAX_NAME_CHARS = 255


def check_storable(value: Any, name: str, max_chars: int | None = None) -> None:
    """InputError naming the first string in `value` (a str, or nested dicts and lists of JSON) that
    holds a NUL character or a lone surrogate, or a str over `max_chars`."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InputError(f"{name} contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{name} contains lone surrogates; send UTF-8 text") from None
        if max_chars is not None and len(value) > max_chars:
            raise InputError(f"{name} is {len(value)} characters, over the limit of {max_chars}")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_storable(key, f"{name} key")
            check_storable(item, f"{name}.{key}" if isinstance(key, str) and key.isprintable() else name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_storable(item, f"{name}[{i}]")


__all__ = ["check_storable", "MAX_NAME_CHARS"]
