"""Calibrations through the service (issue 48 item 3; migration 0011): POST /v1/calibrations stores one here,
with one unit per question and keep, each unit a job of kind `calibration` at the lowest claim priority
(contracts.PRIORITY_CALIBRATION), so the deployment's own workers run them only when no other job of the queue
is ready, and a worker that dies mid-unit leaves a job the reconciler requeues like any other.

The life of a calibration:

1. `create`: the calibration, its units and their jobs in one transaction (a line naming a document its tenant
   does not have, or too large, stores nothing: `LineRefused` names the line).
2. `plan`, by the first worker that claims one of its units, under the calibration row's lock: every document's
   tokens counted (the worker's tokenizer: the API loads no model), each unit put under its length (the
   smallest length edge at or above them), units beyond `n` questions of their (length, keep) in line order
   marked `skipped` (their jobs cancelled). A document longer than every edge fails the calibration (`error`
   names the line) and cancels its queued units: nothing is written.
3. A unit's outcome (`record`) is stored in the transaction that marks its job succeeded (`store_record`,
   results.save_result's `also`).
4. `write_groups`, after every unit and on every read of the calibration through the API: under the row's lock,
   each (length, keep) whose every unit has its record and whose rows are not yet written gets its rows
   (`rows_of`: engine/policy/calibration_rows.validated_rows, passed in; storage imports no engine) stored in
   that same transaction, with the group marked in `written`: each group's rows are written exactly once, all
   or none.

Status (`summary`) is derived: cancelled (a cancel was requested), failed (`error`, or a unit's job failed),
succeeded (planned, every unit done and every group written), running (a unit started) or queued.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from ..contracts import PRIORITY_CALIBRATION
from . import evidence
from .db import write_transaction
from .jobs import lock_documents, new_job_id, request_cancel as cancel_job
from .models import Calibration, CalibrationUnit, Document, Job, JobInput, utcnow

KIND = "calibration"


class LineRefused(ValueError):
    """A line that cannot be stored (an unknown document, too large); the message names the line. `status`:
    the HTTP status the API answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def new_calibration_id() -> str:
    return "cal_" + secrets.token_hex(12)


def create(session: Session, *, tenant: str, settings: dict[str, Any], lines: list[dict[str, Any]],
           params: dict[str, Any], queue: str | None, max_attempts: int, limit_bytes: int) -> tuple[Calibration, list[str]]:
    """Store a calibration: one unit (and job) per line and keep in `settings["keep"]`. `lines`: checked lines
    (engine/calibration_lines.parse_line) with their 1-based `line`; `params`: the units' RunParams fields other than
    keep. Returns the calibration and its jobs' ids, to be sent to the broker. LineRefused stores nothing."""
    try:
        wanted = {ln["document_id"] for ln in lines if ln.get("document_id")}
        sizes = lock_documents(session, wanted, tenant)  # opens the write transaction
        write_transaction(session)
        for ln in lines:
            if ln.get("document_id"):
                if ln["document_id"] not in sizes:
                    raise LineRefused(f"line {ln['line']}: no stored document {ln['document_id']!r} (documents are "
                                      "the calibration's tenant's: POST /v1/documents with the same key)")
                size = sizes[ln["document_id"]]
            else:
                size = len(ln["text"].encode("utf-8"))
            if size > limit_bytes:
                raise LineRefused(f"line {ln['line']}: the document is {size:,} bytes, over the limit of "
                                  f"{limit_bytes:,} (SPECQ_MAX_INPUT_BYTES)", 413)
            ln["size"] = size
        cal = Calibration(id=new_calibration_id(), tenant=tenant, settings=dict(settings), planned=False,
                          cancel_requested=False, written={}, created_at=utcnow())
        session.add(cal)
        session.flush()
        ids: list[str] = []
        now = utcnow()
        for keep in settings["keep"]:
            for ln in lines:
                job = Job(id=new_job_id(), tenant=tenant, kind=KIND, priority=PRIORITY_CALIBRATION, queue=queue,
                          status="queued", progress_done=0, progress_total=0, attempts=0, max_attempts=max_attempts,
                          created_at=now, params={**params, "keep": keep}, cancel_requested=False)
                session.add(job)
                session.flush()
                session.add(JobInput(job_id=job.id, filename=None, text=ln.get("text") or "", question=ln["question"],
                                     size_bytes=ln["size"], document_id=ln.get("document_id") or None))
                session.add(CalibrationUnit(calibration_id=cal.id, job_id=job.id, line=ln["line"], keep=float(keep),
                                            answer=ln.get("answer"), skipped=False))
                ids.append(job.id)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return cal, ids


