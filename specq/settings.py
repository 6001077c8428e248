"""Every setting of the job service (API, broker, worker) in one place.

Each field below is one knob: its environment variable is ``SPECQ_`` + the field name in upper case
(``time_limit`` is ``SPECQ_TIME_LIMIT``), its default is the value shown, and the comment above it says
what it does. `ServiceSettings.from_env()` reads them all and checks them together (e.g. the Redis
visibility timeout must be longer than the job time limit, or long jobs would run twice). Command-line
options (`specq worker --gpu 1 --queue big`) override the environment.

Read by other modules, not here (listed so that this file is the one place to look):

* ``SPECQ_HOME`` — where models, the SQLite database and the embedded broker file live
  (default ``~/.cache/specq``; `specq.config`).
* ``SPECQ_DATABASE_URL`` — the job store (default the SQLite file ``$SPECQ_HOME/specq.sqlite``;
  ``postgresql://user@host/db`` for PostgreSQL; `specq.storage.db`).
* ``SPECQ_MAX_INPUT_BYTES`` — the largest document accepted, in UTF-8 bytes (default 8 MiB;
  `specq.storage.jobs`). The API answers 413 above it.
* ``SPECQ_API_URL`` / ``SPECQ_API_KEY`` — where the CLI (`specq submit`, `status`, `result`) sends its
  requests, and the bearer key it sends (`specq.client`). The server never reads SPECQ_API_KEY: with
  ``SPECQ_AUTH=keys`` it checks keys made by `specq keys create` (stored hashed, `specq.storage.keys`).

This module imports nothing heavy: the API process reads it without loading llama.cpp.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .ascii_numbers import ascii_int
from .config import specq_home
from .served_models import parse_aliases

#: the broker used when SPECQ_BROKER_URL is not set: kombu's SQLAlchemy transport on a SQLite file
EMBEDDED_BROKER_FILE = "broker.sqlite"
#: the Celery task name the API enqueues (the API never imports the worker module)
RUN_JOB_TASK = "specq.run_job"
#: seconds past SPECQ_TIME_LIMIT after which Celery kills a prefork child stuck in a job (the engine's
#: callback normally fails the job at the limit itself)
HARD_LIMIT_GRACE = 60.0
#: where `specq up` / `specq api` listen by default, and where the CLI looks by default
DEFAULT_API_HOST = "127.0.0.1"
DEFAULT_API_PORT = 8178


def embedded_broker_url() -> str:
    return f"sqla+sqlite:///{specq_home() / EMBEDDED_BROKER_FILE}"


class SettingsError(ValueError):
    """A setting has a bad value; the message names its environment variable."""


@dataclass
class ServiceSettings:
    """The job service's settings; `SPECQ_<FIELD>` sets each one."""

    # --- broker -----------------------------------------------------------------------------------
    #: Celery broker. ``redis://host:6379/0`` for Redis (several workers, GPUs and hosts);
    #: empty = the embedded broker, kombu's SQLAlchemy transport on ``$SPECQ_HOME/broker.sqlite``
    #: (single machine only; see docs/service.md for its limits)
    broker_url: str = ""
    #: the queue the API sends jobs to and `specq worker` consumes (``--queue`` overrides per worker)
    queue: str = "specq"
    #: seconds between polls of the embedded (SQLAlchemy) broker when it is empty; the queue
    #: overhead of the embedded default is about half of this on average (Redis does not poll).
    #: For 10 s after a delivery or acknowledgement the worker polls every 10 ms instead (a
    #: follow-up comes right after an answer; docs/service.md)
    broker_poll_interval: float = 0.1

    # --- time limits and retries --------------------------------------------------------------------
    #: hard wall-clock limit of one job attempt, seconds; a job over it fails with a message
    time_limit: float = 3600.0
    #: Redis visibility timeout, seconds: how long an unacknowledged (running) job stays invisible
    #: before Redis hands it to another worker. Must exceed time_limit + 60 s, the hard kill (checked);
    #: 0 = time_limit + 600
    visibility_timeout: float = 0.0
    #: attempts per job, counting the first (transient errors only: InputError fails at once)
    max_attempts: int = 3
    #: first retry delay, seconds; doubled per attempt (with +-25% jitter) up to retry_backoff_max
    retry_backoff: float = 2.0
    #: longest retry delay, seconds
    retry_backoff_max: float = 300.0

    # --- worker -------------------------------------------------------------------------------------
    #: GPU index this worker uses (sets CUDA_VISIBLE_DEVICES before llama.cpp loads); empty = leave as is
    gpu: str = ""
    #: GPU index for the speculator, when it gets a device of its own (`--speculator-gpu`): the worker
    #: then sees both (CUDA_VISIBLE_DEVICES=gpu,speculator_gpu), each model whole on its device (split
    #: mode none) and the torch score math on the speculator's; empty = the speculator shares the
    #: target's device. For pipelined jobs (params.pipelined); not measured on two GPUs yet
    speculator_gpu: str = ""
    #: processes per worker, each with its own copy of the models (1 = Celery's solo pool: one job at
    #: a time, models loaded in the worker process; >1 = prefork, models loaded after the fork)
    concurrency: int = 1
    #: jobs one worker process runs at once on its one copy of the models (serving slots:
    #: specq/engine/serving/loop.py; Celery's threads pool with this many threads); empty = 8 when the
    #: target runs on a GPU, 1 on the CPU
    slots: int | None = None
    #: with several slots, one unified KV cache instead of one stream per slot (EngineOptions.kv_unified)
    kv_unified: bool = False
    #: most kept prompt tokens of one job prefilled per engine step next to the running jobs'
    #: decode tokens (bounds the other jobs' inter-token gap); 0 = on a GPU what the decode rows leave of
    #: n_batch (fewer calls per prefill, as llama-server), on the CPU n_ubatch
    prefill_chunk: int = 0
    #: with several slots, the speculator's scoring runs on a thread of its own beside the target's
    #: decode and prefill batches (engine/serving/score_thread.py): auto (on when the target is on a GPU),
    #: on or off (scored on the engine thread, between decode batches)
    score_thread: str = "auto"
    #: with several slots, a worker that claims a job asking about a stored document (`document_id`)
    #: also claims that tenant's other queued jobs on the same document, up to its free slots, and
    #: runs them beside it in the engine loop (their questions share the document's prefill through
    #: the prompt cache); their own broker messages then find them claimed and do nothing
    #: (storage.groups, docs/serving.md "Group claims"). off = every job waits for its own message
    group_claims: bool = True
    #: with group claims: seconds a delivery may wait before claiming when the job it would claim asks
    #: about a stored document with more queued questions than this process has free slots (and some
    #: of its slots are busy), for more slots to free, so that the document's questions start together
    #: as one group (one prefill of the document, one group-sparse union, one decode wave) instead of
    #: a slot at a time (docs/serving.md "Group claims"). 0 = claim at once with the slots free
    group_hold: float = 0.0
    #: with several slots, specprefill questions about one document that are in the engine loop
    #: together share one sparse prefill of the target: the union of their kept chunks, prefilled once
    #: and copied on the device to the others' slots, which prefill only their own question
    #: (engine/serving/groups.py). Off by default since 2026-12-05: a group answer sees the other questions'
    #: kept chunks too, and on the real pair at 30K group answers were right 0.425 of the time against
    #: 0.575 for single specprefill and 0.500 for baseline (7 questions lost, 1 gained; docs/history.md
    #: "Group-sparse at 30K"). on = an operator trading that for throughput (docs/serving.md)
    group_sparse: bool = False
    #: seconds a stopping worker (SIGTERM) gives its running jobs to finish; the rest go back to
    #: the queue (jobs waiting for a slot go back at once); below `specq up`'s 30 s stop deadline
    drain_grace: float = 20.0
    #: after loading, run a specprefill job of two scoring windows at production ubatch sizes, so the
    #: first real job pays no setup cost; the worker is ready (heartbeat, /readyz) only after it
    warm_up: bool = True
    #: seconds between writes of a running job's progress and heartbeat, and between checks for a
    #: cancel request (a cancel takes effect at the next phase, window or token after that)
    progress_interval: float = 0.5
    #: a running job whose heartbeat is older than this (seconds) was left by a dead worker: a
    #: redelivery may claim it, and the reconciler requeues it (or fails it after max_attempts)
    stale_after: float = 120.0
    #: seconds past a job's time limit after which a worker whose engine has not stepped since that
    #: limit (a thread stuck in a C call: the limit could not end it) exits with status 70, to be
    #: restarted by its supervisor while the reconciler runs its jobs again (worker/watchdog.py,
    #: docs/reliability.md); < 0 = no watchdog
    watchdog_grace: float = 60.0
    #: seconds between the reconciler's sweeps in each worker process (specq.reconciler: stale running
    #: jobs are requeued and re-sent, or failed); 0 = none in the workers (run `specq reconcile` instead)
    reconcile_interval: float = 30.0
    #: seconds a worker keeps retrying a store write (a result, a final status) while the database is
    #: unreachable (a PostgreSQL restart or failover) before giving the job back to the broker
    store_retry_for: float = 300.0
    #: a worker whose target or speculator (a registry model) is not in $SPECQ_HOME/models pulls it
    #: when it starts (off: it waits, not ready, and checks again every 5 s). Either way its heartbeat
    #: names the missing file until it is loaded (/readyz `workers_not_ready`, /v1/workers `not_ready`).
    #: compose.yaml turns it off: the `models` one-shot fills the volume, so a missing file there means
    #: a volume that is not mounted, which a pull into the container would only hide
    pull_models: bool = True
    #: engine options of the worker's models (see specq.engine.options.EngineOptions); empty/None =
    #: the engine's defaults (the registry's default target and speculator, all layers on the GPU)
    target: str = ""
    speculator: str = ""
    #: an EAGLE3 head for `draft: eagle3` (EngineOptions.drafter)
    drafter: str = ""
    n_gpu_layers: int | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    #: tokens per prefill llama_decode call (EngineOptions.call_tokens; 0 = per backend, ~0.5 s each)
    call_tokens: int | None = None
    threads: int | None = None
    flash_attn: bool | None = None
    #: CUDA graphs for the models' decodes; off by default (EngineOptions.cuda_graphs says why)
    cuda_graphs: bool | None = None
    #: scoring windows run as parallel sequences (EngineOptions.n_parallel; 0 = 8 on GPU, 1 on CPU)
    n_parallel: int | None = None
    #: where the scoring math runs: auto, numpy or torch (EngineOptions.score_math)
    score_math: str = ""
    #: who runs the speculator's scoring windows: auto, llama or torch (EngineOptions.speculator_impl; "" = auto:
    #: torch with the models on a GPU where PyTorch runs there, else llama). torch keeps the same chunks
    #: (specq/engine/scoring/scorer.py says where it stands)
    speculator_impl: str = ""
    #: batch-invariant target numerics: auto, on or off (EngineOptions.batch_invariant)
    batch_invariant: str = ""
    #: bytes of host memory for the worker's saved KV states (the speculator's document windows and
    #: the target's prompt prefixes, one LRU budget; EngineOptions.cache_bytes); 0 = no caches
    cache_bytes: int = 2 << 30
    #: a directory that mirrors those saved states, so they outlive a worker restart (EngineOptions.cache_dir;
    #: engine/cache/disk.py); "" = host memory only
    cache_dir: str = ""
    #: which speculator scoring windows go into that cache (EngineOptions.spec_cache_save): always
    #: (default: every document's) or repeat (a stored document's at once, any other's at its second
    #: sight: a one-off document costs no ~400 MB device-to-host copy per 32K tokens; docs/serving.md)
    spec_cache_save: str = ""
    #: mode auto's thresholds (EngineOptions.auto_min_tokens, auto_quality_min_tokens; docs/engine.md):
    #: baseline below the break-even length (0 = the backend's measured one); specprefill only where
    #: a passing evidence row has the job's exact resolved settings (-1: engine/policy/evidence.py, the shipped
    #: rows of which none passes today, plus the store's; SPECQ_AUTO_QUALITY_MIN_TOKENS=N >= 0: the
    #: operator's override, from N prompt tokens on, reasons saying "operator override"); a group of questions
    #: about a stored document (a group claim) runs one group-sparse prefill from auto_group_min_tokens
    #: on (0 = the backend's measured length, engine/policy/auto.py GROUP_MIN_TOKENS; -1 = never)
    auto_min_tokens: int | None = None
    auto_quality_min_tokens: int | None = None
    auto_group_min_tokens: int | None = None
    #: shadow checks (engine/policy/shadow.py, worker/shadow.py; docs/quality.md "Shadow checks"): this
    #: fraction of the greedy jobs mode auto sends to one-off specprefill are answered in baseline too,
    #: only while the worker has no other work, and cancelled the moment it claims a job; the answers'
    #: agreement is counted per evidence key, and a row whose agreement's 90% lower bound falls below 0.8
    #: after >= 20 checks is disabled (mode auto's reason says so). 0 = none; 1 = every such job
    shadow_rate: float = 0.0

    # --- API ------------------------------------------------------------------------------------------
    #: address `specq api` / `specq up` listen on
    api_host: str = DEFAULT_API_HOST
    api_port: int = DEFAULT_API_PORT
    #: names this API process in GET /healthz (`instance`); empty = a random name per process. `specq
    #: up` sets a fresh one for the API it starts, and counts the service as started only when /healthz
    #: on its port answers with it (not another instance that already held the port)
    instance_id: str = ""
    #: ``none``: no authentication, every caller is one user who sees everything (the single-user
    #: default, e.g. `specq up` on SQLite); ``keys``: every /v1 request and /metrics must send
    #: ``Authorization: Bearer <key>`` with a key from `specq keys create` (401 otherwise), and each
    #: key sees only its tenant's jobs and batches (admin keys see all). docs/security.md
    auth: str = "none"
    #: most unfinished (queued or running) jobs per tenant; a submit or batch over it answers 429
    #: and stores nothing (0 = no limit)
    max_queued_jobs: int = 100_000
    #: largest request body, bytes; 0 = 2 x SPECQ_MAX_INPUT_BYTES + 1 MiB (JSON escaping, multipart framing)
    max_request_bytes: int = 0
    #: largest page of GET /v1/jobs
    max_list_limit: int = 500
    #: other names the OpenAI routes accept for the configured target (SPECQ_TARGET), like vLLM's
    #: ``--served-model-name`` (`specq up --served-model-name`): comma-separated, each 1-255 characters.
    #: Each is listed in GET /v1/models and accepted wherever a request names a model (chat,
    #: completions, batch lines), besides the target's id and its `.gguf` file name; any other name is
    #: 404 model_not_found (specq/served_models.py). A request's `model` is echoed as it was sent
    served_model_name: str = ""
    #: largest batch upload (POST /v1/batches: a JSONL file, or several documents), bytes
    max_batch_bytes: int = 256 * 1024 * 1024
    #: most requests (JSONL lines or files) in one batch
    max_batch_requests: int = 50_000
    #: most bytes one tenant's files may hold together (POST /v1/files answers 413 above it, and so does
    #: a native POST /v1/batches for the input it stores; batches' output files are not counted against it)
    max_file_storage_bytes: int = 10 * 1024**3
    #: without keys (SPECQ_AUTH=none), the names the API answers to besides localhost, 127.0.0.1, ::1
    #: and its listen address (comma-separated; ``*`` = any): the `Host` header must be one of them, and
    #: a browser's cross-origin request must come from one (DNS rebinding and CSRF; docs/security.md)
    allowed_hosts: str = ""
    #: seconds a client has to send a whole request (headers and body) from the moment it connects or
    #: its previous response ended; then it gets 408 and is disconnected (half-open and slow clients).
    #: Raise it for batch uploads over slow links.
    receipt_timeout: float = 60.0
    #: most open connections per API process; above it the oldest connection that has not finished
    #: sending a request is closed to make room (or, when every one is busy, the new one gets 503)
    max_connections: int = 2048
    #: most responses streaming at once per API process (batch exports, event streams); one more
    #: answers 503 with Retry-After, so streams never take every connection. 0 = half of max_connections
    #: (1,024 by default: measured to leave /healthz at tens of ms even with each stream on its own job,
    #: docs/reliability.md "Streams and the event loop")
    max_streams: int = 0
    #: seconds the OpenAI routes hold a `stream: true` response's headers at most, waiting for the
    #: worker to tokenize the prompt: a prompt over the context then answers a plain 400
    #: (`context_length_exceeded`) instead of an error inside a started stream. A job still queued
    #: after this starts its stream anyway (0 = never hold; docs/openai.md)
    stream_hold: float = 300.0
    #: how long finished jobs and batches are kept: after this (``30d``, ``12h``, ``90m``, or seconds),
    #: a finished job's document, question, result and timings, and the job itself, are deleted; a
    #: finished batch goes with all its jobs. Empty or 0 = keep forever (the default). The API
    #: process sweeps every retention/10 (at least every 10 minutes).
    retention: str = ""

    # ------------------------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> "ServiceSettings":
        """Settings from SPECQ_* variables, then `overrides` (None values are ignored), checked."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = "SPECQ_" + f.name.upper()
            raw = env.get(var, "").strip()
            if raw:
                kwargs[f.name] = _parse(var, f.type, raw)
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**kwargs)
        settings.validate()
        return settings

    def validate(self) -> None:
        checks = [
            (self.time_limit > 0, "SPECQ_TIME_LIMIT must be > 0 seconds"),
            (self.visibility_timeout >= 0, "SPECQ_VISIBILITY_TIMEOUT must be >= 0"),
            (
                self.visibility_timeout == 0 or self.visibility_timeout > self.hard_time_limit,
                f"SPECQ_VISIBILITY_TIMEOUT ({self.visibility_timeout:g}s) must be longer than SPECQ_TIME_LIMIT "
                f"+ {HARD_LIMIT_GRACE:g}s ({self.hard_time_limit:g}s), or Redis hands running jobs to a second worker",
            ),
            (self.max_attempts >= 1, "SPECQ_MAX_ATTEMPTS must be >= 1"),
            (self.retry_backoff >= 0 and self.retry_backoff_max >= 0, "SPECQ_RETRY_BACKOFF(_MAX) must be >= 0"),
            (self.concurrency >= 1, "SPECQ_CONCURRENCY must be >= 1"),
            (self.slots is None or 1 <= self.slots <= 256, "SPECQ_SLOTS must be in [1, 256]"),
            (self.prefill_chunk >= 0, "SPECQ_PREFILL_CHUNK must be >= 0 (0 = the default: the batch's room on a GPU, n_ubatch on the CPU)"),
            (self.score_thread in ("auto", "on", "off"), f"SPECQ_SCORE_THREAD must be auto, on or off, not {self.score_thread!r}"),
            (self.drain_grace >= 0, "SPECQ_DRAIN_GRACE must be >= 0 seconds"),
            (0 <= self.group_hold <= 60, "SPECQ_GROUP_HOLD must be in [0, 60] seconds (0 = claim at once)"),
            (0 <= self.shadow_rate <= 1, "SPECQ_SHADOW_RATE must be in [0, 1] (0 = no shadow checks)"),
            (self.auto_group_min_tokens is None or self.auto_group_min_tokens >= -1,
             "SPECQ_AUTO_GROUP_MIN_TOKENS must be >= -1 (0 = the backend's measured length, -1 = never)"),
            (self.speculator_gpu == "" or (ascii_int(self.speculator_gpu) is not None
                                           and (self.gpu == "" or ascii_int(self.gpu) is not None)),
             "SPECQ_SPECULATOR_GPU must be one GPU index (and SPECQ_GPU, with it, one index too)"),
            (self.progress_interval > 0, "SPECQ_PROGRESS_INTERVAL must be > 0"),
            (self.stale_after > self.progress_interval * 4, "SPECQ_STALE_AFTER must be well above SPECQ_PROGRESS_INTERVAL"),
            (self.reconcile_interval >= 0, "SPECQ_RECONCILE_INTERVAL must be >= 0 (0 = off)"),
            (self.store_retry_for >= 0, "SPECQ_STORE_RETRY_FOR must be >= 0"),
            (self.broker_poll_interval > 0, "SPECQ_BROKER_POLL_INTERVAL must be > 0"),
            (1 <= self.api_port <= 65535, "SPECQ_API_PORT must be a TCP port"),
            (self.max_request_bytes >= 0, "SPECQ_MAX_REQUEST_BYTES must be >= 0"),
            (self.max_batch_bytes > 0, "SPECQ_MAX_BATCH_BYTES must be > 0"),
            (self.max_batch_requests >= 1, "SPECQ_MAX_BATCH_REQUESTS must be >= 1"),
            (self.max_file_storage_bytes > 0, "SPECQ_MAX_FILE_STORAGE_BYTES must be > 0"),
            (self.auth in ("none", "keys"), f"SPECQ_AUTH must be none or keys, not {self.auth!r}"),
            (self.score_math in ("", "auto", "numpy", "torch"), f"SPECQ_SCORE_MATH must be auto, numpy or torch, not {self.score_math!r}"),
            (self.speculator_impl in ("", "auto", "llama", "torch"),
             f"SPECQ_SPECULATOR_IMPL must be auto, llama or torch, not {self.speculator_impl!r}"),
            (self.batch_invariant in ("", "auto", "on", "off"),
             f"SPECQ_BATCH_INVARIANT must be auto, on or off, not {self.batch_invariant!r}"),
            (self.max_queued_jobs >= 0, "SPECQ_MAX_QUEUED_JOBS must be >= 0 (0 = no limit)"),
            (self.cache_bytes >= 0, "SPECQ_CACHE_BYTES must be >= 0 (0 = no caches)"),
            (self.spec_cache_save in ("", "always", "repeat"),
             f"SPECQ_SPEC_CACHE_SAVE must be always or repeat, not {self.spec_cache_save!r}"),
            (bool(self.queue.strip()), "SPECQ_QUEUE must not be empty"),
            (self.receipt_timeout > 0, "SPECQ_RECEIPT_TIMEOUT must be > 0 seconds"),
            (self.max_connections >= 16, "SPECQ_MAX_CONNECTIONS must be >= 16"),
            (0 <= self.max_streams < self.max_connections, "SPECQ_MAX_STREAMS must be >= 0 and below SPECQ_MAX_CONNECTIONS"),
            (self.stream_hold >= 0, "SPECQ_STREAM_HOLD must be >= 0 seconds (0 = never hold)"),
            (1 <= self.max_list_limit <= 10_000, "SPECQ_MAX_LIST_LIMIT must be in [1, 10000]"),
        ]
        for ok, message in checks:
            if not ok:
                raise SettingsError(message)
        try:
            parse_aliases(self.served_model_name)
        except ValueError as e:
            raise SettingsError(f"SPECQ_SERVED_MODEL_NAME: {e}") from None
        self.retention_s  # noqa: B018  (parses SPECQ_RETENTION, raising SettingsError)

    # --- derived values -------------------------------------------------------------------------------
    @property
    def retention_s(self) -> float:
        """SPECQ_RETENTION in seconds; 0 = keep forever."""
        raw = self.retention.strip().lower()
        if raw in ("", "0", "off", "none", "forever"):
            return 0.0
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
        number, unit = (raw[:-1], raw[-1]) if raw[-1] in units else (raw, "s")
        try:
            if not number.isascii():  # float('٣') is 3.0: ASCII digits only
                raise ValueError
            value = float(number) * units[unit]
        except ValueError:
            value = -1.0
        if not (value > 0 and value < float("inf")):
            raise SettingsError(f"SPECQ_RETENTION must be a duration like 30d, 12h, 90m or seconds (or empty = off), "
                                f"not {self.retention!r}")
        return value

    @property
    def resolved_max_streams(self) -> int:
        return self.max_streams or self.max_connections // 2

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or embedded_broker_url()

    @property
    def embedded_broker(self) -> bool:
        """True for the SQLAlchemy transport (the default): single machine, polled."""
        return self.resolved_broker_url.startswith(("sqla+", "sqlalchemy+"))

    @property
    def hard_time_limit(self) -> float:
        """Seconds after which a prefork child still running a job is killed (time_limit + grace)."""
        return self.time_limit + HARD_LIMIT_GRACE

    @property
    def resolved_visibility_timeout(self) -> float:
        return self.visibility_timeout or self.time_limit + 600.0

    @property
    def api_url(self) -> str:
        host = "127.0.0.1" if self.api_host in ("0.0.0.0", "::", "") else self.api_host
        return f"http://{host}:{self.api_port}"

    def resolved_max_request_bytes(self) -> int:
        if self.max_request_bytes:
            return self.max_request_bytes
        from .storage.limits import max_input_bytes

        return 2 * max_input_bytes() + (1 << 20)

    def resolved_slots(self, backend: str = "cpu") -> int:
        """SPECQ_SLOTS, or its default: 8 when the target runs on a GPU (`backend` not cpu and layers
        offloaded), else 1; always 1 with several processes (SPECQ_CONCURRENCY > 1)."""
        if self.concurrency > 1:
            return 1
        if self.slots:
            return self.slots
        return 8 if backend != "cpu" and self.n_gpu_layers != 0 else 1

    def engine_options(self, slots: int = 1):
        """The worker's EngineOptions (engine defaults for fields left unset)."""
        from .engine.options import EngineOptions

        opts = EngineOptions(slots=max(1, int(slots)), kv_unified=self.kv_unified)
        if self.target:
            opts.target = self.target
        if self.speculator:
            opts.speculator = self.speculator
        if self.drafter:
            opts.drafter = self.drafter
        if self.score_math:
            opts.score_math = self.score_math
        if self.speculator_impl:
            opts.speculator_impl = self.speculator_impl
        if self.batch_invariant:
            opts.batch_invariant = self.batch_invariant
        if self.spec_cache_save:
            opts.spec_cache_save = self.spec_cache_save
        if self.cache_dir:
            opts.cache_dir = self.cache_dir
        if self.speculator_gpu != "":
            # devices as the worker made them visible (visible_devices): the target first
            opts.main_gpu, opts.speculator_gpu = (0, 1) if self.speculator_gpu != self.gpu else (0, 0)
            if self.gpu == "":
                opts.speculator_gpu = int(self.speculator_gpu)
        for mine, theirs in (("n_gpu_layers", "n_gpu_layers"), ("n_ctx", "n_ctx"), ("n_batch", "n_batch"),
                             ("n_ubatch", "n_ubatch"), ("threads", "n_threads"), ("flash_attn", "flash_attn"), ("cuda_graphs", "cuda_graphs"),
                             ("n_parallel", "n_parallel"), ("cache_bytes", "cache_bytes"),
                             ("auto_min_tokens", "auto_min_tokens"),
                             ("auto_quality_min_tokens", "auto_quality_min_tokens"),
                             ("auto_group_min_tokens", "auto_group_min_tokens"), ("call_tokens", "call_tokens")):
            value = getattr(self, mine)
            if value is not None:
                setattr(opts, theirs, value)
        return opts

    def visible_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES for the worker: `gpu`, then `speculator_gpu` when it differs; None =
        leave the environment as it is (no --gpu)."""
        if self.gpu == "":
            return None
        if self.speculator_gpu not in ("", self.gpu):
            return f"{self.gpu},{self.speculator_gpu}"
        return self.gpu

    def backoff(self, attempt: int, jitter: float = 0.0) -> float:
        """Seconds to wait before retrying after failed attempt number `attempt` (1-based);
        `jitter` in [-1, 1] scales the +-25% spread."""
        base = min(self.retry_backoff_max, self.retry_backoff * (2 ** max(0, attempt - 1)))
        return max(0.0, base * (1.0 + 0.25 * jitter))


def _parse(var: str, type_name: Any, raw: str) -> Any:
    t = str(type_name).replace(" ", "")
    try:
        if t.startswith(("int", "float")) and not raw.isascii():  # int('٣') is 3: ASCII digits only
            raise ValueError
        if t.startswith("bool"):
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if t.startswith("int"):
            return int(raw)
        if t.startswith("float"):
            return float(raw)
        return raw
    except ValueError:
        raise SettingsError(f"{var} has a bad value: {raw!r}") from None


__all__ = ["ServiceSettings", "SettingsError", "RUN_JOB_TASK", "embedded_broker_url", "DEFAULT_API_PORT"]
