"""The worker's side of event streams: a running job's answer text, published as it is decoded.

`DeltaPublisher` is fed the text that became final (the engine's `on_text`, already in whole UTF-8
characters with stop strings held back: specq.engine.decode.textstream) and publishes it at most once every
`interval` (~50 ms) per job, from a thread of its own, so the engine never waits on Redis or the
store. `finish()` publishes what is left with `final` set; once the job's row is written, `clear()`
tells the job's streams on Redis that it ended. Where it goes (`make_channel`):

* Redis broker — `RedisChannel`: the attempt's text so far under `specq:job:<id>:text` (and its
  attempt number under `…:attempt`), APPENDed in the same MULTI as the PUBLISH of the delta on
  `specq:job:<id>:events`, so a subscriber that subscribes first and then reads the text misses
  nothing and can drop what it has twice (specq.streams.follow);
* embedded default — `StoreChannel`: rows of `job_deltas` (specq.storage.deltas), polled by the API;
  each append is fenced by the attempt's token (storage.jobs, "Fencing"): once the job was taken
  over, the append raises Fenced, the publisher stops and calls `on_fenced`, which ends the run.

On Redis (not the job store) the publish is refused once a newer attempt of the job has published
its first delta (the stream's attempt key is higher; one Lua script does the check and the write),
and the publisher stops the same way; before that, a worker whose claim was taken over can still
publish until its watcher learns of it (within one SPECQ_PROGRESS_INTERVAL), under its own attempt
number, and the new attempt's first delta resets the text.

The serving loop calls the same publisher per job: `DeltaPublisher(channel, job_id, attempt, token=…)`,
`feed(text)` per decoded text, `finish()` when the generation ends (or `close()` on failure).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Protocol

from ..contracts import Fenced, redis_keys
from ..settings import ServiceSettings

log = logging.getLogger("specq.worker")

#: seconds between two publishes of one job (the coalescing interval)
PUBLISH_INTERVAL = 0.05
#: Redis keys of a job's stream live this long after its last publish
REDIS_TTL_S = 3600


class Channel(Protocol):
    def publish(self, job_id: str, attempt: int, seq: int, offset: int, text: str, final: bool, *,
                token: str) -> None: ...

    def clear(self, job_id: str) -> None: ...


#: one publish, atomically: refused (0) when a newer attempt already owns the job's stream (its
#: attempt key is higher: a fenced worker's late text must not land in the new attempt's); the first
#: delta of an attempt resets the text; then APPEND + PUBLISH + TTLs
_PUBLISH_LUA = """
local cur = tonumber(redis.call('GET', KEYS[3]) or '-1')
local attempt = tonumber(ARGV[1])
if cur > attempt then return 0 end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[2], '')
  redis.call('SET', KEYS[3], ARGV[1])
end
redis.call('APPEND', KEYS[2], ARGV[3])
redis.call('PUBLISH', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('EXPIRE', KEYS[3], ARGV[5])
return 1
"""


class RedisChannel:
    def __init__(self, url: str) -> None:
        import redis

        self.redis = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=5)
        self._publish = self.redis.register_script(_PUBLISH_LUA)

    def publish(self, job_id: str, attempt: int, seq: int, offset: int, text: str, final: bool, *,
                token: str) -> None:
        """Raises Fenced when a newer attempt of the job has started publishing (module doc)."""
        channel, text_key, attempt_key = redis_keys(job_id)
        message = json.dumps({"attempt": attempt, "seq": seq, "offset": offset, "text": text, "final": final},
                             ensure_ascii=False)
        ok = self._publish(keys=[channel, text_key, attempt_key],
                           args=[int(attempt), int(seq), text.encode("utf-8"), message, REDIS_TTL_S])
        if not ok:
            raise Fenced(f"job {job_id}: attempt {attempt}'s stream was taken over by a newer attempt; "
                         "its text was refused")

    def clear(self, job_id: str) -> None:
        """The job's row is written (it ended): tell its streams, so they read the row now instead of at
        their next poll (api.job_feed). The keys expire; a late subscriber still finds the text."""
        channel, _, _ = redis_keys(job_id)
        self.redis.publish(channel, '{"ended": true}')


class StoreChannel:
    def publish(self, job_id: str, attempt: int, seq: int, offset: int, text: str, final: bool, *,
                token: str) -> None:
        from ..storage import db, deltas

        with db.session() as s:
            deltas.append(s, job_id, attempt, seq, offset, text, final, token=token)

    def clear(self, job_id: str) -> None:
        from ..storage import db, deltas

        with db.session() as s:
            deltas.clear(s, job_id)


def make_channel(settings: ServiceSettings) -> Channel:
    """Redis pub/sub when the broker is Redis, the job store otherwise."""
    url = settings.resolved_broker_url
    if not settings.embedded_broker and url.startswith(("redis://", "rediss://", "unix://")):
        return RedisChannel(url)
    return StoreChannel()


class DeltaPublisher:
    """One attempt of one job: `feed` text, `finish` at the end (module doc)."""

    def __init__(self, channel: Channel, job_id: str, attempt: int, interval: float = PUBLISH_INTERVAL, *,
                 token: str, on_fenced: Callable[[Fenced], None] | None = None) -> None:
        self.channel, self.job_id, self.attempt, self.interval = channel, job_id, attempt, interval
        self.token, self.on_fenced = token, on_fenced
        self._pending = ""
        self._offset = 0  # characters published so far
        self._seq = 0
        self._last = 0.0
        #: time.time() of the first text fed (the job's first token as text: its trace's `first_token`)
        self.first_at: float | None = None
        self._final = False
        self._failed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"specq-stream-{job_id}", daemon=True)
        self._thread.start()

    def feed(self, text: str) -> None:
        if not text:
            return
        if self.first_at is None:
            self.first_at = time.time()
        with self._cond:
            self._pending += text
            self._cond.notify()

    def finish(self, timeout: float = 10.0) -> None:
        """Publish what is pending with `final` set, and stop the thread."""
        with self._cond:
            self._final = True
            self._cond.notify()
        self._thread.join(timeout)

    close = finish

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._final:
                    self._cond.wait()
                due = self._last + self.interval
                while not self._final and time.monotonic() < due:  # coalesce: more text may come meanwhile
                    self._cond.wait(due - time.monotonic())
                text, final = self._pending, self._final
                self._pending = ""
            if text or final:
                self._publish(text, final)
            if final:
                return

    def _publish(self, text: str, final: bool) -> None:
        if self._failed:
            return
        try:
            self.channel.publish(self.job_id, self.attempt, self._seq, self._offset, text, final, token=self.token)
        except Fenced as e:  # the job is another attempt's now: publish nothing more, end the run
            self._failed = True
            if self.on_fenced is not None:
                self.on_fenced(e)
            return
        except Exception as e:  # streams are best effort: the stored result is the record
            self._failed = True
            log.warning("job %s: publishing its text failed (%s: %s); streams get the text at the end",
                        self.job_id, type(e).__name__, e)
            return
        self._seq += 1
        self._offset += len(text)
        self._last = time.monotonic()


__all__ = ["DeltaPublisher", "RedisChannel", "StoreChannel", "make_channel", "PUBLISH_INTERVAL"]
