"""SQLAlchemy 2 models: jobs, their inputs, results and per-phase timings, and batches.

The schema is created and changed only by the Alembic migrations in `migrations/`; a test checks
that the migrations match these models exactly. Times are timezone-aware UTC datetimes on every
backend (SQLite stores them as naive UTC text; `UTCDateTime` puts the zone back).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from .sanitize import clean_errors, clean_metadata, safe_dict
from ..contracts import BATCH_STATUSES, BATCH_TERMINAL, JOB_KINDS, JOB_STATUSES, JOB_TERMINAL  # noqa: F401  (re-exported)

#: constraint names are fixed by convention, so migrations (and SQLite batch migrations) can name them
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON on every backend, JSONB on PostgreSQL
JSONType = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_token() -> str:
    """A fresh attempt token (`Job.attempt_token`): 64 random bits as 16 hex digits."""
    return secrets.token_hex(8)


class UTCDateTime(TypeDecorator):
    """DateTime(timezone=True) that always returns aware UTC datetimes (naive input is taken as UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def unix(value: datetime | None) -> int | None:
    """Unix seconds (OpenAI's timestamps), or None."""
    return int(value.timestamp()) if value is not None else None


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Batch(Base):
    """A group of jobs submitted together (OpenAI Batch API-like); `request_*` are its request_counts."""

    __tablename__ = "batches"
    __table_args__ = (
        CheckConstraint(f"status IN ({_in(BATCH_STATUSES)})", name="status"),
        Index(None, "tenant", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), default="default", server_default="default")
    status: Mapped[str] = mapped_column(String(16), default="validating", server_default="validating")
    #: e.g. "/v1/jobs"; kept for API parity, free-form
    endpoint: Mapped[str | None] = mapped_column(String(128))
    completion_window: Mapped[str | None] = mapped_column(String(32))
    input_filename: Mapped[str | None] = mapped_column(String(255))
    #: default RunParams for the batch's jobs
    params: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: user metadata (attribute `metadata_`: `metadata` is taken by SQLAlchemy)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    #: validation errors (list of {line, code, message}) or None
    errors: Mapped[Any | None] = mapped_column(JSONType)
    request_total: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    request_completed: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    request_failed: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: the file its requests came from (OpenAI create: the caller's; native create: stored by specq)
    input_file_id: Mapped[str | None] = mapped_column(String(40))
    #: OpenAI-format result lines of the succeeded / the failed and cancelled requests, written when
    #: the batch finishes (storage.batch_files)
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    #: its completion window passed while requests were still running: it ends `expired`, not `completed`
    expire_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI Batch object (Unix-second timestamps) plus specq's fields (tenant, input_filename,
        params)."""
        return {
            "id": self.id,
            "object": "batch",
            "tenant": self.tenant,
            "status": self.status,
            "endpoint": self.endpoint,
            "completion_window": self.completion_window,
            "input_file_id": self.input_file_id,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "input_filename": self.input_filename,
            # stored JSON read defensively: rows older code accepted must not break reads (sanitize.py)
            "params": safe_dict(self.params),
            "metadata": clean_metadata(self.metadata_),
            "errors": clean_errors(self.errors),
            "request_counts": {
                "total": self.request_total,
                "completed": self.request_completed,
                "failed": self.request_failed,
            },
            **{
                name: unix(getattr(self, name))
                for name in (
                    "created_at",
                    "in_progress_at",
                    "finalizing_at",
                    "completed_at",
                    "failed_at",
                    "expired_at",
                    "cancelling_at",
                    "cancelled_at",
                    "expires_at",
                )
            },
        }


class Job(Base):
    """One question about one document, run once (retried up to `max_attempts`)."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(f"status IN ({_in(JOB_STATUSES)})", name="status"),
        UniqueConstraint("batch_id", "custom_id"),
        Index(None, "tenant", "created_at"),
        #: the order of the unfiltered job list (GET /v1/jobs, newest first): a page is read off it
        Index(None, "created_at", "id"),
        Index(None, "status", "created_at"),
        Index(None, "batch_id", "status"),
        Index(None, "status", "queue", "priority", "tenant", "created_at"),
        CheckConstraint(f"kind IN ({_in(JOB_KINDS)})", name="kind"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), default="default", server_default="default")
    #: job (a document and a question), chat (messages, rendered by the worker's chat template),
    #: completion (a raw prompt) — those two come from the OpenAI routes — or calibration (a unit of a
    #: calibration: storage/calibrations.py)
    kind: Mapped[str] = mapped_column(String(16), default="job", server_default="job")
    #: the model the request named (OpenAI routes), for the response's `model`
    model: Mapped[str | None] = mapped_column(String(255))
    #: claim order: 0 interactive (single jobs, chat and completion requests), 1 batch requests, 9 calibration units
    priority: Mapped[int] = mapped_column(SmallInteger, default=0, server_default=text("0"))
    #: the broker queue it was sent to (claims pick among their queue's jobs); NULL: rows from before
    #: queues were recorded, claimable from any queue
    queue: Mapped[str | None] = mapped_column(String(64))
    #: a retried job is not claimed before this (its backoff)
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime)
    batch_id: Mapped[str | None] = mapped_column(String(40), ForeignKey("batches.id", ondelete="CASCADE"))
    #: the caller's id for a job inside a batch (unique within the batch)
    custom_id: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="queued", server_default="queued")
    progress_phase: Mapped[str | None] = mapped_column(String(64))
    progress_done: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    progress_total: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer, default=3, server_default=text("3"))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: milliseconds from submission to the first claim by a worker
    queue_wait_ms: Mapped[float | None] = mapped_column(Float)
    params: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: "hostname:pid" of the worker that claimed it last
    worker: Mapped[str | None] = mapped_column(String(255))
    #: the fencing token of the current attempt: new at every claim and at every reconciler transition;
    #: a worker's writes about the job match only (id, its token, running) (storage.jobs, "Fencing")
    attempt_token: Mapped[str | None] = mapped_column(String(32))
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "job",
            "tenant": self.tenant,
            "kind": self.kind,
            "model": self.model,
            "priority": self.priority,
            "batch_id": self.batch_id,
            "custom_id": self.custom_id,
            "status": self.status,
            "progress": {"phase": self.progress_phase, "done": self.progress_done, "total": self.progress_total},
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "error": self.error,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "queue_wait_ms": self.queue_wait_ms,
            "params": safe_dict(self.params),
            "worker": self.worker,
            "heartbeat_at": _iso(self.heartbeat_at),
            "cancel_requested": bool(self.cancel_requested),
        }


