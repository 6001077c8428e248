"""The fault and load tests' own figures: each test counts what happened to its jobs and records it here.

`record(name, ...)` merges one test's figures into `docs/reliability-figures.json` (the record) and
re-renders the figures table of `docs/reliability.md` (between its `<!-- figures -->` markers), so
the committed numbers are the ones the last run measured. `SPECQ_RELIABILITY_FIGURES` moves the JSON
elsewhere (the table is then written into a reliability.md next to it, if that has the markers).

The counts, per test (the same definitions everywhere):

* submitted — jobs the API accepted (202);
* completed — jobs `succeeded` with exactly one result row;
* failed — jobs `failed` (with their message; only the max-attempts test expects any);
* duplicated — jobs with more than one result row, or run to the end more than once (a worker log
  line "finished but not saved" for them);
* lost — submitted jobs that are neither completed, failed nor cancelled at the end.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES_JSON = Path(os.environ.get("SPECQ_RELIABILITY_FIGURES") or REPO / "docs" / "reliability-figures.json")

#: order and titles of the tables' rows
TITLES = {
    "kill_worker_scoring": "SIGKILL the worker during scoring, start another",
    "kill_worker_decode": "SIGKILL the worker during decode, start another",
    "kill_worker_max_attempts": "SIGKILL the worker on every attempt (max_attempts 2)",
    "kill_worker_embedded": "SIGKILL the worker during decode, embedded broker (SQLite)",
    "redis_restart": "SIGKILL + restart Redis mid-batch, then restart the API",
    "postgres_restart": "Crash-restart PostgreSQL while results are written",
    "load_1000": "1,000 small jobs submitted concurrently over REST",
}
COUNTS = ("submitted", "completed", "failed", "duplicated", "lost")
#: the markers around the table in docs/reliability.md
BEGIN, END = "<!-- figures: written by tests/reliability_figures.py -->", "<!-- /figures -->"


def tally(session, job_ids: list[str], worker_logs: str = "") -> dict[str, int]:
    """The counts above for `job_ids`, read from the job store (`session`) and the workers' logs."""
    from sqlalchemy import func, select

    from specq.storage.models import Job, Result

    status = dict(session.execute(select(Job.id, Job.status).where(Job.id.in_(job_ids))).all())
    rows = dict(session.execute(select(Result.job_id, func.count()).where(Result.job_id.in_(job_ids))
                                .group_by(Result.job_id)).all())
    session.commit()
    rerun = set(re.findall(r"job (job_[0-9a-f]+): finished but not saved", worker_logs))
    ids = set(job_ids)
    completed = sum(1 for j in ids if status.get(j) == "succeeded" and rows.get(j) == 1)
    failed = sum(1 for j in ids if status.get(j) == "failed")
    cancelled = sum(1 for j in ids if status.get(j) == "cancelled")
    duplicated = len({j for j in ids if rows.get(j, 0) > 1} | (rerun & ids))
    return {"submitted": len(ids), "completed": completed, "failed": failed, "duplicated": duplicated,
            "lost": len(ids) - completed - failed - cancelled}


def record(name: str, counts: dict[str, int], **figures) -> None:
    """Merge test `name`'s counts and other figures (seconds, ms, MiB, …) into the record."""
    FIGURES_JSON.parent.mkdir(parents=True, exist_ok=True)
    lock = Path(tempfile.gettempdir()) / "specq-reliability-figures.lock"
    with open(lock, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        data = json.loads(FIGURES_JSON.read_text()) if FIGURES_JSON.exists() else {}
        data[name] = {
            **{k: counts[k] for k in COUNTS},
            "figures": figures,
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": _machine(),
        }
        FIGURES_JSON.write_text(json.dumps(dict(sorted(data.items(), key=_order)), indent=2) + "\n")
        doc = FIGURES_JSON.parent / "reliability.md"
        if doc.exists():
            text = doc.read_text()
            if BEGIN in text and END in text:
                head, rest = text.split(BEGIN, 1)
                doc.write_text(head + BEGIN + "\n" + render(data) + END + rest.split(END, 1)[1])


def _order(item) -> int:
    names = list(TITLES)
    return names.index(item[0]) if item[0] in names else len(names)


def _machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.machine()}, {os.cpu_count()} cores, load average {load}"


def render(data: dict) -> str:
    out = ["| test | submitted | completed | failed | duplicated | lost | figures | measured |",
           "|---|---|---|---|---|---|---|---|"]
    for name, row in sorted(data.items(), key=_order):
        figs = "; ".join(f"{k} {_fmt(v)}" for k, v in row["figures"].items())
        out.append(f"| {TITLES.get(name, name)} (`{name}`) | " + " | ".join(str(row[k]) for k in COUNTS)
                   + f" | {figs} | {row['measured']} ({row['machine']}) |")
    return "\n".join(out) + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)
