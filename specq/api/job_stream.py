"""Following one job from the API: its status and progress from the store, its answer text from the
worker's publisher (Redis pub/sub, or the store's `job_deltas` on the embedded default), as events.

`follow()` yields (event, data) pairs in the format of GET /v1/jobs/{id}/events (docs/service.md):
`status`, `phase`, `progress`, `delta`, `reset`, `done`, and ("keepalive", None) when nothing happened
for KEEPALIVE_S. The joined deltas equal the stored result's text: what the publisher's messages miss
(a subscriber that came late, a lost message, a job that finished before the stream opened) is sent
from the stored result before `done`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..contracts import JOB_TERMINAL, redis_keys
from ..settings import ServiceSettings
from ..storage import db, deltas, jobs, results

#: seconds between reads of the job's row (status, progress)
STATUS_POLL_S = 0.25
#: seconds between reads of job_deltas on the embedded default
DELTA_POLL_S = 0.05
#: a keep-alive comment after this many seconds without an event
KEEPALIVE_S = 15.0


@dataclass
class Piece:
    attempt: int
    offset: int
    text: str


class StoreSource:
    """Deltas from `job_deltas` rows (embedded default)."""

    def __init__(self, job_id: str) -> None:
        self.job_id, self._attempt, self._seq = job_id, 0, -1

    async def start(self) -> list[Piece]:
        return await self.next(0)

    async def next(self, timeout: float) -> list[Piece]:
        rows = await run_in_threadpool(self._read)
        if not rows and timeout > 0:
            await asyncio.sleep(min(timeout, DELTA_POLL_S))
        return rows

    def _read(self) -> list[Piece]:
        with db.session() as s:
            rows = deltas.read_after(s, self.job_id, self._attempt, self._seq)
        if rows:
            self._attempt, self._seq = rows[-1].attempt, rows[-1].seq
        return [Piece(r.attempt, r.offset, r.text) for r in rows]

    async def close(self) -> None:
        pass


class RedisSource:
    """Deltas from the job's pub/sub channel; the text so far from its key, read after subscribing."""

    def __init__(self, url: str, job_id: str) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.Redis.from_url(url, socket_connect_timeout=3)
        self.channel, self.text_key, self.attempt_key = redis_keys(job_id)
        self.pubsub = self.redis.pubsub(ignore_subscribe_messages=True)

    async def start(self) -> list[Piece]:
        await self.pubsub.subscribe(self.channel)
        text, attempt = await self.redis.mget(self.text_key, self.attempt_key)
        if attempt is None:
            return []
        return [Piece(int(attempt), 0, (text or b"").decode("utf-8", "replace"))]

    async def next(self, timeout: float) -> list[Piece]:
        out = []
        message = await self.pubsub.get_message(timeout=timeout)
        while message is not None:
            if message.get("type") == "message":
                try:
                    d = json.loads(message["data"])
                    out.append(Piece(int(d["attempt"]), int(d["offset"]), str(d["text"])))
                except (ValueError, KeyError, TypeError):
                    pass
            message = await self.pubsub.get_message(timeout=0)
        return out

    async def close(self) -> None:
        try:
            await self.pubsub.aclose()
            await self.redis.aclose()
        except Exception:
            pass


def open_source(settings: ServiceSettings, job_id: str):
    url = settings.resolved_broker_url
    if not settings.embedded_broker and url.startswith(("redis://", "rediss://", "unix://")):
        return RedisSource(url, job_id)
    return StoreSource(job_id)


def _row(job_id: str) -> dict[str, Any] | None:
    with db.session() as s:
        job = jobs.get_job(s, job_id)
        if job is None:
            return None
        d = {"status": job.status, "attempts": job.attempts, "error": job.error, "queue_wait_ms": job.queue_wait_ms,
             "phase": job.progress_phase, "done": job.progress_done, "total": job.progress_total}
        d["result"] = results.get_result(s, job_id) if job.status == "succeeded" else None
        return d


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


async def follow(settings: ServiceSettings, job_id: str, start_offset: int = 0) -> AsyncIterator[tuple[str, Any]]:
    """The job's events until it has finished (module doc). `start_offset`: characters of the answer the
    client already has (Last-Event-ID)."""
    source = open_source(settings, job_id)
    text = _Text(start_offset)
    seen: dict[str, Any] = {}
    last_event = time.monotonic()
    try:
        pieces = await source.start()
        next_poll = 0.0
        while True:
            out: list[tuple[str, Any]] = []
            now = time.monotonic()
            if now >= next_poll:
                row = await run_in_threadpool(_row, job_id)
                next_poll = time.monotonic() + STATUS_POLL_S
                if row is None:
                    return
                out += _changes(seen, job_id, row)
                if row["status"] in JOB_TERMINAL:
                    for piece in pieces + await source.next(0):
                        out += text.apply(piece)
                    result = row["result"]
                    if result is not None:
                        out += text.final(result.get("text") or "", row["attempts"])
                    out.append(("done", {"status": row["status"], "error": row["error"],
                                         "finish_reason": (result or {}).get("finish_reason"),
                                         "usage": (result or {}).get("usage"),
                                         "timings_ms": (result or {}).get("timings_ms")}))
                    for event in out:
                        yield event
                    return
            for piece in pieces:
                out += text.apply(piece)
            for event in out:
                yield event
            if out:
                last_event = time.monotonic()
            elif time.monotonic() - last_event >= KEEPALIVE_S:
                last_event = time.monotonic()
                yield ("keepalive", None)
            pieces = await source.next(max(0.0, min(STATUS_POLL_S, next_poll - time.monotonic())))
    finally:
        await source.close()


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


__all__ = ["follow", "sse", "open_source", "StoreSource", "RedisSource", "STATUS_POLL_S", "KEEPALIVE_S"]
