"""Issue 44, service items 1-3, on real parts:

1. a client that drops its stream (job events, a streamed chat completion) leaves nothing behind: the
   API's Redis connections return to where they were (PostgreSQL + Redis, a real `specq api`);
2. many streams on one job share one poller: the store is read once per interval, not once per stream,
   and every stream still gets every delta and the end (in-process, SQLite + store deltas and
   PostgreSQL + Redis pub/sub, the worker's real publishers);
3. one request never blocks the event loop: a 17 MiB chat body of ~684,000 content parts is refused
   with a 400 naming the limit and an 8 MiB document is checked off the loop, while /healthz answers
   from another client in well under half a second (a real `specq api`, SQLite and PostgreSQL + Redis).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from service_helpers import REDIS_URL, api_only, clean_env, empty_store, free_port, require_servers


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def api(request, tmp_path_factory):
    """A real `specq api` (no worker: jobs stay queued) on SQLite or on PostgreSQL + Redis."""
    home = tmp_path_factory.mktemp(f"streams_{request.param}")
    port = free_port()
    # no worker tokenizes the prompts here, so streamed chats must not wait for one (SPECQ_STREAM_HOLD)
    env_of = lambda **extra: clean_env(home, port, SPECQ_STREAM_HOLD="0", **extra)  # noqa: E731
    with api_only(request.param, home, port, env_of, "specq-streams") as st_:
        yield st_


def _redis_clients() -> int:
    """Connections to our Redis database (this one's own included)."""
    import redis

    r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        db_no = str(r.connection_pool.connection_kwargs.get("db", 0))
        return sum(1 for c in r.client_list() if str(c.get("db")) == db_no)
    finally:
        r.close()


def _model(c: httpx.Client) -> str:
    return c.get("/v1/models").json()["data"][0]["id"]


# --- 1: dropped streams release their connections -------------------------------------------------------


def test_dropped_streams_release_their_redis_connections(api):
    if "SPECQ_BROKER_URL" not in api.env:
        pytest.skip("the embedded default holds no connection per stream (its feeds end: test 2)")
    n = 12
    with httpx.Client(base_url=api.url, timeout=30) as c:
        job_id = c.post("/v1/jobs", json={"text": "def f():\n    return 1\n", "question": "What?"}).json()["id"]
        model = _model(c)
    time.sleep(1.0)
    baseline = _redis_clients()
    clients, streams = [], []
    try:
        for i in range(n):
            client = httpx.Client(base_url=api.url, timeout=30)
            clients.append(client)
            if i % 2 == 0:
                cm = client.stream("GET", f"/v1/jobs/{job_id}/events")
            else:
                cm = client.stream("POST", "/v1/chat/completions",
                                   json={"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            r = cm.__enter__()
            streams.append(cm)
            assert r.status_code == 200, r.read()
            next(r.iter_lines())  # the stream is open and has sent something
        import redis

        from specq.contracts import redis_keys

        channel = redis_keys(job_id)[0]
        probe = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
        deadline = time.monotonic() + 10
        while not dict(probe.pubsub_numsub(channel)).get(channel.encode(), 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        subscribed = dict(probe.pubsub_numsub(channel)).get(channel.encode(), 0)
        probe.close()
        # the streams did subscribe on Redis (counted on the job's channel: other tests' connections to
        # this database may close meanwhile, so a count of all connections can stand still)
        assert subscribed > 0, subscribed
    finally:
        for cm in streams:  # the clients go away mid-stream
            try:
                cm.__exit__(None, None, None)
            except Exception:
                pass
        for client in clients:
            client.close()
    deadline = time.monotonic() + 5
    after = _redis_clients()
    while after > baseline and time.monotonic() < deadline:
        time.sleep(0.2)
        after = _redis_clients()
    assert after <= baseline, f"{after - baseline} Redis connections left behind by {n} dropped streams " \
                              f"(baseline {baseline}, {subscribed} subscribed while streaming)"


# --- 2: one poller per job ------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def feed_store(request, tmp_path, monkeypatch):
    """A migrated job store and the matching broker settings: SQLite + the embedded broker (deltas in
    the store), or PostgreSQL + Redis (deltas on pub/sub)."""
    from specq.settings import ServiceSettings
    from specq.storage import db

    if request.param == "postgresql":
        require_servers()
    monkeypatch.setenv("SPECQ_HOME", str(tmp_path))
    with empty_store(request.param, tmp_path) as url:
        monkeypatch.setenv("SPECQ_DATABASE_URL", url)
        db.upgrade(url)
        broker = REDIS_URL if request.param == "postgresql" else None
        yield ServiceSettings.from_env(broker_url=broker)


def test_many_streams_on_one_job_share_one_poller(feed_store):
    from sqlalchemy import event

    from specq.api.job_feed import STATUS_POLL_S, feeds_running, row_poll_s
    from specq.api.job_stream import follow
    from specq.storage import db, jobs, results
    from specq.engine.result import RunResult
    from specq.worker.stream import DeltaPublisher, make_channel

    with db.session() as s:
        job_id = jobs.create_job(s, text="x = 1\n", params={}).id
        token = jobs.mark_running(s, job_id, "w:1")
    row_reads = []

    def count(conn, cursor, statement, *args):
        if "FROM jobs" in statement and ("jobs.id IN" in statement or "jobs.id =" in statement):
            row_reads.append(time.monotonic())

    engine = db.get_engine()
    event.listen(engine, "before_cursor_execute", count)
    n, quitters = 60, 20
    words = [f"w{i} " for i in range(40)]
    seen: dict[int, list[tuple[str, dict]]] = {i: [] for i in range(n)}

    async def one(i: int) -> None:
        async for name, data in follow(feed_store, job_id):
            seen[i].append((name, data))
            if name == "delta" and i < quitters:
                return  # these clients leave early (after their first text)

    def publish() -> None:
        pub = DeltaPublisher(make_channel(feed_store), job_id, attempt=1, interval=0.05, token=token)
        for w in words:
            pub.feed(w)
            time.sleep(0.02)
        pub.finish()
        with db.session() as s:
            assert results.save_result(s, job_id, RunResult(text="".join(words), finish_reason="stop"), token=token)

    async def main() -> float:
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        await asyncio.sleep(1.0)  # every stream open and idle: the job is running, no text yet
        idle = [t for t in row_reads if t > time.monotonic() - 0.8]
        writer = threading.Thread(target=publish)
        writer.start()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        writer.join()
        await asyncio.sleep(STATUS_POLL_S * 2)
        assert feeds_running() == 0  # the poller ended with the job
        return len(idle)

    try:
        idle_reads = asyncio.run(main())
    finally:
        event.remove(engine, "before_cursor_execute", count)
    # one read of the row per interval for all 60 streams (each stream on its own: 60 per interval)
    assert idle_reads <= 0.8 / row_poll_s(feed_store) + 2, idle_reads
    text = "".join(words)
    for i in range(quitters, n):
        events = seen[i]
        assert "".join(d["text"] for name, d in events if name == "delta") == text, (i, events)
        assert events[-1][0] == "done" and events[-1][1]["status"] == "succeeded"
        assert [e for e, _ in events].count("status") == 2  # running, then succeeded
    for i in range(quitters):
        assert seen[i][-1][0] == "delta"


def test_idle_streams_on_many_jobs_cost_the_store_a_bounded_number_of_reads(feed_store):
    """200 queued jobs, one stream each: their rows are read together (a few queries per interval, not
    200), and no stream reads answer text while its job is queued."""
    from sqlalchemy import event

    from specq.api.job_feed import BATCH_S, STATUS_POLL_S, feeds_running
    from specq.api.job_stream import follow
    from specq.storage import db, jobs

    with db.session() as s:
        ids = [jobs.create_job(s, text="x = 1\n", params={}).id for _ in range(200)]
    reads: list[tuple[float, str]] = []

    def count(conn, cursor, statement, *args):
        if "FROM jobs" in statement and ("jobs.id IN" in statement or "jobs.id =" in statement):
            reads.append((time.monotonic(), "row"))
        elif "FROM job_deltas" in statement:
            reads.append((time.monotonic(), "text"))

    engine = db.get_engine()
    event.listen(engine, "before_cursor_execute", count)
    statuses: dict[str, list] = {i: [] for i in ids}

    async def one(job_id: str) -> None:
        async for name, data in follow(feed_store, job_id):
            statuses[job_id].append(data["status"] if name in ("status", "done") else name)

    async def main() -> tuple[int, int, float]:
        tasks = [asyncio.ensure_future(one(i)) for i in ids]
        deadline = time.monotonic() + 30
        while not all(statuses.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # every stream has its first event (status: queued)
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await asyncio.sleep(1.0)
        t1 = time.monotonic()
        window = [kind for t, kind in reads if t0 <= t < t1]
        with db.session() as s:
            for i in ids:
                jobs.request_cancel(s, i)  # a queued job's cancel ends it at once: every stream gets `done`
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await asyncio.sleep(STATUS_POLL_S * 2)
        assert feeds_running() == 0
        return window.count("row"), window.count("text"), t1 - t0

    try:
        rows, texts, seconds = asyncio.run(main())
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert texts == 0, texts  # queued jobs: no text to read (each stream on its own: 20 reads a second)
    assert rows <= seconds / BATCH_S + 4, rows  # each stream on its own: 200 / STATUS_POLL_S = 800 a second
    assert all(s == ["queued", "cancelled", "cancelled"] for s in statuses.values()), statuses  # status, done


def test_a_late_stream_gets_the_text_so_far(feed_store):
    """A stream that joins a running feed starts from the text the feed has, then follows it."""
    from specq.api.job_stream import follow
    from specq.engine.result import RunResult
    from specq.storage import db, jobs, results
    from specq.worker.stream import DeltaPublisher, make_channel

    with db.session() as s:
        job_id = jobs.create_job(s, text="x = 1\n", params={}).id
        token = jobs.mark_running(s, job_id, "w:1")
    pub = DeltaPublisher(make_channel(feed_store), job_id, attempt=1, interval=0.01, token=token)

    async def main():
        early: list = []
        late: list = []

        async def run(out, stop_after_first_delta=False):
            async for name, data in follow(feed_store, job_id):
                out.append((name, data))

        first = asyncio.ensure_future(run(early))
        pub.feed("Hello, ")
        await asyncio.sleep(0.6)
        second = asyncio.ensure_future(run(late))
        await asyncio.sleep(0.3)
        pub.feed("world")
        pub.finish()
        await asyncio.sleep(0.3)
        with db.session() as s:
            results.save_result(s, job_id, RunResult(text="Hello, world", finish_reason="stop"), token=token)
        await asyncio.wait_for(asyncio.gather(first, second), 30)
        return early, late

    early, late = asyncio.run(main())
    for events in (early, late):
        assert "".join(d["text"] for n, d in events if n == "delta") == "Hello, world", events
        assert events[-1][0] == "done"
    assert [d["text"] for n, d in late if n == "delta"][0].startswith("Hello, ")


# --- 3: the event loop --------------------------------------------------------------------------------


class _Prober(threading.Thread):
    """GET /healthz from its own client every 50 ms; the slowest answer."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.worst, self.count = url, threading.Event(), 0.0, 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                assert c.get("/healthz").status_code == 200
                self.worst = max(self.worst, time.monotonic() - t0)
                self.count += 1
                time.sleep(0.05)


def _while_probing(api, send) -> tuple[httpx.Response, float, int]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        c.get("/healthz")
        prober = _Prober(api.url)
        prober.start()
        time.sleep(0.3)
        try:
            r = send(c)
        finally:
            time.sleep(0.2)
            prober.stop.set()
            prober.join()
    return r, prober.worst, prober.count


def test_a_chat_body_of_many_content_parts_is_refused_without_blocking(api):
    with httpx.Client(base_url=api.url, timeout=30) as c:
        model = _model(c)
        jobs_before = c.get("/v1/jobs").json()["total"]
    per_message = 1024  # the schema's limit per message; 660 messages: 675,840 parts, ~17 MiB
    part = {"type": "text", "text": ""}
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": [part] * per_message}] * 660},
                      separators=(",", ":")).encode()
    assert 16 * 2**20 < len(body) < 17 * 2**20  # under the default body limit (2 x 8 MiB + 1 MiB)

    r, worst, probes = _while_probing(api, lambda c: c.post("/v1/chat/completions", content=body,
                                                            headers={"content-type": "application/json"}))
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert "4096" in err["message"] and "content parts" in err["message"] and err["param"] == "messages", err
    assert probes >= 3 and worst < 0.5, (worst, probes)
    with httpx.Client(base_url=api.url, timeout=30) as c:
        assert c.get("/v1/jobs").json()["total"] == jobs_before  # nothing stored
        ok = {"model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi "}] * 1024}] * 4,
              "max_tokens": 1, "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=ok) as r:  # the limit itself passes (a job, queued)
            assert r.status_code == 200, r.read()[:300]
            job_id = r.headers["x-specq-job-id"]
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] in ("queued", "cancelled")


def test_an_8_mib_document_is_checked_off_the_event_loop(api):
    line = "def f(x):\n    return x + 1  # an ordinary line of code\n"
    text = (line * (8 * 2**20 // len(line)))[: 8 * 2**20 - 1024]  # just under the 8 MiB default limit
    r, worst, probes = _while_probing(api, lambda c: c.post("/v1/documents", json={"text": text, "filename": "big.py"}))
    assert r.status_code in (200, 201), r.text[:300]
    assert probes >= 3 and worst < 0.5, (worst, probes)
    r, worst, probes = _while_probing(api, lambda c: c.post("/v1/jobs", json={"text": text, "question": "What?"}))
    assert r.status_code == 202, r.text[:300]
    assert probes >= 3 and worst < 0.5, (worst, probes)
    with httpx.Client(base_url=api.url, timeout=30) as c:
        c.delete(f"/v1/jobs/{r.json()['id']}")


def test_body_shape_counts_parts_exactly_and_sees_through_escapes():
    """The pre-validation count: exact for parts (braces and commas inside strings do not count, an
    escaped key is read as pydantic reads it), and it stops one over the limit."""
    from specq.api.openai_requests import body_shape

    tricky = {"type": "text", "text": 'a, {b} [c] "q" \\" }]'}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": [tricky] * 1000}] * 4}).encode()
    assert body_shape(body, 4000, 10**9)[0] == 4000
    assert body_shape(body, 3999, 10**9)[0] == 4000  # one over the limit: the scan stops there
    escaped = (b'{"model":"m","\\u006dessages":[{"role":"user","content":[' + b",".join([b'{"type":"text"}'] * 50)
               + b"]}]}")
    assert body_shape(escaped, 10, 10**9)[0] == 11
    assert body_shape(json.dumps({"messages": [{"content": "x, {" * 1000}]}).encode(), 10, 100) == (0, 3)
    assert body_shape(json.dumps({"prediction": [1] * 500}).encode(), 10, 100)[1] == 101
