"""One poller per followed job, shared by every stream of it (job events, streamed and waiting chat
completions).

A `JobFeed` reads its answer text from the worker's publisher (Redis pub/sub, or the store's
`job_deltas` on the embedded default) and the job's row when the publisher says the job is ending (the
last delta is marked `final`; on Redis the worker also announces the end once the job's row is written,
`worker.stream.RedisChannel.clear`): then it reads the row at once and every END_POLL_S until it is
terminal, for END_WINDOW_S. So a stream's `done` follows the worker's last write by a row read, not by
up to a poll interval. On the embedded default a feed also reads a queued job's row every END_POLL_S
for its first START_WINDOW_S: an interactive job with a free slot is claimed within them (issue 50: a
follow-up's first token came out of the engine while its feed still slept on "queued" for up to
STORE_POLL_S); once the row says it runs, its text is read every DELTA_POLL_S and the row at the
usual pace. The row is also read every STATUS_POLL_S (the safety net: progress, a job that fails or
is cancelled without text, an event lost), on the embedded default every STORE_POLL_S (no pub/sub
there; a queued job's text is read only once its row says it runs). It hands both to each subscribed
stream's queue. So 300 streams on one job cost one row read per interval and one Redis subscription, not
300 of each. A stream that subscribes late gets the latest row and the text so far first. The feeds of
different jobs read their rows through one `RowReader`, which puts the reads asked for within BATCH_S
into one query; on the embedded default a feed reads `job_deltas` only while its job runs (a queued job
has no text). So idle streams cost the store a bounded number of reads per second, however many there
are (docs/reliability.md, "Streams").

The feed runs in a task of its own, not in any response's task: a client that goes away only unsubscribes
(no await, nothing to cancel), and the feed closes its source (the Redis connections) itself once its
last stream has gone or the job has ended. That close is shielded from cancellation (shutdown), so no
connection is left open whatever happens to the streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..contracts import JOB_TERMINAL
from ..settings import ServiceSettings
from ..storage import db, deltas, jobs, results

log = logging.getLogger("specq.api")

#: seconds between reads of the job's row (status, progress): the safety net under the publisher's events
STATUS_POLL_S = 0.25
#: embedded default (no pub/sub, and the worker clears a job's rows once it ended, maybe before a feed
#: read its final row): seconds between reads of the row; feeds' reads are batched (RowReader)
STORE_POLL_S = 0.1
#: after the publisher's last delta or end notice: seconds between reads of the row until it is terminal
END_POLL_S = 0.02
#: ... for at most this many seconds (a worker that cannot write the result: the safety net goes on)
END_WINDOW_S = 2.0
#: embedded default: a feed reads a queued job's row every END_POLL_S for this many seconds after it started
START_WINDOW_S = 2.0
#: seconds between reads of job_deltas on the embedded default
DELTA_POLL_S = 0.05
#: row reads asked for within this many seconds go to the store together (`RowReader`)
BATCH_S = 0.03


@dataclass
class Piece:
    attempt: int
    offset: int
    text: str
    #: the attempt's last delta: the job's row is about to turn terminal
    final: bool = False


class StoreSource:
    """Deltas from `job_deltas` rows (embedded default)."""

    #: a read of the store each DELTA_POLL_S: skipped while the job waits in the queue (it has no text)
    polls = True

    def __init__(self, job_id: str) -> None:
        self.job_id, self.attempt, self.seq = job_id, 0, -1
        #: never set: the last row is marked `final` (but the worker may clear the rows before they are read)
        self.ended = False

    async def start(self) -> list[Piece]:
        return await self.next(0)

    async def next(self, timeout: float) -> list[Piece]:
        rows = await run_in_threadpool(self.read)
        if not rows and timeout > 0:
            await asyncio.sleep(min(timeout, DELTA_POLL_S))
        return rows

    def read(self) -> list[Piece]:
        with db.session() as s:
            rows = deltas.read_after(s, self.job_id, self.attempt, self.seq)
        if rows:
            self.attempt, self.seq = rows[-1].attempt, rows[-1].seq
        return [Piece(r.attempt, r.offset, r.text, r.final) for r in rows]

    async def close(self) -> None:
        pass


class RedisSource:
    """Deltas from the job's pub/sub channel; the text so far from its key, read after subscribing."""

    polls = False

    def __init__(self, url: str, job_id: str) -> None:
        import redis.asyncio as aioredis

        from ..contracts import redis_keys

        self.redis = aioredis.Redis.from_url(url, socket_connect_timeout=3)
        self.channel, self.text_key, self.attempt_key = redis_keys(job_id)
        self.pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        #: the worker announced the job's end (its row is written): the feed reads the row and resets this
        self.ended = False

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
                    if d.get("ended"):
                        self.ended = True
                    else:
                        out.append(Piece(int(d["attempt"]), int(d["offset"]), str(d["text"]), bool(d.get("final"))))
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
            message = await self.pubsub.get_message(timeout=0)
        return out

    async def close(self) -> None:
        for close in (self.pubsub.aclose, self.redis.aclose):
            try:
                await close()
            except Exception as e:  # the server went away: its side of the connection is gone too
                log.debug("closing a job's Redis subscription: %s", e)


