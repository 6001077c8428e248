"""`specq bench serve`: a workload of jobs against a running service, by one of two paths.

**chat** (the default; specq and llama-server): every job is one inline prompt (document + question)
to the OpenAI `/v1/chat/completions` with `stream: true`; the same client code for both servers.

**documents** (specq only, `documents=True`, CLI `--documents`): the way specq's own API is meant for
many questions about one document. Each distinct document is stored once (`POST /v1/documents`), then
each question is a native job naming it (`POST /v1/jobs` with `document_id`, `question` and `params`:
mode, keep, max_tokens, ignore_eos, temperature 0) and followed to its end on the job's server-sent
events (`GET /v1/jobs/{id}/events`: `delta` events carry the answer text, `done` its usage and
`timings_ms`). Only this path reaches specq's reuse of a stored document: group claims in the worker
(a worker with free slots claims that document's queued questions together), mode auto's rule 1b
(a stored document runs baseline so the target's prompt cache keeps its KV) and the caches' hits.
**The uploads are not counted in the makespan**: they happen before t=0 (as a user who stored the
documents earlier), are timed apart (`upload_s`, per document `upload_ms`), and the summary also
gives `jobs_per_min_with_upload` (the makespan plus the upload time) for a stricter reading.

Workload: `docs` distinct documents of about `doc_tokens` tokens (`chars_per_token` characters per
token), `questions` questions per document (jobs = docs x questions; job j = document j // questions,
question j % questions), `max_tokens` output tokens with `ignore_eos` (specq: `specq.ignore_eos` or the
job's `params.ignore_eos`; llama-server: its own `ignore_eos`), specq's `mode` / `keep` (llama-server
gets none). Arrival: `t0` = every job sent at t=0; `per-doc` = each document's questions one after the
other (question q+1 sent when question q ended), the documents in parallel (docs streams at once);
a fixed rate in jobs per second; or `poisson:R`, a Poisson process of R jobs per second (exponential
gaps drawn from `seed`, so two runs of one workload send at the same offsets: `arrival_offsets`) —
sustained random arrivals, e.g. to measure what idle-time work such as shadow checks
(SPECQ_SHADOW_RATE) costs the jobs that arrive while it runs.
The mixed workload (`lengths_mix`, `max_tokens_mix`; chat path) draws each job's document and output
length from ranges, seeded (specq/bench/workloads.py), and adds a per-length-band summary.

Breakdown (`breakdown_ms`, specq): per gap between the job's server-side stamps (GET /v1/jobs/{id}
`trace`: accepted, stored, queued, claimed, engine start, first token, first text sent, engine done,
done) and the client's send and first text, p50/p90 over the jobs: where a job's time went before its
first token and after it. Inside the engine (`first_token_ms`, and `first_token_ms_later_questions`
for a document's cached follow-ups): the p50 of each part of the engine's time to first token (its
`ft_*` timings, engine/serving/loop.py module doc).

Per job: client TTFT (request sent -> first streamed answer text; on the documents path "sent" is
before the POST /v1/jobs), end time, output tokens (the usage of the last chunk or of the `done`
event, else the content chunks counted) and specq's engine-side timings (`timings_ms`: `ttft` from the
worker's submission to the engine loop, `slot_wait`, `interleave_wait`, ...). For specq (both paths)
the job id and, read after the run (GET /v1/jobs/{id}, outside the makespan), `queue_wait_ms`, the
worker, start/finish times and the result's `spec` (mode, reason, windows, cache: speculator and
target prompt-cache hits). Summary: jobs/min over the makespan (first job sent -> last job done),
TTFT p50/p95, decode tokens/s per job (output tokens after the first / time after the first) and in
all, queue wait, and the modes and cache hits the results report. The report's `path` says which
path ran. The per-job prefill-compute floor (`prefill_floor_ms_p50`, specq only): each job's own
engine time on its scoring, selection and prefill (`prefill_work_ms`), and `jobs_per_min_prefill_floor`,
the rate if those ran back to back and nothing else, a ceiling while they share one thread (one slot,
or `SPECQ_SCORE_THREAD=off`); the score thread overlaps the speculator's part with the target's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from . import workloads
from .stats import percentile

WORDS = ("request handler buffer stream token window cache index record value field query answer "
         "document server client model layer vector matrix kernel thread queue worker result").split()


@dataclass
class Workload:
    docs: int = 8
    doc_tokens: int = 1000
    questions: int = 1
    max_tokens: int = 64
    #: "t0" = every job at t=0; "per-doc" = each document's questions in sequence, the documents in
    #: parallel; "poisson:R" = a Poisson process of R jobs per second; else jobs per second (fixed spacing)
    arrival: str = "t0"
    mode: str = "baseline"
    keep: float = 0.3
    chars_per_token: float = 4.0
    seed: int = 0
    #: the documents path (store each document once, jobs name its document_id); else chat
    documents: bool = False
    #: the mixed workload (specq/bench/workloads.py; chat path, one question per document): "LO:HI"
    #: document tokens drawn log-uniform per job, output tokens drawn uniform per job ("" = fixed)
    lengths_mix: str = ""
    max_tokens_mix: str = ""
    #: band edges (tokens) of the mixed summary's per-band rows
    length_bands: str = "8192,32768"

    @property
    def jobs(self) -> int:
        return self.docs * self.questions


@dataclass
class JobRecord:
    index: int
    doc: int = 0
    question: int = 0
    sent_s: float = 0.0
    first_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    chunks: int = 0
    error: str = ""
    engine: dict[str, float] = field(default_factory=dict)
    #: specq: the job's id; the documents path: the stored document's id
    job_id: str = ""
    document_id: str = ""
    #: specq, read after the run (GET /v1/jobs/{id}): queue wait, attempts, worker, start/finish, and
    #: the result's spec (mode, reason, windows, cache)
    queue_wait_ms: float | None = None
    attempts: int = 0
    worker: str = ""
    started_at: str = ""
    finished_at: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    #: the documents path: `reset` events (a retried attempt restarted the answer)
    resets: int = 0
    #: wall clock (unix s) of the request's send and of its first answer text here, for the breakdown
    sent_unix: float = 0.0
    first_unix: float | None = None
    #: specq, read after the run: the job's server-side stamps (GET /v1/jobs/{id} `trace`, unix s)
    trace: dict[str, float | None] = field(default_factory=dict)

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_s is None else (self.first_s - self.sent_s) * 1000.0


def make_document(i: int, n_tokens: int, chars_per_token: float, seed: int = 0) -> str:
    """A distinct pseudo-code document of about n_tokens tokens (job i's own words and numbers)."""
    rng = random.Random(f"{seed}:{i}")
    target = int(n_tokens * chars_per_token)
    lines, size, k = [f"# document {i}\n"], 0, 0
    while size < target:
        w = rng.sample(WORDS, 3)
        line = f"def {w[0]}_{i}_{k}({w[1]}):\n    return {w[1]}.get('{w[2]}', {rng.randint(0, 99999)})\n"
        lines.append(line)
        size += len(line)
        k += 1
    return "".join(lines)[:target]


def question_text(d: int, q: int) -> str:
    return f"Question {q}: which function of document {d} returns the largest default value?"


def job_plan(w: Workload) -> list[workloads.PlannedJob]:
    """Each job's document tokens, output tokens and send offset (mixed or fixed), from the seed alone."""
    offsets = None if w.arrival == "per-doc" else arrival_offsets(w.arrival, w.jobs, w.seed)
    if w.lengths_mix or w.max_tokens_mix:
        return workloads.plan(w.jobs, w.lengths_mix or f"{w.doc_tokens}:{w.doc_tokens}",
                              w.max_tokens_mix or f"{w.max_tokens}:{w.max_tokens}", w.seed, offsets)
    return [workloads.PlannedJob(j, w.doc_tokens, w.max_tokens, None if offsets is None else offsets[j])
            for j in range(w.jobs)]


def build_requests(w: Workload, kind: str, model: str) -> list[dict[str, Any]]:
    """The chat request bodies, job j = document j // questions, question j % questions (its lengths
    from `job_plan`)."""
    out = []
    jobs = job_plan(w)
    docs = [make_document(d, jobs[d * w.questions].doc_tokens, w.chars_per_token, w.seed) for d in range(w.docs)]
    for j in range(w.jobs):
        d, q = divmod(j, w.questions)
        doc, question = docs[d], question_text(d, q)
        body: dict[str, Any] = {
            "model": model, "stream": True, "max_tokens": jobs[j].max_tokens, "temperature": 0.0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{doc}\n\n{question}"}],
        }
        if kind == "specq":
            body["specq"] = {"ignore_eos": True, "mode": w.mode, "keep": w.keep}
        else:  # llama-server's own field
            body["ignore_eos"] = True
        out.append(body)
    return out


@contextlib.contextmanager
def _recorded(rec: JobRecord, t0: float) -> Iterator[None]:
    """Around one job's requests: a transport error is recorded and the run goes on; the job's end time
    is set, and without a usage chunk its output tokens are the content chunks counted."""
    try:
        yield
    except Exception as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end_s = time.perf_counter() - t0
        if not rec.output_tokens:
            rec.output_tokens = rec.chunks


async def _one(client, url: str, body: dict, rec: JobRecord, t0: float) -> None:
    rec.sent_s, rec.sent_unix = time.perf_counter() - t0, time.time()
    with _recorded(rec, t0):
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):  # a failed job ends its stream with an error object (both servers)
                    err = chunk["error"]
                    rec.error = str(err.get("message") if isinstance(err, dict) else err)[:300] or "error"
                    break
                for ch in chunk.get("choices") or []:
                    text = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                    if text:
                        rec.chunks += 1
                        if rec.first_s is None:
                            rec.first_s, rec.first_unix = time.perf_counter() - t0, time.time()
                usage = chunk.get("usage")
                if usage:
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                spec = chunk.get("specq") or {}
                if spec.get("job_id") and not rec.job_id:
                    rec.job_id = str(spec["job_id"])
                timings = spec.get("timings_ms") or {}
                if timings:
                    rec.engine = {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}