class JobInput(Base):
    """The document and question of a job (kept apart so listing jobs never loads documents)."""

    __tablename__ = "job_inputs"

    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    filename: Mapped[str | None] = mapped_column(String(255))
    text: Mapped[str] = mapped_column(Text)
    question: Mapped[str] = mapped_column(Text, default="", server_default="")
    #: UTF-8 size of `text`
    size_bytes: Mapped[int] = mapped_column(Integer)
    #: a chat job's messages, [{"role", "content"}, ...] (`text` is then empty)
    messages: Mapped[list[dict[str, str]] | None] = mapped_column(JSONType)
    #: the stored document the job asks about (`text` is then empty; storage.jobs.get_input fills it in);
    #: NULL once the document was deleted after the job finished
    document_id: Mapped[str | None] = mapped_column(String(40), ForeignKey("documents.id", ondelete="SET NULL"),
                                                    index=True)


class Document(Base):
    """A document stored once and asked about by many jobs (POST /v1/documents). Same tenant + same
    sha256 of the text = the same document (one row): a tenant never sees another tenant's."""

    __tablename__ = "documents"
    __table_args__ = (UniqueConstraint("tenant", "sha256"), Index(None, "tenant", "created_at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    #: hex sha256 of the UTF-8 text
    sha256: Mapped[str] = mapped_column(String(64))
    filename: Mapped[str | None] = mapped_column(String(255))
    text: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    def to_dict(self) -> dict[str, Any]:
        """The document without its text."""
        return {"id": self.id, "object": "document", "tenant": self.tenant, "sha256": self.sha256,
                "filename": self.filename, "size_bytes": self.size_bytes, "created_at": _iso(self.created_at)}


class JobDelta(Base):
    """Answer text of a running job, published by the worker for event streams on the embedded default
    (with Redis it goes through pub/sub instead; specq.worker.stream). Deleted when the job ends."""

    __tablename__ = "job_deltas"

    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: 0, 1, … within the attempt
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: characters of this attempt's answer before `text`
    offset: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    #: the attempt's generation ended (its text is all published)
    final: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ClaimTurn(Base):
    """When a tenant's job was last claimed from a queue: claims go to the tenant served longest ago
    among those with the fewest running jobs (storage.claims.claim_next)."""

    __tablename__ = "claim_turns"

    queue: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_claim_at: Mapped[datetime] = mapped_column(UTCDateTime)


class File(Base):
    """An uploaded file (OpenAI Files API, purpose `batch`) or a batch's output/error file; its bytes are
    `file_chunks` rows of at most 1 MiB, so neither upload nor download holds one huge value."""

    __tablename__ = "files"
    __table_args__ = (Index(None, "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    #: batch (uploads) or batch_output (written by specq)
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: the batch an output/error file belongs to (deleted with it)
    batch_id: Mapped[str | None] = mapped_column(String(40), ForeignKey("batches.id", ondelete="CASCADE"))

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI File object."""
        return {"id": self.id, "object": "file", "bytes": int(self.bytes), "created_at": unix(self.created_at),
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


class FileChunk(Base):
    __tablename__ = "file_chunks"

    file_id: Mapped[str] = mapped_column(String(40), ForeignKey("files.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Result(Base):
    """A job's answer: exactly one row per succeeded job (the job id is the primary key)."""

    __tablename__ = "results"

    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    finish_reason: Mapped[str] = mapped_column(String(32))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    kept_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    engine: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    draft: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: any other top-level keys of the result object (e.g. `warnings`), so new fields need no migration
    extra: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PhaseTiming(Base):
    """One `timings_ms` entry of a result: (job_id, phase) -> ms. New phases need no migration."""

    __tablename__ = "phase_timings"
    __table_args__ = (Index(None, "phase"),)

    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    phase: Mapped[str] = mapped_column(String(64), primary_key=True)
    ms: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    """An API key of one tenant. Only the sha256 of the secret is stored (the secret is shown once, at
    creation); `prefix`, its first characters, names it in listings. Admin keys see every tenant."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash"), Index(None, "tenant"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: a note for people (`specq keys create --name`)
    name: Mapped[str | None] = mapped_column(String(255))
    prefix: Mapped[str] = mapped_column(String(32))
    #: hex sha256 of the whole key
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "object": "api_key", "tenant": self.tenant, "admin": bool(self.admin),
                "name": self.name, "prefix": self.prefix, "created_at": _iso(self.created_at),
                "revoked_at": _iso(self.revoked_at)}


class EvidenceRecord(Base):
    """One quality-evidence row written through POST /v1/evidence (engine/policy/evidence.py validated it; the
    shipped rows live in the package, not here). Key fields as columns; `revision` grows with every write
    (the table's max is what workers compare at claim time to reload without a restart)."""

    __tablename__ = "quality_evidence"
    __table_args__ = (Index(None, "revision"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer)
    # the EvidenceKey (engine/policy/evidence_key.py)
    target_sha256: Mapped[str] = mapped_column(String(64))
    speculator_sha256: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(16))
    prompt_shape: Mapped[str] = mapped_column(String(16))
    task: Mapped[str | None] = mapped_column(String(64))
    positions: Mapped[str] = mapped_column(String(16))
    score_math: Mapped[str] = mapped_column(String(16))
    scorer: Mapped[str] = mapped_column(String(16))
    window: Mapped[int] = mapped_column(Integer)
    chunk_rule: Mapped[str] = mapped_column(String(16))
    keep: Mapped[float] = mapped_column(Float)
    max_keep: Mapped[int] = mapped_column(Integer)
    chunk: Mapped[int] = mapped_column(Integer)
    lookahead: Mapped[int] = mapped_column(Integer)
    pool: Mapped[int] = mapped_column(Integer)
    selection: Mapped[str] = mapped_column(String(16))
    pipelined: Mapped[bool] = mapped_column(Boolean)
    protect_tail: Mapped[int] = mapped_column(Integer)
    target: Mapped[str] = mapped_column(String(255))  # labels only
    speculator: Mapped[str] = mapped_column(String(255))
    # the measurement
    metric: Mapped[str] = mapped_column(String(32))
    arm: Mapped[str] = mapped_column(String(16))
    length: Mapped[int] = mapped_column(Integer)
    doc_tokens_min: Mapped[int] = mapped_column(Integer)
    doc_tokens_max: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    #: per document (content hash): {"n", "baseline_right", "arm_right", "both_right"}
    documents: Mapped[dict[str, Any]] = mapped_column(JSONType)
    bound_method: Mapped[str] = mapped_column(String(64))
    bound: Mapped[float] = mapped_column(Float)
    passes: Mapped[bool] = mapped_column(Boolean)
    in_sample: Mapped[bool] = mapped_column(Boolean)
    in_sample_why: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: why the row is switched off ("" = on)
    disabled: Mapped[str] = mapped_column(Text)
    #: measures the keep `specq calibrate` chose for its length on other documents (migration 0010)
    certified: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ShadowCheck(Base):
    """One shadow check (engine/policy/shadow.py): a mode-auto specprefill job answered in baseline too, while
    the worker was idle. `key_id`: sha256 of the job's EvidenceKey's compared fields, `key` the fields
    themselves; `outcome`: agree | disagree | cancelled (real work arrived first). No foreign key: the
    checks outlive the jobs' retention."""

    __tablename__ = "shadow_checks"
    __table_args__ = (Index(None, "key_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(64))
    key: Mapped[dict[str, Any]] = mapped_column(JSONType)
    outcome: Mapped[str] = mapped_column(String(16))
    #: the baseline run's wall time (to the answer or the cancel)
    shadow_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Calibration(Base):
    """A calibration submitted through the service (POST /v1/calibrations, storage/calibrations.py): its settings,
    its units (CalibrationUnit, each run as a job of kind `calibration`) and the evidence rows written for it.
    `planned`: a worker has counted every document's tokens and put each unit under its length (`plan`);
    `written`: the (length, keep) groups whose rows are stored ({"<length>:<keep>": [evidence ids]}), each written
    once, in the transaction that adds it here."""

    __tablename__ = "calibrations"
    __table_args__ = (Index(None, "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    #: {"lengths": [edges], "keep": [..], "n": int, "task": str, "max_tokens": int}
    settings: Mapped[dict[str, Any]] = mapped_column(JSONType)
    planned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: why the calibration cannot finish (a document longer than every length edge), else NULL
    error: Mapped[str | None] = mapped_column(Text)
    written: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class CalibrationUnit(Base):
    """One question of a calibration at one keep: the job that runs its three passes (`job_id`, no foreign key:
    the outcome outlives the job's retention), its line, reference answer, and once planned its length (or
    `skipped`: beyond `n` questions of its length); `record` is its outcome (engine/policy/calibration_rows
    unit_record), stored in the transaction that marks the job succeeded."""

    __tablename__ = "calibration_units"
    __table_args__ = (Index(None, "calibration_id", "keep", "length"), UniqueConstraint("job_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    calibration_id: Mapped[str] = mapped_column(String(40), ForeignKey("calibrations.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(String(40))
    line: Mapped[int] = mapped_column(Integer)
    keep: Mapped[float] = mapped_column(Float)
    answer: Mapped[str | None] = mapped_column(Text)
    length: Mapped[int | None] = mapped_column(Integer)
    skipped: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    record: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


__all__ = [
    "Base",
    "ApiKey",
    "Batch",
    "Job",
    "JobInput",
    "Document",
    "EvidenceRecord",
    "ShadowCheck",
    "Calibration",
    "CalibrationUnit",
    "Result",
    "PhaseTiming",
    "JobDelta",
    "ClaimTurn",
    "File",
    "FileChunk",
    "unix",
    "JOB_KINDS",
    "JOB_STATUSES",
    "JOB_TERMINAL",
    "BATCH_STATUSES",
    "BATCH_TERMINAL",
    "UTCDateTime",
    "JSONType",
    "utcnow",
]