def _lock(session: Session, cal_id: str) -> Calibration | None:
    write_transaction(session)
    return session.scalars(select(Calibration).where(Calibration.id == cal_id).with_for_update()
                           .execution_options(populate_existing=True)).one_or_none()


def _cancel_queued(session: Session, job_ids: Iterable[str], message: str) -> None:
    ids = list(job_ids)
    if ids:
        session.execute(update(Job).where(and_(Job.id.in_(ids), Job.status == "queued"))
                        .values(status="cancelled", cancel_requested=True, finished_at=utcnow(), error=message)
                        .execution_options(synchronize_session=False))


def plan(session: Session, cal_id: str, length_of: Callable[[str], tuple[int, int | None]]) -> None:
    """Put each unit under its length, once (module doc, step 2). `length_of(text)`: (tokens, length edge or
    None when the text is longer than every edge), the worker's tokenizer."""
    try:
        cal = _lock(session, cal_id)
        if cal is None or cal.planned:
            session.commit()
            return
        q = (select(CalibrationUnit, JobInput.text, Document.text)
             .join(JobInput, JobInput.job_id == CalibrationUnit.job_id)
             .outerjoin(Document, and_(Document.id == JobInput.document_id, Document.tenant == cal.tenant))
             .where(CalibrationUnit.calibration_id == cal_id).order_by(CalibrationUnit.keep, CalibrationUnit.line))
        units = session.execute(q).all()
        seen: dict[str, tuple[int, int | None]] = {}
        counted: dict[tuple[float, int], int] = {}
        n = int(cal.settings.get("n") or 0)
        edges = cal.settings.get("lengths") or []
        for unit, own_text, doc_text in units:
            text = own_text or doc_text or ""
            if text not in seen:
                seen[text] = length_of(text)
            tokens, length = seen[text]
            if length is None:
                cal.error = (f"line {unit.line}: the document has {tokens:,} tokens, more than the largest length "
                             f"edge ({max(edges):,}): give larger `lengths`")
                _cancel_queued(session, [u.job_id for u, _, _ in units], f"calibration {cal_id} failed: {cal.error}")
                cal.planned = True
                cal.finished_at = utcnow()
                session.commit()
                return
            unit.length = length
            k = (unit.keep, length)
            counted[k] = counted.get(k, 0) + 1
            if n and counted[k] > n:
                unit.skipped = True
        _cancel_queued(session, [u.job_id for u, _, _ in units if u.skipped],
                       f"skipped: beyond n={n} questions of its length (calibration {cal_id})")
        cal.planned = True
        session.commit()
    except BaseException:
        session.rollback()
        raise


def unit_of(session: Session, job_id: str) -> dict[str, Any] | None:
    """The unit a calibration job runs and its calibration's state: {"calibration_id", "line", "keep", "answer",
    "length", "skipped", "lengths" (the calibration's length edges), "error", "cancel_requested"}; None for no
    such unit."""
    row = session.execute(select(CalibrationUnit, Calibration).join(Calibration, Calibration.id == CalibrationUnit.calibration_id)
                          .where(CalibrationUnit.job_id == job_id).execution_options(populate_existing=True)).one_or_none()
    session.commit()
    if row is None:
        return None
    u, c = row
    return {"calibration_id": c.id, "line": u.line, "keep": u.keep, "answer": u.answer, "length": u.length,
            "skipped": u.skipped, "lengths": list(c.settings.get("lengths") or []), "error": c.error,
            "cancel_requested": c.cancel_requested}


def store_record(job_id: str, record: dict[str, Any]) -> Callable[[Session], None]:
    """The write that stores a unit's outcome, for results.save_result's `also` (the job's success and the
    outcome in one transaction: a unit is done exactly when its job succeeded)."""

    def write(session: Session) -> None:
        session.execute(update(CalibrationUnit).where(CalibrationUnit.job_id == job_id).values(record=record)
                        .execution_options(synchronize_session=False))

    return write


def group_key(length: int, keep: float) -> str:
    return f"{length}:{keep:g}"


