"""A finished batch's output and error files, in OpenAI's format (specq.openai_format).

`write_batch_files` runs inside `batches.advance_batch`'s transaction when the last request ends, so a
batch becomes completed, cancelled or expired together with its files: the output file holds one line
per succeeded request (`{"id", "custom_id", "response": {"status_code": 200, "body"}, "error": null}`),
the error file one per failed or cancelled one (`{"id", "custom_id", "response": null, "error"}`), both
in request order. A file with no lines is not made (its id stays null, as OpenAI does).
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from .. import openai_format as F
from .files import ChunkWriter, new_file_id
from .models import Batch, File, Job, PhaseTiming, Result, unix, utcnow

#: jobs read per query while writing
PAGE = 500


def _result_dict(row: Result, timings: dict[str, float]) -> dict:
    return {"text": row.text, "finish_reason": row.finish_reason,
            "usage": {"prompt_tokens": row.prompt_tokens, "kept_tokens": row.kept_tokens,
                      "completion_tokens": row.completion_tokens},
            "timings_ms": timings, "spec": row.spec or {}, "engine": row.engine or {}, "draft": row.draft or {},
            **(row.extra or {})}


def _pages(session: Session, batch_id: str, statuses: tuple[str, ...]):
    after: tuple[datetime, str] | None = None
    while True:
        q = select(Job).where(and_(Job.batch_id == batch_id, Job.status.in_(statuses)))
        if after is not None:
            q = q.where(or_(Job.created_at > after[0], and_(Job.created_at == after[0], Job.id > after[1])))
        rows = list(session.scalars(q.order_by(Job.created_at, Job.id).limit(PAGE)))
        if not rows:
            return
        yield rows
        after = (rows[-1].created_at, rows[-1].id)


class _File:
    def __init__(self, session: Session, batch: Batch, name: str) -> None:
        self.session, self.batch, self.name = session, batch, name
        self.row: File | None = None
        self.writer: ChunkWriter | None = None

    def line(self, obj: dict) -> None:
        if self.row is None:
            self.row = File(id=new_file_id(), tenant=self.batch.tenant, purpose="batch_output", filename=self.name,
                            bytes=0, created_at=utcnow(), batch_id=self.batch.id)
            self.session.add(self.row)
            self.session.flush()
            self.writer = ChunkWriter(self.session, self.row.id)
        self.writer.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))

    def close(self) -> str | None:
        if self.row is None:
            return None
        self.writer.close()
        self.row.bytes = self.writer.size
        self.session.flush()
        return self.row.id


def write_batch_files(session: Session, batch: Batch) -> None:
    """Write the batch's output and error files and set their ids on `batch` (no commit)."""
    if batch.output_file_id or batch.error_file_id:
        return
    out = _File(session, batch, f"{batch.id}_output.jsonl")
    for page in _pages(session, batch.id, ("succeeded",)):
        ids = [j.id for j in page]
        results = {r.job_id: r for r in session.scalars(select(Result).where(Result.job_id.in_(ids)))}
        timings: dict[str, dict[str, float]] = {}
        for job_id, phase, ms in session.execute(select(PhaseTiming.job_id, PhaseTiming.phase, PhaseTiming.ms)
                                                 .where(PhaseTiming.job_id.in_(ids))):
            timings.setdefault(job_id, {})[phase] = ms
        for job in page:
            row = results.get(job.id)
            if row is not None:
                out.line(F.output_line(job.id, job.custom_id, job.kind, job.model, unix(job.created_at) or 0,
                                       _result_dict(row, timings.get(job.id, {}))))
    err = _File(session, batch, f"{batch.id}_error.jsonl")
    for page in _pages(session, batch.id, ("failed", "cancelled")):
        for job in page:
            err.line(F.error_line(job.id, job.custom_id, job.status, job.error))
    batch.output_file_id, batch.error_file_id = out.close(), err.close()


__all__ = ["write_batch_files"]
