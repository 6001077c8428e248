"""Group claims (#17 item 4): a worker that claimed a job asking about a stored document also claims
the queued jobs of the same tenant and `document_id`, up to its free slots, so their questions share
the document's work in its one engine loop (the first prefills the document, the others restore it
from the target's prompt cache: engine/serving/loop.py `_prefix_owner`).

Each job of the group is claimed by `jobs.mark_running`'s conditional UPDATE (`status = 'queued'`),
so two workers grouping at once get disjoint groups and no job runs twice; each claim is an attempt of
its own with its own token (`claims.Claim`), fenced like any other (storage.jobs, "Fencing"). Only the
same tenant's jobs on the same document: equal texts of two tenants are two documents
(storage.documents).

**In the worker** (worker/runtime.py, `SPECQ_GROUP_CLAIMS`, on by default; only with serving slots,
SPECQ_SLOTS > 1): right after a task thread claims a job, under the process's claim lock, it claims
its group up to the slots left free (slots minus the jobs live in the process, that job included) and
runs each member in a thread of its own, exactly as a delivered job: its own watcher (heartbeat,
progress, cancel), its own attempt token, its own result or failure write. A member's own broker
message then finds it claimed: at this worker while the member is live it is acknowledged and does
nothing; elsewhere, or once the member ended, the message is a ticket like any other (`claims.
claim_next`: the job runs only as a stale redelivery; else the queue's next job in claim order, or
nothing), and `claims.reclaim_own` never claims a job live in this process. A member whose attempt
goes back to the queue (a transient error, the drain) is re-sent to the broker by its thread, with
the backoff as countdown. A worker killed with a group in flight leaves every member `running` with
a stale heartbeat: the reconciler requeues each (docs/reliability.md).
"""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from . import jobs as _jobs
from .calibrations import KIND as CALIBRATION
from .claims import Claim
from .models import Job, JobInput, utcnow


#: kinds never claimed as a group: a calibration unit runs on the engine alone (worker/calibration.py)
UNGROUPED = (CALIBRATION,)


def group_candidates(session: Session, job_id: str, *, queue: str | None, limit: int) -> list[str]:
    """Up to `limit` queued, ready jobs (oldest first) of `job_id`'s tenant asking about its document;
    [] when the job has no document_id. Calibration units are neither leaders nor members (`UNGROUPED`)."""
    if limit <= 0:
        return []
    row = session.execute(select(Job.tenant, Job.kind, JobInput.document_id).join(JobInput, JobInput.job_id == Job.id)
                          .where(Job.id == job_id)).one_or_none()
    if row is None or row.document_id is None or row.kind in UNGROUPED:
        session.commit()
        return []
    now = utcnow()
    q = (select(Job.id).join(JobInput, JobInput.job_id == Job.id)
         .where(and_(Job.status == "queued", Job.tenant == row.tenant, JobInput.document_id == row.document_id,
                     Job.id != job_id, Job.kind.not_in(UNGROUPED), or_(Job.not_before.is_(None), Job.not_before <= now)))
         .order_by(Job.priority, Job.created_at, Job.id).limit(limit))
    if queue is not None:
        q = q.where(or_(Job.queue == queue, Job.queue.is_(None)))
    ids = list(session.scalars(q))
    session.commit()
    return ids


def claim_group(session: Session, job_id: str, worker: str, *, queue: str | None, limit: int,
                into: list[Claim] | None = None) -> list[Claim]:
    """Claim (mark running for `worker`) up to `limit` more jobs of `job_id`'s group: a Claim (id and
    attempt token) for each, oldest first. A job another worker claimed first is skipped, so concurrent
    groups are disjoint. `into`: the list the claims are appended to as they are made (returned), so a
    caller still knows the jobs claimed before a store error raised."""
    claimed: list[Claim] = [] if into is None else into
    first = len(claimed)
    while len(claimed) - first < limit:
        cands = group_candidates(session, job_id, queue=queue, limit=limit - (len(claimed) - first))
        if not cands:
            break
        for cand in cands:  # a lost one is no longer queued: the next round picks others
            token = _jobs.mark_running(session, cand, worker, stale_after_s=None)
            if token:
                claimed.append(Claim(cand, token))
    return claimed[first:] if first else claimed


__all__ = ["group_candidates", "claim_group"]
