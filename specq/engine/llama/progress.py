"""Prefill progress from inside a chunked llama_decode: `counted` makes the `after_call` hook that
`Context.decode` runs after each llama_decode call, so a long prefill reports tokens i/n as it goes
(the sparse prefill, a full prefill through the prompt cache, each chunk of the serving loop)."""

from __future__ import annotations

from typing import Callable

from .binding import Context


def counted(ctx: Context, start: int, n: int, progress: Callable[[int, int], None] | None):
    """An `after_call` for ctx.decode of tokens start..n-1 in calls of ctx.call_tokens (a "last"/"none"
    batch): progress(tokens of the n in the cache, n) after each call; None without `progress`."""
    if progress is None:
        return None
    done = [start]

    def after_call() -> None:
        done[0] = min(done[0] + ctx.call_tokens, n)
        progress(done[0], n)

    return after_call
