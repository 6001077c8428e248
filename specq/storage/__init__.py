"""The job store: SQLAlchemy 2 models (models.py), connection and migrations (db.py), and one
module of functions per concept (jobs.py, results.py, batches.py, stats.py).

Every function takes a Session first and is its own transaction:

    from specq.storage import db, jobs, results
    db.upgrade()                       # Alembic to head (SPECQ_DATABASE_URL or $SPECQ_HOME/specq.sqlite)
    with db.session() as s:
        job = jobs.create_job(s, text=doc, params=run_params, filename="a.txt")
        if jobs.mark_running(s, job.id, worker="host:123"):
            ...
            results.save_result(s, job.id, run_result)
"""

from . import batches, db, jobs, metrics, results, stats
from .batches import create_batch, get_batch, list_batches, refresh_request_counts, set_batch_status
from .errors import InputTooLarge, StorageError
from .jobs import (
    count_jobs,
    create_job,
    get_input,
    get_job,
    heartbeat,
    is_cancel_requested,
    list_jobs,
    mark_cancelled,
    mark_failed,
    mark_running,
    request_cancel,
    requeue,
    update_progress,
)
from .models import Batch, Job, JobInput, PhaseTiming, Result
from .results import get_result, get_timings, save_result
from .stats import phase_stats

__all__ = [
    "db",
    "jobs",
    "results",
    "batches",
    "stats",
    "Batch",
    "Job",
    "JobInput",
    "PhaseTiming",
    "Result",
    "InputTooLarge",
    "StorageError",
    "create_job",
    "get_job",
    "get_input",
    "list_jobs",
    "count_jobs",
    "mark_running",
    "update_progress",
    "heartbeat",
    "request_cancel",
    "is_cancel_requested",
    "mark_cancelled",
    "mark_failed",
    "requeue",
    "save_result",
    "get_result",
    "get_timings",
    "phase_stats",
    "create_batch",
    "get_batch",
    "list_batches",
    "set_batch_status",
    "refresh_request_counts",
]
