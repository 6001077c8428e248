"""Stored rows as API responses (the shapes of `specq.api.schemas`).

The storage layer's `to_dict()` already reads stored JSON defensively (`storage.sanitize`); here a
job becomes either its list row (`job_summary`: no document, system message or result and only the
start of the question, so a page of 500 jobs stays small whatever they hold) or its full view (`job_view`).
"""

from __future__ import annotations

from typing import Any

from ..storage import jobs, results
from ..storage.sanitize import safe_dict
from ..storage.trace import job_trace

#: params keys left out of list rows: prompt texts of up to 64 KiB each (GET /v1/jobs/{id} has them)
LIST_OMITS = ("question", "system")


def ran(spec: Any) -> dict[str, Any] | None:
    """A result's `spec` as the job's `ran` (schemas.Ran), or None without one."""
    if not isinstance(spec, dict) or not spec.get("mode"):
        return None
    target = (spec.get("cache") or {}).get("target")
    hit = isinstance(target, dict) and bool(target.get("hit"))
    reason = spec.get("reason")
    return {"mode": str(spec["mode"]), "reason": None if reason is None else str(reason), "cache_hit": hit}


#: a list row's labels when its input row is gone (storage.jobs.list_labels)
NO_LABELS = {"filename": None, "question": "", "batch_name": None}


def job_summary(job, spec: Any = None, labels: dict[str, Any] | None = None) -> dict[str, Any]:
    """A list row; `spec`: its result's spec (storage.results.ran_specs), for `ran`; `labels`: its file
    name, question preview and batch name (storage.jobs.list_labels)."""
    d = job.to_dict()
    d["params"] = {k: v for k, v in d["params"].items() if k not in LIST_OMITS}
    d["ran"] = ran(spec)
    d.update(labels or NO_LABELS)
    return d


def batch_summary(batch) -> dict[str, Any]:
    """A batch as lists show it: its default params without the system message."""
    d = batch.to_dict()
    d["params"] = {k: v for k, v in d["params"].items() if k not in LIST_OMITS}
    return d


def job_view(s, job) -> dict[str, Any]:
    """The job with its input (file name, size, question) and, once it succeeded, its result."""
    d = job.to_dict()
    d.pop("question", None)
    result = results.get_result(s, job.id) if job.status == "succeeded" else None
    d["result"] = safe_dict(result) if result is not None else None
    d["ran"] = ran((d["result"] or {}).get("spec"))
    d["trace"] = job_trace(job, d["result"])
    inp = jobs.get_input(s, job.id)
    d.update(jobs.list_labels(s, [job.id]).get(job.id) or NO_LABELS)
    d["input"] = None if inp is None else {"filename": inp.filename, "size_bytes": inp.size_bytes,
                                           "document_id": inp.document_id,
                                           "question": inp.question or ""}
    return d


__all__ = ["job_summary", "job_view", "batch_summary", "ran", "LIST_OMITS"]
