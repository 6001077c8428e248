"""`specq bench serve`: a workload of chat jobs against a running service, through its OpenAI
`/v1/chat/completions` with `stream: true`; the same client code for specq and for llama-server.

Workload: `docs` distinct documents of about `doc_tokens` tokens (`chars_per_token` characters per
token), `questions` questions per document (jobs = docs x questions), `max_tokens` output tokens with
`ignore_eos` (specq: `specq.ignore_eos`; llama-server: its own `ignore_eos`), sent all at t=0 or at a
fixed `rate` (jobs per second), specq's `mode` / `keep` in `specq` (llama-server gets none).

Per job: client TTFT (request sent -> first streamed content), end time, output tokens (the last
chunk's usage, else the content chunks counted) and, from specq's last chunk, its engine-side
timings (`ttft` from the worker's submission to the engine loop, `slot_wait`, `interleave_wait`).
Summary: jobs/min over the makespan (first request sent -> last job done), TTFT p50/p95, decode
tokens/s per job (output tokens after the first / time after the first) and in all.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

WORDS = ("request handler buffer stream token window cache index record value field query answer "
         "document server client model layer vector matrix kernel thread queue worker result").split()


@dataclass
class Workload:
    docs: int = 8
    doc_tokens: int = 1000
    questions: int = 1
    max_tokens: int = 64
    #: "t0" = every job at t=0; else jobs per second (fixed spacing)
    arrival: str = "t0"
    mode: str = "baseline"
    keep: float = 0.3
    chars_per_token: float = 4.0
    seed: int = 0

    @property
    def jobs(self) -> int:
        return self.docs * self.questions


@dataclass
class JobRecord:
    index: int
    sent_s: float = 0.0
    first_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    chunks: int = 0
    error: str = ""
    engine: dict[str, float] = field(default_factory=dict)

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


def build_requests(w: Workload, kind: str, model: str) -> list[dict[str, Any]]:
    """The request bodies, job j = document j // questions, question j % questions."""
    out = []
    for j in range(w.jobs):
        d, q = divmod(j, w.questions)
        doc = make_document(d, w.doc_tokens, w.chars_per_token, w.seed)
        question = f"Question {q}: which function of document {d} returns the largest default value?"
        body: dict[str, Any] = {
            "model": model, "stream": True, "max_tokens": w.max_tokens, "temperature": 0.0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{doc}\n\n{question}"}],
        }
        if kind == "specq":
            body["specq"] = {"ignore_eos": True, "mode": w.mode, "keep": w.keep}
        else:  # llama-server's own field
            body["ignore_eos"] = True
        out.append(body)
    return out


async def _one(client, url: str, body: dict, rec: JobRecord, t0: float) -> None:
    rec.sent_s = time.perf_counter() - t0
    try:
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
                            rec.first_s = time.perf_counter() - t0
                usage = chunk.get("usage")
                if usage:
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                spec = chunk.get("specq") or {}
                timings = spec.get("timings_ms") or {}
                if timings:
                    rec.engine = {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
    except Exception as e:  # a transport error: recorded, the run goes on
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end_s = time.perf_counter() - t0
        if not rec.output_tokens:
            rec.output_tokens = rec.chunks


async def _drive(base_url: str, bodies: list[dict], arrival: str, api_key: str, timeout: float) -> list[JobRecord]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    recs = [JobRecord(i) for i in range(len(bodies))]
    gap = 0.0 if arrival == "t0" else 1.0 / float(arrival)
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for i, body in enumerate(bodies):
            if gap:
                await asyncio.sleep(max(0.0, t0 + i * gap - time.perf_counter()))
            tasks.append(asyncio.create_task(_one(client, "/v1/chat/completions", body, recs[i], t0)))
        await asyncio.gather(*tasks)
    return recs


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 3)


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


def summarize(recs: list[JobRecord], w: Workload) -> dict[str, Any]:
    ok = [r for r in recs if not r.error and r.first_s is not None]
    makespan = max((r.end_s or 0.0) for r in recs) - min(r.sent_s for r in recs) if recs else 0.0
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    eng = [r.engine["ttft"] for r in ok if "ttft" in r.engine]
    per_job = [(r.output_tokens - 1) / (r.end_s - r.first_s) for r in ok
               if r.output_tokens > 1 and r.end_s and r.end_s > r.first_s]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "jobs": len(recs), "succeeded": len(ok), "errors": [r.error for r in recs if r.error][:5],
        "makespan_s": round(makespan, 3),
        "jobs_per_min": round(len(ok) / makespan * 60.0, 3) if makespan > 0 else None,
        "client_ttft_ms_p50": _pct(ttft, 0.5), "client_ttft_ms_p95": _pct(ttft, 0.95),
        "engine_ttft_ms_p50": _pct(eng, 0.5), "engine_ttft_ms_p95": _pct(eng, 0.95),
        "decode_tok_s_per_job_p50": _pct(per_job, 0.5),
        "output_tok_s_total": round(out_tokens / makespan, 3) if makespan > 0 else None,
        "output_tokens": out_tokens,
        "slot_wait_ms_p50": _pct([r.engine["slot_wait"] for r in ok if "slot_wait" in r.engine], 0.5),
        "interleave_wait_ms_p50": _pct([r.engine["interleave_wait"] for r in ok if "interleave_wait" in r.engine], 0.5),
        "prompt_tokens_p50": _pct([float(r.prompt_tokens) for r in ok if r.prompt_tokens], 0.5),
        "mean_output_tokens": round(statistics.mean([r.output_tokens for r in ok]), 2) if ok else 0,
    }


def run_serve_bench(base_url: str, w: Workload, *, kind: str = "specq", model: str = "", api_key: str = "",
                    timeout: float = 3600.0, label: str = "") -> dict[str, Any]:
    """Run the workload against `base_url`; the JSON-ready report (workload, summary, per-job rows)."""
    if kind not in ("specq", "llama-server"):
        raise ValueError("kind must be specq or llama-server")
    from .provenance import Start, provenance

    start = Start()
    model = model or first_model(base_url, api_key)
    bodies = build_requests(w, kind, model)
    mem0 = gpu_memory_mib()
    recs = asyncio.run(_drive(base_url.rstrip("/"), bodies, w.arrival, api_key, timeout))
    return {
        "label": label or kind, "kind": kind, "url": base_url, "model": model, "workload": asdict(w),
        "summary": summarize(recs, w), "gpu_memory_mib_before": mem0, "gpu_memory_mib_after": gpu_memory_mib(),
        "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        # the client's code, host, command and llama-cpp-python (the service's own numerics are not
        # visible from here: bench/gpu/serve.sh states them, and specq's per-job `engine` rows carry timings)
        "provenance": provenance(None, start=start, measured_from="client"),
        "jobs": [{**asdict(r), "ttft_ms": r.ttft_ms} for r in recs],
    }


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


__all__ = ["Workload", "JobRecord", "build_requests", "make_document", "run_serve_bench", "summarize", "plot"]
