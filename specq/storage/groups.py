"""Group claims (#17 item 4, storage half): a worker that claimed a job asking about a stored
document also claims the queued jobs of the same tenant and `document_id`, up to its free slots, so
their questions can share the document's work (one engine's caches, or one group-sparse prefill).

Each job of the group is claimed by `jobs.mark_running`'s conditional UPDATE (`status = 'queued'`), so
two workers grouping at once get disjoint groups and no job runs twice. Only the same tenant's jobs
on the same document: equal texts of two tenants are two documents (storage.documents).

Not wired into the worker yet: a group-claimed job's own broker message later reaches some worker,
and `claims.claim_next` must then see it as running elsewhere. Today's `claims.reclaim_own` would
start a second attempt when that message reaches the very worker running it (it assumes one job per
worker process); the attempt tokens of the robustness issue (fence, migration 0005) and the serving
loop's slots are what make it safe, so the lead hooks this in after those merges.
"""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from . import jobs as _jobs
from .models import Job, JobInput, utcnow


def group_candidates(session: Session, job_id: str, *, queue: str | None, limit: int) -> list[str]:
    """Up to `limit` queued, ready jobs (oldest first) of `job_id`'s tenant asking about its document;
    [] when the job has no document_id."""
    if limit <= 0:
        return []
    row = session.execute(select(Job.tenant, JobInput.document_id).join(JobInput, JobInput.job_id == Job.id)
                          .where(Job.id == job_id)).one_or_none()
    if row is None or row.document_id is None:
        session.commit()
        return []
    now = utcnow()
    q = (select(Job.id).join(JobInput, JobInput.job_id == Job.id)
         .where(and_(Job.status == "queued", Job.tenant == row.tenant, JobInput.document_id == row.document_id,
                     Job.id != job_id, or_(Job.not_before.is_(None), Job.not_before <= now)))
         .order_by(Job.priority, Job.created_at, Job.id).limit(limit))
    if queue is not None:
        q = q.where(or_(Job.queue == queue, Job.queue.is_(None)))
    ids = list(session.scalars(q))
    session.commit()
    return ids


def claim_group(session: Session, job_id: str, worker: str, *, queue: str | None, limit: int) -> list[str]:
    """Claim (mark running for `worker`) up to `limit` more jobs of `job_id`'s group; their ids. A job
    another worker claimed first is skipped, so concurrent groups are disjoint."""
    claimed: list[str] = []
    while len(claimed) < limit:
        cands = group_candidates(session, job_id, queue=queue, limit=limit - len(claimed))
        if not cands:
            break
        for cand in cands:  # a lost one is no longer queued: the next round picks others
            if _jobs.mark_running(session, cand, worker, stale_after_s=None):
                claimed.append(cand)
    return claimed


__all__ = ["group_candidates", "claim_group"]
