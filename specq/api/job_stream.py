"""Following one job from the API: its status and progress from the store, its answer text from the
worker's publisher (Redis pub/sub, or the store's `job_deltas` on the embedded default), as events.

`follow()` yields (event, data) pairs in the format of GET /v1/jobs/{id}/events (docs/service.md):
`status`, `phase`, `progress`, `delta`, `reset`, `done`, and ("keepalive", None) when nothing happened
for KEEPALIVE_S. The joined deltas equal the stored result's text: what the publisher's messages miss
(a subscriber that came late, a lost message, a job that finished before the stream opened) is sent
from the stored result before `done`. The reading itself is the job's shared feed (`job_feed`): every
stream of a job is fed by one poller.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from ..contracts import JOB_TERMINAL
from .job_feed import STATUS_POLL_S, Piece, subscribe

#: a keep-alive comment after this many seconds without an event
KEEPALIVE_S = 15.0


class _Text:
    """The current attempt's text as far as known, and how much of it was sent."""

    def __init__(self, sent: int) -> None:
        self.attempt: int | None = None
        self.text = ""
        self.sent = sent

    def apply(self, piece: Piece) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if self.attempt is None or piece.attempt > self.attempt:
            if self.attempt is not None and self.sent > 0:
                out.append(("reset", {"attempt": piece.attempt}))
                self.sent = 0
            self.attempt, self.text = piece.attempt, ""
        if piece.attempt < self.attempt or piece.offset > len(self.text):
            return out  # an older attempt, or a gap (the stored result fills it at the end)
        end = piece.offset + len(piece.text)
        if end > len(self.text):
            self.text += piece.text[len(self.text) - piece.offset:]
        return out + self.flush()

    def flush(self) -> list[tuple[str, dict]]:
        if len(self.text) <= self.sent:
            return []
        delta = {"text": self.text[self.sent:], "offset": self.sent, "attempt": self.attempt or 0}
        self.sent = len(self.text)
        return [("delta", delta)]

    def final(self, text: str, attempt: int) -> list[tuple[str, dict]]:
        """The stored answer: send what is missing (or restart when what was sent is not its start)."""
        out: list[tuple[str, dict]] = []
        if self.sent > len(text) or (self.text and not text.startswith(self.text[: self.sent])):
            out.append(("reset", {"attempt": attempt}))
            self.sent = 0
        self.attempt, self.text = attempt, text
        return out + self.flush()


async def follow(settings, job_id: str, start_offset: int = 0) -> AsyncIterator[tuple[str, Any]]:
    """The job's events until it has finished (module doc). `start_offset`: characters of the answer the
    client already has (Last-Event-ID)."""
    feed, queue = subscribe(settings, job_id)
    text = _Text(start_offset)
    seen: dict[str, Any] = {}
    last_event = time.monotonic()
    try:
        while True:
            try:
                wait = max(0.0, KEEPALIVE_S - (time.monotonic() - last_event))
                items = [await asyncio.wait_for(queue.get(), wait)]
            except asyncio.TimeoutError:
                last_event = time.monotonic()
                yield ("keepalive", None)
                continue
            while not queue.empty():
                items.append(queue.get_nowait())
            out: list[tuple[str, Any]] = []
            for kind, item in items:
                if kind == "error":
                    raise RuntimeError(f"following job {job_id} failed: {item}") from item
                if kind == "piece":
                    out += text.apply(item)
                    continue
                if item is None:  # the job is gone
                    for event in out:
                        yield event
                    return
                out += _changes(seen, job_id, item)
                if item["status"] in JOB_TERMINAL:
                    result = item["result"]
                    if result is not None:
                        out += text.final(result.get("text") or "", item["attempts"])
                    out.append(("done", {"status": item["status"], "error": item["error"],
                                         "finish_reason": (result or {}).get("finish_reason"),
                                         "usage": (result or {}).get("usage"),
                                         "timings_ms": (result or {}).get("timings_ms")}))
                    for event in out:
                        yield event
                    return
            for event in out:
                yield event
            if out:
                last_event = time.monotonic()
    finally:
        feed.unsubscribe(queue)


def _changes(seen: dict[str, Any], job_id: str, row: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    status = (row["status"], row["attempts"], row["error"])
    if seen.get("status") != status:
        seen["status"] = status
        out.append(("status", {"id": job_id, "status": row["status"], "attempts": row["attempts"],
                               "error": row["error"], "queue_wait_ms": row["queue_wait_ms"]}))
    if row["status"] == "running" and row["phase"]:
        if seen.get("phase") != row["phase"]:
            seen["phase"] = row["phase"]
            out.append(("phase", {"phase": row["phase"]}))
        progress = (row["phase"], row["done"], row["total"])
        if seen.get("progress") != progress:
            seen["progress"] = progress
            out.append(("progress", {"phase": row["phase"], "done": row["done"], "total": row["total"]}))
    return out


def sse(event: str, data: Any, id_: int | None = None) -> bytes:
    """One server-sent event (a comment for keepalive)."""
    if event == "keepalive":
        return b": keep-alive\n\n"
    head = f"event: {event}\n" + (f"id: {id_}\n" if id_ is not None else "")
    return (head + "data: " + json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n\n").encode("utf-8")


__all__ = ["follow", "sse", "Piece", "STATUS_POLL_S", "KEEPALIVE_S"]
