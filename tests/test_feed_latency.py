"""A stream learns of its job's end from the worker's publisher, not from the feed's slow row poll
(api.job_feed): with STATUS_POLL_S set to 30 s, `done` still arrives within a second of the result's
write, on the embedded default (the final delta in `job_deltas`) and on Redis (the final delta and the
end notice on pub/sub). Real store, real publisher and channel as the worker uses them, no engine.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service_helpers import REDIS_URL, empty_store, require_servers


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def feed_store(request, tmp_path, monkeypatch):
    from specq.settings import ServiceSettings
    from specq.storage import db

    if request.param == "postgresql":
        require_servers()
    monkeypatch.setenv("SPECQ_HOME", str(tmp_path))
    with empty_store(request.param, tmp_path) as url:
        monkeypatch.setenv("SPECQ_DATABASE_URL", url)
        db.upgrade(url)
        yield ServiceSettings.from_env(broker_url=REDIS_URL if request.param == "postgresql" else None)


def _run_job(settings, job_id: str, words: list[str], ended_at: list[float], token: str | None) -> None:
    """What the worker does for a job: claim it (mark_running) unless `token` says it was, publish its
    text, save the result, clear the stream."""
    from specq.engine.result import RunResult
    from specq.storage import db, jobs, results
    from specq.worker.stream import DeltaPublisher, make_channel

    if token is None:
        time.sleep(0.2)  # the stream has seen the job queued
        with db.session() as s:
            token = jobs.mark_running(s, job_id, "w:1")
    channel = make_channel(settings)
    pub = DeltaPublisher(channel, job_id, attempt=1, token=token)
    for w in words:
        pub.feed(w)
        time.sleep(0.01)
    pub.finish()
    with db.session() as s:
        assert results.save_result(s, job_id, RunResult(text="".join(words), finish_reason="stop"), token=token)
    ended_at.append(time.monotonic())
    channel.clear(job_id)


@pytest.mark.parametrize("queued_first", [False, True], ids=["running", "queued"])
def test_a_stream_gets_done_promptly_without_the_status_poll(feed_store, monkeypatch, queued_first):
    from specq.api import job_feed
    from specq.api.job_stream import follow
    from specq.storage import db, jobs

    monkeypatch.setattr(job_feed, "STATUS_POLL_S", 30.0)  # the safety net only: events must drive the feed
    with db.session() as s:
        job_id = jobs.create_job(s, text="x = 1\n", params={}).id
        # the worker's claim before the stream opens, or (queued) after it has seen the job queued
        token = None if queued_first else jobs.mark_running(s, job_id, "w:1")
    words = [f"w{i} " for i in range(10)]
    ended_at: list[float] = []

    async def main() -> tuple[list, float]:
        events, done_at = [], 0.0
        worker = None
        async for name, data in follow(feed_store, job_id):
            events.append((name, data))
            if worker is None:  # the stream has its first event: the worker starts
                worker = threading.Thread(target=_run_job, args=(feed_store, job_id, words, ended_at, token))
                worker.start()
            if name == "done":
                done_at = time.monotonic()
        await asyncio.to_thread(worker.join)
        return events, done_at

    events, done_at = asyncio.run(asyncio.wait_for(main(), 20))
    assert events[-1][0] == "done" and events[-1][1]["status"] == "succeeded", events
    assert "".join(d["text"] for n, d in events if n == "delta") == "".join(words)
    lag = done_at - ended_at[0]
    assert lag < 1.0, f"done came {lag:.2f}s after the result was saved (the status poll is 30 s)"


def test_a_queued_jobs_first_text_reaches_its_stream_promptly(feed_store, monkeypatch):
    """A follow-up's stream opens on a queued job, which a free slot claims a moment later: its first
    text reaches the stream within a fraction of a second of the worker's publish, though the row polls
    are set to 30 s (embedded default: the feed's start window reads the row every END_POLL_S; Redis:
    pub/sub)."""
    from specq.api import job_feed
    from specq.api.job_stream import follow
    from specq.storage import db, jobs
    from specq.worker.stream import DeltaPublisher, make_channel

    monkeypatch.setattr(job_feed, "STATUS_POLL_S", 30.0)
    monkeypatch.setattr(job_feed, "STORE_POLL_S", 30.0)
    with db.session() as s:
        job_id = jobs.create_job(s, text="x = 1\n", params={}).id
    published: list[float] = []
    release = threading.Event()

    def worker() -> None:
        time.sleep(0.3)  # the stream has seen the job queued
        with db.session() as s:
            token = jobs.mark_running(s, job_id, "w:1")
        pub = DeltaPublisher(make_channel(feed_store), job_id, attempt=1, token=token)
        published.append(time.monotonic())
        pub.feed("first ")
        release.wait(10)
        pub.finish()

    async def main() -> float:
        thread = threading.Thread(target=worker)
        try:
            async for name, data in follow(feed_store, job_id):
                if name == "status":
                    assert data["status"] == "queued" or published, data
                    if not thread.is_alive() and not published:
                        thread.start()
                if name == "delta":
                    return time.monotonic()
            raise AssertionError("the stream ended without text")
        finally:
            release.set()
            if thread.is_alive():
                await asyncio.to_thread(thread.join)

    got = asyncio.run(asyncio.wait_for(main(), 20))
    lag = got - published[0]
    assert lag < 0.5, f"the first text came {lag:.2f}s after its publish (the row polls are 30 s)"