def publishes_on_redis(settings: ServiceSettings) -> bool:
    """Whether the workers of `settings` publish answers on Redis (else into the store's job_deltas)."""
    return not settings.embedded_broker and settings.resolved_broker_url.startswith(("redis://", "rediss://", "unix://"))


def open_source(settings: ServiceSettings, job_id: str):
    return RedisSource(settings.resolved_broker_url, job_id) if publishes_on_redis(settings) else StoreSource(job_id)


def idle_row_interval(polls_store: bool) -> float:
    """Seconds between a feed's reads of its job's row outside the end of a job: STORE_POLL_S where its
    text comes from the store (no pub/sub, module doc), else STATUS_POLL_S."""
    return STORE_POLL_S if polls_store else STATUS_POLL_S


def row_poll_s(settings: ServiceSettings) -> float:
    """`idle_row_interval` of the feeds `settings` open (open_source)."""
    return idle_row_interval(not publishes_on_redis(settings))


def read_rows(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """What the streams show of each job's row (a job that does not exist is left out), with its result
    once it succeeded; one query per 500 jobs."""
    out: dict[str, dict[str, Any]] = {}
    with db.session() as s:
        for job_id, job in jobs.get_jobs(s, job_ids).items():
            d = {"status": job.status, "attempts": job.attempts, "error": job.error,
                 "queue_wait_ms": job.queue_wait_ms, "phase": job.progress_phase, "done": job.progress_done,
                 "total": job.progress_total}
            d["result"] = results.get_result(s, job_id) if job.status == "succeeded" else None
            out[job_id] = d
    return out


class RowReader:
    """Reads the rows that feeds ask for within BATCH_S of each other in one query: with a thousand jobs
    followed, the store sees at most STATUS_POLL_S / BATCH_S reads per interval, not a thousand."""

    def __init__(self) -> None:
        self.pending: dict[str, list[asyncio.Future]] = {}
        self.flusher: asyncio.Task | None = None

    async def read(self, job_id: str) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.setdefault(job_id, []).append(future)
        if self.flusher is None:
            self.flusher = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(BATCH_S)
        batch, self.pending, self.flusher = self.pending, {}, None
        try:
            rows = await run_in_threadpool(read_rows, list(batch))
        except Exception as e:
            for futures in batch.values():
                for f in futures:
                    if not f.done():
                        f.set_exception(e)
            return
        for job_id, futures in batch.items():
            for f in futures:
                if not f.done():
                    f.set_result(rows.get(job_id))


#: what a subscriber's queue holds: ("row", row or None = the job is gone), ("piece", Piece),
#: ("error", exception); a terminal row, None or an error is the last item
Item = tuple[str, Any]


class JobFeed:
    """One job's poller and the queues of the streams that follow it."""

    def __init__(self, key: tuple, settings: ServiceSettings, job_id: str) -> None:
        self.key, self.settings, self.job_id = key, settings, job_id
        self.queues: set[asyncio.Queue[Item]] = set()
        self.row: dict[str, Any] | None = None
        #: the latest attempt's text as far as it is known without gaps
        self.attempt: int | None = None
        self.text = ""
        self.ended = False
        self.task: asyncio.Task | None = None

    def subscribe(self) -> asyncio.Queue[Item]:
        """A queue that gets what is known so far, then every later item."""
        queue: asyncio.Queue[Item] = asyncio.Queue()
        if self.attempt is not None:
            queue.put_nowait(("piece", Piece(self.attempt, 0, self.text)))
        if self.row is not None:
            queue.put_nowait(("row", self.row))
        self.queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Item]) -> None:
        self.queues.discard(queue)  # the poller stops within STATUS_POLL_S when it was the last

    def _send(self, item: Item) -> None:
        for queue in self.queues:
            queue.put_nowait(item)

    def _pieces(self, pieces: list[Piece]) -> None:
        for p in pieces:
            if self.attempt is None or p.attempt > self.attempt:
                self.attempt, self.text = p.attempt, ""
            if p.attempt == self.attempt and p.offset <= len(self.text) < p.offset + len(p.text):
                self.text += p.text[len(self.text) - p.offset:]
            self._send(("piece", p))

    def _end(self, item: Item) -> None:
        """Leave the registry (a stream that comes later starts a new feed) and send the last item."""
        if self.ended:
            return
        self.ended = True
        if _feeds.get(self.key) is self:
            del _feeds[self.key]
        self._send(item)

    async def run(self) -> None:
        source = None
        try:
            source = open_source(self.settings, self.job_id)
            self._pieces(await source.start())
            next_poll = 0.0
            fast_until = 0.0  # reading the row every END_POLL_S until then: the job is ending
            # ... and until then while the row says queued (embedded: its text is read once it runs)
            start_until = time.monotonic() + START_WINDOW_S if source.polls else 0.0
            while self.queues:
                if time.monotonic() >= next_poll:
                    row = await _reader().read(self.job_id)
                    if row is None or row["status"] in JOB_TERMINAL:
                        if row is not None:
                            self._pieces(await source.next(0))
                        self._end(("row", row))
                        return
                    now = time.monotonic()
                    fast = now < fast_until or (now < start_until and row["status"] == "queued")
                    next_poll = now + (END_POLL_S if fast else idle_row_interval(source.polls))
                    if row != self.row:
                        self.row = row
                        self._send(("row", row))
                wait = max(0.0, min(STATUS_POLL_S, next_poll - time.monotonic()))
                if source.polls and self.row is not None and self.row["status"] == "queued":
                    await asyncio.sleep(wait)  # no text before it runs: its deltas are read from then on
                else:
                    pieces = await source.next(wait)
                    self._pieces(pieces)
                    if source.ended or any(p.final for p in pieces):  # the job is ending: read its row now
                        source.ended = False
                        next_poll, fast_until = 0.0, time.monotonic() + END_WINDOW_S
        except Exception as e:
            self._end(("error", e))
        finally:
            self._end(("error", RuntimeError(f"following job {self.job_id} stopped")))  # when cancelled
            if source is not None:
                await _close(source)