def _client(base_url: str, api_key: str, timeout: float, n: int):
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, limits=limits)


def check_arrival(arrival: str) -> str:
    """Why `arrival` is no arrival order ("" = it is one)."""
    if arrival in ("t0", "per-doc"):
        return ""
    rate = arrival[len("poisson:"):] if arrival.startswith("poisson:") else arrival
    try:
        ok = 0 < float(rate) < float("inf")
    except ValueError:
        ok = False
    return "" if ok else (f"--arrival must be t0, per-doc, a positive rate in jobs per second or poisson:RATE, "
                          f"not {arrival!r}")


def arrival_offsets(arrival: str, n: int, seed: int = 0) -> list[float]:
    """Seconds after t=0 at which each of `n` jobs is sent (t0, a fixed rate or poisson:R; not per-doc)."""
    if arrival == "t0":
        return [0.0] * n
    if arrival.startswith("poisson:"):
        rate = float(arrival[len("poisson:"):])
        rng = random.Random(f"arrival:{seed}")
        out, t = [], 0.0
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    return [i / float(arrival) for i in range(n)]


async def _arrive(recs: list[JobRecord], arrival: str, questions: int, t0: float, one, seed: int = 0) -> None:
    """Run `one(rec)` for every job in the arrival order (module doc)."""
    if arrival == "per-doc":
        async def in_sequence(d: int) -> None:
            for q in range(questions):
                await one(recs[d * questions + q])

        await asyncio.gather(*(in_sequence(d) for d in range(len(recs) // questions)))
        return
    offsets = arrival_offsets(arrival, len(recs), seed)
    tasks = []
    for at, rec in zip(offsets, recs):
        if at:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        tasks.append(asyncio.create_task(one(rec)))
    await asyncio.gather(*tasks)


def _records(w: Workload) -> list[JobRecord]:
    return [JobRecord(j, *divmod(j, w.questions)) for j in range(w.jobs)]


async def _drive(base_url: str, bodies: list[dict], w: Workload, api_key: str, timeout: float) -> list[JobRecord]:
    recs = _records(w)
    async with _client(base_url, api_key, timeout, len(bodies)) as client:
        t0 = time.perf_counter()
        await _arrive(recs, w.arrival, w.questions, t0,
                      lambda rec: _one(client, "/v1/chat/completions", bodies[rec.index], rec, t0), seed=w.seed)
    return recs


# --- the documents path (specq) -------------------------------------------------------------------------


async def _upload(client, w: Workload) -> list[dict[str, Any]]:
    """Store each document once (POST /v1/documents, one after the other): id, created, bytes, ms."""
    out = []
    for d in range(w.docs):
        text = make_document(d, w.doc_tokens, w.chars_per_token, w.seed)
        t = time.perf_counter()
        r = await client.post("/v1/documents", json={"text": text, "filename": f"bench-doc-{d}.txt"})
        ms = (time.perf_counter() - t) * 1000.0
        if r.status_code not in (200, 201):
            raise RuntimeError(f"POST /v1/documents: HTTP {r.status_code}: {r.text[:300]}")
        body = r.json()
        # created false: this tenant had stored the same text before (an earlier run against the same
        # service): the worker's caches may still hold it
        out.append({"doc": d, "document_id": body["id"], "created": r.status_code == 201,
                    "size_bytes": body.get("size_bytes"), "upload_ms": round(ms, 3)})
    return out


def job_params(w: Workload) -> dict[str, Any]:
    """`params` of each documents-path job (RunParamsIn)."""
    return {"mode": w.mode, "keep": w.keep, "max_tokens": w.max_tokens, "ignore_eos": True, "temperature": 0.0}


async def _follow_job(client, body: dict, rec: JobRecord, t0: float) -> None:
    """POST /v1/jobs, then its events until `done` (docs/service.md "Job events")."""
    rec.sent_s, rec.sent_unix = time.perf_counter() - t0, time.time()
    with _recorded(rec, t0):
        r = await client.post("/v1/jobs", json=body)
        if r.status_code != 202:
            rec.error = f"HTTP {r.status_code}: {r.text[:200]}"
            return
        rec.job_id = str(r.json()["id"])
        done = None
        async with client.stream("GET", f"/v1/jobs/{rec.job_id}/events") as s:
            if s.status_code != 200:
                rec.error = f"events: HTTP {s.status_code}: {(await s.aread()).decode(errors='replace')[:200]}"
                return
            event = ""
            async for line in s.aiter_lines():
                if not line:
                    event = ""
                    continue
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue  # "id:" lines and ": keep-alive" comments
                data = json.loads(line[5:].strip())
                if event == "delta" and data.get("text"):
                    rec.chunks += 1
                    if rec.first_s is None:
                        rec.first_s, rec.first_unix = time.perf_counter() - t0, time.time()
                elif event == "reset":
                    rec.resets += 1
                elif event == "status":
                    rec.attempts = int(data.get("attempts") or rec.attempts)
                elif event == "done":
                    done = data
                    break
        if done is None:
            rec.error = "the event stream ended without a done event"
            return
        usage = done.get("usage") or {}
        rec.output_tokens = int(usage.get("completion_tokens") or 0)
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        timings = done.get("timings_ms") or {}
        rec.engine = {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
        if done.get("status") != "succeeded":
            rec.error = f"{done.get('status')}: {done.get('error') or ''}"[:300]


async def _drive_documents(base_url: str, w: Workload, api_key: str,
                           timeout: float) -> tuple[list[JobRecord], list[dict[str, Any]], float]:
    """Upload the documents (before t=0), then the jobs in the arrival order: (records, uploads, upload_s)."""
    recs = _records(w)
    params = job_params(w)
    async with _client(base_url, api_key, timeout, w.jobs) as client:
        t = time.perf_counter()
        uploads = await _upload(client, w)
        upload_s = time.perf_counter() - t
        for rec in recs:
            rec.document_id = uploads[rec.doc]["document_id"]
        bodies = [{"document_id": rec.document_id, "question": question_text(rec.doc, rec.question), "params": params}
                  for rec in recs]
        t0 = time.perf_counter()
        await _arrive(recs, w.arrival, w.questions, t0, lambda rec: _follow_job(client, bodies[rec.index], rec, t0),
                      seed=w.seed)
    return recs, uploads, upload_s


async def _details(base_url: str, recs: list[JobRecord], api_key: str, timeout: float) -> None:
    """After the run: each specq job's view (GET /v1/jobs/{id}): queue wait, worker, times, spec."""
    sem = asyncio.Semaphore(8)

    async def one(client, rec: JobRecord) -> None:
        async with sem:
            for _ in range(10):
                try:
                    r = await client.get(f"/v1/jobs/{rec.job_id}")
                    if r.status_code != 200:
                        return
                    v = r.json()
                except Exception:
                    return
                trace = v.get("trace") or {}
                if v.get("kind") == "job" or trace.get("first_byte") or v.get("status") != "succeeded":
                    break
                await asyncio.sleep(0.1)  # the API writes a chat's stamps just after its answer was sent
        rec.queue_wait_ms = v.get("queue_wait_ms")
        rec.attempts = int(v.get("attempts") or rec.attempts)
        rec.worker = str(v.get("worker") or "")
        rec.started_at, rec.finished_at = str(v.get("started_at") or ""), str(v.get("finished_at") or "")
        rec.trace = {k: t for k, t in (v.get("trace") or {}).items() if isinstance(t, (int, float))}
        doc = (v.get("input") or {}).get("document_id")
        if doc and not rec.document_id:
            rec.document_id = str(doc)
        res = v.get("result") or {}
        spec = res.get("spec") or {}
        rec.spec = {k: spec[k] for k in ("mode", "reason", "windows", "cache") if k in spec}
        kept = (res.get("usage") or {}).get("kept_tokens")
        if kept is not None:
            rec.spec["kept_tokens"] = kept
        if isinstance(res.get("group"), dict):  # a member of a group-sparse prefill (engine/serving/groups.py)
            rec.spec["group"] = res["group"]

    async with _client(base_url, api_key, timeout, 8) as client:
        await asyncio.gather(*(one(client, r) for r in recs if r.job_id))


def first_model(base_url: str, api_key: str = "") -> str:
    """The first model GET /v1/models lists (specq: its target; llama-server: its file)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    data = r.json().get("data") or []
    return str(data[0]["id"]) if data else "default"


def gpu_memory_mib() -> list[int]:
    """Used memory of each GPU (nvidia-smi), [] without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return [int(x) for x in out.split()]
    except Exception:
        return []


def prefill_work_ms(engine: dict[str, float]) -> float | None:
    """A specq job's own prefill work in the run (engine time, ms): scoring + selection + the target's
    prefill. With slots, the `*_engine` times (this job's own units and batches, other jobs' work left
    out); with one slot, where nothing interleaves, the phases themselves. None without timings."""
    if "sparse_prefill_engine" in engine:
        return engine.get("score_engine", 0.0) + engine["sparse_prefill_engine"]
    if "sparse_prefill" in engine:
        return engine.get("score", 0.0) + engine.get("select", 0.0) + engine["sparse_prefill"]
    return None


def summarize(recs: list[JobRecord], w: Workload) -> dict[str, Any]:
    ok = [r for r in recs if not r.error and r.first_s is not None]
    makespan = max((r.end_s or 0.0) for r in recs) - min(r.sent_s for r in recs) if recs else 0.0
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    eng = [r.engine["ttft"] for r in ok if "ttft" in r.engine]
    per_job = [(r.output_tokens - 1) / (r.end_s - r.first_s) for r in ok
               if r.output_tokens > 1 and r.end_s and r.end_s > r.first_s]
    out_tokens = sum(r.output_tokens for r in ok)
    work = [x for x in (prefill_work_ms(r.engine) for r in ok) if x is not None]
    return {
        "jobs": len(recs), "succeeded": len(ok), "errors": [r.error for r in recs if r.error][:5],
        "makespan_s": round(makespan, 3),
        "jobs_per_min": round(len(ok) / makespan * 60.0, 3) if makespan > 0 else None,
        "client_ttft_ms_p50": percentile(ttft, 0.5), "client_ttft_ms_p95": percentile(ttft, 0.95),
        "engine_ttft_ms_p50": percentile(eng, 0.5), "engine_ttft_ms_p95": percentile(eng, 0.95),
        "decode_tok_s_per_job_p50": percentile(per_job, 0.5),
        "output_tok_s_total": round(out_tokens / makespan, 3) if makespan > 0 else None,
        "output_tokens": out_tokens,
        "slot_wait_ms_p50": percentile([r.engine["slot_wait"] for r in ok if "slot_wait" in r.engine], 0.5),
        "interleave_wait_ms_p50": percentile([r.engine["interleave_wait"] for r in ok if "interleave_wait" in r.engine], 0.5),
        "prefill_floor_ms_p50": percentile(work, 0.5),
        "jobs_per_min_prefill_floor": round(len(work) / sum(work) * 60000.0, 3) if work and sum(work) > 0 else None,
        "prompt_tokens_p50": percentile([float(r.prompt_tokens) for r in ok if r.prompt_tokens], 0.5),
        "mean_output_tokens": round(statistics.mean([r.output_tokens for r in ok]), 2) if ok else 0,
        "queue_wait_ms_p50": percentile([r.queue_wait_ms for r in ok if r.queue_wait_ms is not None], 0.5),
        "queue_wait_ms_p95": percentile([r.queue_wait_ms for r in ok if r.queue_wait_ms is not None], 0.95),
        **first_and_later(ok),
        **reuse(ok),
        "breakdown_ms": breakdown(ok),
        **first_token_parts(ok),
    }


#: the engine's parts of a job's time to first token (engine/serving/loop.py module doc, `ft_*`)
FIRST_TOKEN_PARTS = ("ft_tokenize", "ft_admit", "ft_pick", "ft_decide", "ft_setup", "ft_between", "ft_fill", "ft_sample")


def first_token_parts(recs: list[JobRecord]) -> dict[str, Any]:
    """p50 of each `ft_*` part over the jobs that report it (`first_token_ms`), and over the later
    questions of a document (`first_token_ms_later_questions`: its cached follow-ups); {} without any."""
    def p50s(rs: list[JobRecord]) -> dict[str, float | None]:
        return {k[3:]: percentile([r.engine[k] for r in rs if k in r.engine], 0.5)
                for k in FIRST_TOKEN_PARTS if any(k in r.engine for r in rs)}

    out: dict[str, Any] = {}
    if any("ft_fill" in r.engine for r in recs):
        out["first_token_ms"] = p50s(recs)
        later = [r for r in recs if r.question > 0]
        if later:
            out["first_token_ms_later_questions"] = p50s(later)
    return out


#: the breakdown's gaps, in the order a job passes them: (name, from, to); "sent" and "client_first_text"
#: are the client's clocks, the rest the server's (storage.trace; the same host's clock in a local run)
GAPS = (
    ("send_to_accept", "sent", "accepted"),
    ("accept_to_stored", "accepted", "stored"),
    ("stored_to_queued", "stored", "queued"),
    ("stored_to_claimed", "stored", "claimed"),
    ("claimed_to_engine_start", "claimed", "engine_start"),
    ("engine_start_to_first_token", "engine_start", "first_token"),
    ("first_token_to_first_text_sent", "first_token", "first_text"),
    ("first_text_sent_to_client", "first_text", "client_first_text"),
    ("first_token_to_engine_done", "first_token", "engine_done"),
    ("engine_done_to_done", "engine_done", "done"),
)


def breakdown(recs: list[JobRecord]) -> dict[str, dict[str, float | None]]:
    """Per gap of GAPS: p50 and p90 in ms over the jobs that have both stamps, and how many had them
    (a native job has no `accepted`/`queued`/`first_text`: the OpenAI routes stamp those)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, a, b in GAPS:
        ms = []
        for r in recs:
            t = {**r.trace, "sent": r.sent_unix or None, "client_first_text": r.first_unix}
            if t.get(a) is not None and t.get(b) is not None:
                ms.append((t[b] - t[a]) * 1000.0)
        if ms:
            out[name] = {"p50": percentile(ms, 0.5), "p90": percentile(ms, 0.9), "n": len(ms)}
    return out


def first_and_later(recs: list[JobRecord]) -> dict[str, Any]:
    """Client TTFT of each document's first question (question 0: nothing of the document cached yet)
    apart from its later ones (what the caches and group claims serve); {} with one question per document."""
    if not any(r.question > 0 for r in recs):
        return {}
    first = [r.ttft_ms for r in recs if r.question == 0 and r.ttft_ms is not None]
    later = [r.ttft_ms for r in recs if r.question > 0 and r.ttft_ms is not None]
    return {"client_ttft_ms_first_question_p50": percentile(first, 0.5), "client_ttft_ms_first_question_p95": percentile(first, 0.95),
            "client_ttft_ms_later_questions_p50": percentile(later, 0.5), "client_ttft_ms_later_questions_p95": percentile(later, 0.95)}


def reuse(recs: list[JobRecord]) -> dict[str, Any]:
    """What the specq results report of the caches and modes ({} without any `spec`): jobs per mode
    that ran and per rule that chose it, target prompt-cache hits and the tokens they reused (and their
    share of all prompt tokens), speculator windows reused (restored, or still resident in their stream) and prefilled.

    The rule is mode auto's decision, taken before the job waits for another job prefilling the same
    document (serving.py `_prefix_owner`): a question that arrived with its document's first one can
    say "stored document" and still restore the document once that one saved it. The reused tokens
    (`target_cache_hits_half`, `target_reused_fraction`) say what was really reused."""
    specs = [r.spec for r in recs if r.spec]
    if not specs:
        return {}
    modes: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for sp in specs:
        modes[str(sp.get("mode"))] = modes.get(str(sp.get("mode")), 0) + 1
        # the rule, without its numbers: "auto: prompt cache hit", "auto: stored document", "asked for"
        rule = re.sub(r"\d+", "N", ":".join(str(sp.get("reason") or "").split(":")[:2]).strip())
        reasons[rule] = reasons.get(rule, 0) + 1

    def cache(sp: dict, which: str) -> dict:
        c = (sp.get("cache") or {}).get(which)
        return c if isinstance(c, dict) else {}

    reused = sum(int(cache(sp, "target").get("reused_tokens") or 0) for sp in specs)
    prompt = sum(r.prompt_tokens for r in recs if r.spec)
    return {
        "modes": modes, "reasons": reasons,
        # `hit` is any cached prefix of at least 16 tokens (the chat template's alone is one): the
        # reused fraction of all prompt tokens says how much of the documents was not prefilled again
        "target_cache_hits": sum(bool(cache(sp, "target").get("hit")) for sp in specs),
        # hits that restored at least half the job's prompt: a document's KV reused, not a template's
        "target_cache_hits_half": sum(int(cache(r.spec, "target").get("reused_tokens") or 0) * 2 >= r.prompt_tokens > 0
                                      for r in recs if r.spec),
        # hits served by the prefix still in the job's own slot (no restore from host memory)
        "target_slot_hits": sum(bool(cache(sp, "target").get("from_slot")) for sp in specs),
        "target_slot_copies": sum(bool(cache(sp, "target").get("from_other_slot")) for sp in specs),
        "target_reused_tokens": reused,
        "target_reused_fraction": round(reused / prompt, 4) if prompt else None,
        "speculator_window_hits": sum(int(cache(sp, "speculator").get("hits") or 0) for sp in specs),
        "speculator_window_misses": sum(int(cache(sp, "speculator").get("misses") or 0) for sp in specs),
        # of the hits, windows still in the scorer's streams from the question before (nothing restored)
        "speculator_window_resident": sum(int(cache(sp, "speculator").get("resident") or 0) for sp in specs),
        **_groups([sp["group"] for sp in specs if isinstance(sp.get("group"), dict)]),
    }


def _groups(groups: list[dict]) -> dict[str, Any]:
    """Group-sparse prefill (engine/serving/groups.py): jobs served as group members, how many copied
    head + union from another slot, group size and the union's and a member's own kept fractions
    (p50), and the target tokens the members prefilled themselves (summed)."""
    if not groups:
        return {"group_members": 0}
    return {
        "group_members": len(groups),
        "group_union_copies": sum(str(g.get("union_from", "")).startswith("slot") for g in groups),
        "group_size_p50": percentile([float(g.get("size") or 0) for g in groups], 0.5),
        "group_union_fraction_p50": percentile([float(g.get("union_kept_fraction") or 0) for g in groups], 0.5),
        "group_own_fraction_p50": percentile([float(g.get("own_kept_fraction") or 0) for g in groups], 0.5),
        "group_prefilled_tokens": sum(int(g.get("prefilled_tokens") or 0) for g in groups),
    }


def run_serve_bench(base_url: str, w: Workload, *, kind: str = "specq", model: str = "", api_key: str = "",
                    timeout: float = 3600.0, label: str = "") -> dict[str, Any]:
    """Run the workload against `base_url`; the JSON-ready report (workload, path, summary, per-job rows;
    the documents path adds `documents`: each stored document's id and upload time)."""
    if kind not in ("specq", "llama-server"):
        raise ValueError("kind must be specq or llama-server")
    if w.documents and kind != "specq":
        raise ValueError("the documents path is specq's (POST /v1/documents, /v1/jobs)")
    mixed = bool(w.lengths_mix or w.max_tokens_mix)
    if mixed and (w.documents or w.questions != 1):
        raise ValueError("the mixed workload is the chat path's with one question per document")
    edges = workloads.parse_bands(w.length_bands) if mixed else []
    from .provenance import Start, provenance

    start = Start()
    base_url = base_url.rstrip("/")
    model = model or first_model(base_url, api_key)
    mem0 = gpu_memory_mib()
    uploads: list[dict[str, Any]] = []
    upload_s = 0.0
    if w.documents:
        recs, uploads, upload_s = asyncio.run(_drive_documents(base_url, w, api_key, timeout))
    else:
        recs = asyncio.run(_drive(base_url, build_requests(w, kind, model), w, api_key, timeout))
    mem1 = gpu_memory_mib()
    if kind == "specq":  # after the makespan: the stored views (queue wait, spec, cache hits)
        asyncio.run(_details(base_url, recs, api_key, min(timeout, 60.0)))
    summary = summarize(recs, w)
    path = "documents" if w.documents else "chat"
    summary["path"] = path
    if w.documents:
        summary["upload_s"] = round(upload_s, 3)
        span = summary["makespan_s"] + upload_s
        summary["jobs_per_min_with_upload"] = round(summary["succeeded"] / span * 60.0, 3) if span > 0 else None
    report = {
        "label": label or kind, "kind": kind, "path": path, "url": base_url, "model": model, "workload": asdict(w),
        "summary": summary, "gpu_memory_mib_before": mem0, "gpu_memory_mib_after": mem1,
        "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        # the client's code, host, command and llama-cpp-python (the service's own numerics are not
        # visible from here: bench/gpu/serve.sh states them, and specq's per-job `engine` rows carry timings)
        "provenance": provenance(None, start=start, measured_from="client"),
        "jobs": [{**asdict(r), "ttft_ms": r.ttft_ms} for r in recs],
    }
    if w.documents:
        report["documents"] = uploads
    if mixed:  # each row's planned lengths and offset (the same for both servers), the per-band summary
        for row, job in zip(report["jobs"], job_plan(w)):
            row.update(planned_doc_tokens=job.doc_tokens, planned_max_tokens=job.max_tokens,
                       planned_offset_s=job.offset_s)
        summary["mixed"] = workloads.mixed_summary(report["jobs"], edges)
    return report


def plot(reports: list[dict[str, Any]], path: str) -> None:
    """Per job: client TTFT and end time against send time, one colour per report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for rep in reports:
        rows = [j for j in rep["jobs"] if j["ttft_ms"] is not None]
        s = rep["summary"]
        name = f"{rep['label']} ({s['jobs_per_min']} jobs/min)"
        a.plot(sorted(j["ttft_ms"] for j in rows), marker=".", label=name)
        b.plot(sorted(j["end_s"] for j in rows), range(1, len(rows) + 1), marker=".", label=name)
    a.set_xlabel("job (sorted)")
    a.set_ylabel("client TTFT, ms")
    b.set_xlabel("seconds since the first request")
    b.set_ylabel("jobs done")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


__all__ = ["Workload", "JobRecord", "build_requests", "job_params", "make_document", "question_text", "run_serve_bench",
           "summarize", "reuse", "plot"]