def write_groups(session: Session, cal_id: str, rows_of: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> list[str]:
    """Write the rows of each (length, keep) whose units are all done and whose rows are not written yet (module
    doc, step 4); the new rows' ids. `rows_of(records)`: one group's records (in line order) -> validated rows
    (as_dict shape); a ValueError from it writes nothing."""
    try:
        cal = _lock(session, cal_id)
        if cal is None or not cal.planned or cal.error:
            session.commit()
            return []
        units = list(session.scalars(select(CalibrationUnit).where(and_(CalibrationUnit.calibration_id == cal_id,
                                                                        CalibrationUnit.skipped.is_(False)))
                                     .order_by(CalibrationUnit.line).execution_options(populate_existing=True)))
        groups: dict[str, list[CalibrationUnit]] = {}
        for u in units:
            groups.setdefault(group_key(u.length, u.keep), []).append(u)
        written = dict(cal.written or {})
        new_ids: list[str] = []
        for gk, members in groups.items():
            if gk in written or any(u.record is None for u in members):
                continue
            rows = rows_of([u.record for u in members])
            recs = evidence.stage_rows(session, rows) if rows else []
            session.flush()
            written[gk] = [r.id for r in recs]
            new_ids += written[gk]
        if written != (cal.written or {}):
            cal.written = written
            if set(groups) <= set(written):
                cal.finished_at = utcnow()
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return new_ids


def request_cancel(session: Session, cal_id: str, tenant: str | None = None) -> bool:
    """Cancel a calibration: queued units cancelled now, running ones asked to stop (their workers see it);
    rows already written stay. False when there is no such calibration."""
    try:
        q = select(Calibration).where(Calibration.id == cal_id)
        if tenant is not None:
            q = q.where(Calibration.tenant == tenant)
        write_transaction(session)
        cal = session.scalars(q.with_for_update()).one_or_none()
        if cal is None:
            session.commit()
            return False
        cal.cancel_requested = True
        if cal.finished_at is None:
            cal.finished_at = utcnow()
        job_ids = list(session.scalars(select(CalibrationUnit.job_id).where(CalibrationUnit.calibration_id == cal_id)))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    for job_id in job_ids:
        cancel_job(session, job_id)
    return True


def summary(session: Session, cal: Calibration) -> dict[str, Any]:
    """The calibration as GET /v1/calibrations shows it: status (module doc), progress, settings, the ids of the
    rows written per (length, keep) group."""
    units = session.execute(select(CalibrationUnit.skipped, CalibrationUnit.record.is_not(None), Job.status, Job.error,
                                   CalibrationUnit.line, CalibrationUnit.keep)
                            .outerjoin(Job, Job.id == CalibrationUnit.job_id)
                            .where(CalibrationUnit.calibration_id == cal.id)).all()
    total = sum(1 for u in units if not u.skipped)
    done = sum(1 for u in units if not u.skipped and u[1])
    failed = [u for u in units if not u.skipped and not u[1] and u.status == "failed"]
    started = any(u[1] or u.status in ("running", "succeeded") for u in units)
    written = dict(cal.written or {})
    error = cal.error or (f"line {failed[0].line} (keep {failed[0].keep:g}): {failed[0].error}" if failed else None)
    if cal.cancel_requested:
        status = "cancelled"
    elif error:
        status = "failed"
    elif cal.planned and done == total and written and all(
            group_key(length, keep) in written for length, keep in _groups(session, cal.id)):
        status = "succeeded"
    else:
        status = "running" if started else "queued"
    out = {"id": cal.id, "object": "calibration", "tenant": cal.tenant, "status": status, "error": error,
           "settings": cal.settings, "planned": cal.planned,
           "progress": {"done": done, "total": total, "failed": len(failed),
                        "skipped": sum(1 for u in units if u.skipped)},
           "rows_written": written, "created_at": _iso(cal.created_at), "finished_at": _iso(cal.finished_at)}
    session.commit()
    return out


def _groups(session: Session, cal_id: str) -> set[tuple[int, float]]:
    return {(length, keep) for length, keep in session.execute(
        select(CalibrationUnit.length, CalibrationUnit.keep).where(and_(CalibrationUnit.calibration_id == cal_id,
                                                                        CalibrationUnit.skipped.is_(False))).distinct())}


def _iso(t) -> str | None:
    return None if t is None else t.isoformat().replace("+00:00", "Z")


def get(session: Session, cal_id: str, tenant: str | None = None) -> Calibration | None:
    q = select(Calibration).where(Calibration.id == cal_id).execution_options(populate_existing=True)
    if tenant is not None:
        q = q.where(Calibration.tenant == tenant)
    cal = session.scalars(q).one_or_none()
    session.commit()
    return cal


def list_calibrations(session: Session, tenant: str | None = None, limit: int = 50) -> list[Calibration]:
    """Newest first."""
    q = select(Calibration).order_by(Calibration.created_at.desc(), Calibration.id.desc()).limit(max(0, limit))
    if tenant is not None:
        q = q.where(Calibration.tenant == tenant)
    cals = list(session.scalars(q.execution_options(populate_existing=True)))
    session.commit()
    return cals


__all__ = ["KIND", "LineRefused", "new_calibration_id", "create", "plan", "unit_of", "store_record", "group_key",
           "write_groups", "request_cancel", "summary", "get", "list_calibrations"]