async def _close(source) -> None:
    """Close `source` even when the feed's task is being cancelled (the close goes on by itself)."""
    closing = asyncio.ensure_future(source.close())
    _closing.add(closing)
    closing.add_done_callback(_closing.discard)
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        pass


#: feeds running now, by (event loop, broker URL, job id)
_feeds: dict[tuple, JobFeed] = {}
#: closes still running after their feed was cancelled (a reference keeps them from being collected)
_closing: set[asyncio.Future] = set()


_readers: dict[asyncio.AbstractEventLoop, RowReader] = {}


def _reader() -> RowReader:
    loop = asyncio.get_running_loop()
    reader = _readers.get(loop)
    if reader is None:
        for old in [k for k in _readers if k.is_closed()]:
            del _readers[old]
        reader = _readers[loop] = RowReader()
    return reader


def subscribe(settings: ServiceSettings, job_id: str) -> tuple[JobFeed, asyncio.Queue[Item]]:
    """The job's feed (started if no stream follows the job yet) and a new queue of it."""
    key = (asyncio.get_running_loop(), settings.resolved_broker_url, job_id)
    feed = _feeds.get(key)
    if feed is None:
        feed = _feeds[key] = JobFeed(key, settings, job_id)
        queue = feed.subscribe()
        feed.task = asyncio.get_running_loop().create_task(feed.run(), name=f"specq-feed-{job_id}")
        return feed, queue
    return feed, feed.subscribe()


def feeds_running() -> int:
    """How many jobs are followed now (one poller each)."""
    return len(_feeds)


__all__ = ["JobFeed", "Piece", "StoreSource", "RedisSource", "open_source", "read_rows", "RowReader", "subscribe", "feeds_running",
           "idle_row_interval", "publishes_on_redis", "row_poll_s", "STATUS_POLL_S", "DELTA_POLL_S", "STORE_POLL_S", "END_POLL_S", "END_WINDOW_S",
           "START_WINDOW_S"]
