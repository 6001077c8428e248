"""`specq bench calibrate-service`: questions per minute of a calibration run by the service's own workers
(POST /v1/calibrations, issue 48 "Measure"; the path `specq calibrate --service` takes).

The questions are `text` lines (never paths): `docs` documents of about `doc_tokens` tokens made as
`specq bench serve` makes its documents (bench/serve.make_document, another seed than its jobs), `questions`
questions each (bench/serve.question_text). The calibration is posted, followed on GET /v1/calibrations/{id}
until it ends, and then each unit (a job of kind `calibration`) is read from GET /v1/jobs/{id}.

Measured: `wall_s`, from just before the POST to the last unit's `finished_at` (the same host's clock for
client and service), and `questions_per_min` = units done / wall_s; per unit, the worker's time on it
(`started_at` -> `finished_at`) and the engine's (`timings_ms.total`: the three passes), p50 and p90. Every
unit is baseline, specprefill and two teacher-forced passes, so a question costs about three jobs.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from .serve import make_document, question_text
from .stats import percentile

#: documents' seed offset: never one of `specq bench serve`'s documents (which use the run's seed)
SEED_OFFSET = 7919


def lines(docs: int, questions: int, doc_tokens: int, chars_per_token: float, seed: int = 0) -> list[dict[str, str]]:
    """POST /v1/calibrations lines: `docs` documents x `questions` questions, the text inline."""
    out = []
    for d in range(docs):
        text = make_document(d, doc_tokens, chars_per_token, seed=seed + SEED_OFFSET)
        out += [{"text": text, "question": question_text(d, q)} for q in range(questions)]
    return out


def _epoch(iso: str | None) -> float | None:
    return None if not iso else datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def run(base_url: str, body: dict[str, Any], *, api_key: str = "", timeout: float = 3600.0,
        poll_s: float = 1.0) -> dict[str, Any]:
    """Post the calibration `body`, wait for its end; the measured part of the report (module doc)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=60.0) as c:
        sent = time.time()
        r = c.post("/v1/calibrations", json=body)
        r.raise_for_status()
        cal = r.json()
        deadline = time.monotonic() + timeout
        while cal["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(poll_s)
            cal = c.get(f"/v1/calibrations/{cal['id']}").json()
        seen = time.time()
        units = []
        offset = 0
        while True:  # the units: this throwaway service's jobs of kind calibration
            page = c.get("/v1/jobs", params={"limit": 200, "offset": offset}).json()
            units += [j for j in page["data"] if j.get("kind") == "calibration"]
            offset += len(page["data"])
            if not page["data"] or offset >= page["total"]:
                break
        engine_s = []
        for u in units:
            if u["status"] == "succeeded":
                res = (c.get(f"/v1/jobs/{u['id']}").json().get("result") or {})
                ms = (res.get("timings_ms") or {}).get("total")
                if ms is not None:
                    engine_s.append(ms / 1000.0)
    done = [u for u in units if u["status"] == "succeeded"]
    worker_s = [e - s for s, e in ((_epoch(u["started_at"]), _epoch(u["finished_at"])) for u in done) if s and e]
    last = max((_epoch(u["finished_at"]) or 0.0 for u in done), default=0.0)
    wall = last - sent if done else seen - sent
    rows = cal.get("rows") or []
    return {
        "calibration_id": cal["id"], "status": cal["status"], "error": cal.get("error"), "progress": cal["progress"],
        "units": len(units), "units_done": len(done), "wall_s": round(wall, 3),
        "questions_per_min": round(len(done) / wall * 60.0, 3) if done and wall > 0 else None,
        "unit_s_p50": percentile(worker_s, 0.5), "unit_s_p90": percentile(worker_s, 0.9),
        "unit_engine_s_p50": percentile(engine_s, 0.5), "unit_engine_s_p90": percentile(engine_s, 0.9),
        "rows_written": len(rows),
        "rows": [{k: r.get(k) for k in ("id", "metric", "arm", "length", "n", "passes", "fails")} for r in rows],
    }


__all__ = ["lines", "run", "SEED_OFFSET"]
