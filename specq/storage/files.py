"""Files (OpenAI Files API): uploads with purpose `batch`, and the output/error files of batches.

A file is a `files` row (id `file-` + 24 hex digits, tenant, purpose, name, size) and its bytes as
`file_chunks` rows of at most CHUNK_BYTES each, written in one transaction with the row: a file is
there whole or not at all. Reads are filtered by tenant like jobs (another tenant's file is None).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from datetime import datetime

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.orm import Session

from .models import File, FileChunk, utcnow

#: bytes per file_chunks row
CHUNK_BYTES = 1 << 20


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


class ChunkWriter:
    """Bytes appended to a file being written in the caller's transaction (output files)."""

    def __init__(self, session: Session, file_id: str) -> None:
        self.session, self.file_id = session, file_id
        self.size, self._seq, self._buf = 0, 0, bytearray()

    def write(self, data: bytes) -> None:
        self._buf += data
        self.size += len(data)
        while len(self._buf) >= CHUNK_BYTES:
            self._emit(bytes(self._buf[:CHUNK_BYTES]))
            del self._buf[:CHUNK_BYTES]

    def close(self) -> None:
        if self._buf or self._seq == 0:
            self._emit(bytes(self._buf))
            self._buf.clear()

    def _emit(self, data: bytes) -> None:
        self.session.add(FileChunk(file_id=self.file_id, seq=self._seq, data=data))
        self.session.flush()
        self._seq += 1


def add_file(session: Session, *, tenant: str, purpose: str, filename: str, chunks: Iterable[bytes],
             batch_id: str | None = None, created_at: datetime | None = None) -> File:
    """Insert a file and its bytes in the session's transaction (not committed)."""
    row = File(id=new_file_id(), tenant=tenant, purpose=purpose, filename=filename, bytes=0,
               created_at=created_at or utcnow(), batch_id=batch_id)
    session.add(row)
    session.flush()
    writer = ChunkWriter(session, row.id)
    for data in chunks:
        writer.write(data)
    writer.close()
    row.bytes = writer.size
    session.flush()
    return row


def create_file(session: Session, *, tenant: str, purpose: str, filename: str, data: bytes,
                batch_id: str | None = None) -> File:
    """Store `data` as a new file (one transaction); return it."""
    try:
        row = add_file(session, tenant=tenant, purpose=purpose, filename=filename, batch_id=batch_id,
                       chunks=(data[i:i + CHUNK_BYTES] for i in range(0, max(len(data), 1), CHUNK_BYTES)))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return row


def get_file(session: Session, file_id: str, tenant: str | None = None) -> File | None:
    q = select(File).where(File.id == file_id)
    if tenant is not None:
        q = q.where(File.tenant == tenant)
    row = session.scalars(q.execution_options(populate_existing=True)).one_or_none()
    session.commit()
    return row


def list_files(session: Session, *, tenant: str | None = None, purpose: str | None = None, limit: int = 20,
               after: str | None = None, order: str = "desc") -> tuple[list[File], bool]:
    """A page of files ordered by (created_at, id) (`order` desc: newest first), starting after the file
    `after`; and whether more follow. The cursor is looked up with the same tenant filter as the page:
    another tenant's file id is an unknown cursor (the first page), not a position in time."""
    q = select(File)
    if tenant is not None:
        q = q.where(File.tenant == tenant)
    if purpose is not None:
        q = q.where(File.purpose == purpose)
    desc = order != "asc"
    if after is not None:
        cursor = select(File.created_at, File.id).where(File.id == after)
        if tenant is not None:
            cursor = cursor.where(File.tenant == tenant)
        mark = session.execute(cursor).one_or_none()
        if mark is not None:
            at, fid = mark
            q = q.where(or_(File.created_at < at, and_(File.created_at == at, File.id < fid)) if desc
                        else or_(File.created_at > at, and_(File.created_at == at, File.id > fid)))
    q = q.order_by(File.created_at.desc(), File.id.desc()) if desc else q.order_by(File.created_at, File.id)
    rows = list(session.scalars(q.limit(limit + 1).execution_options(populate_existing=True)))
    session.commit()
    return rows[:limit], len(rows) > limit


def read_chunks(session: Session, file_id: str) -> Iterator[bytes]:
    """The file's bytes, chunk by chunk (one short query each)."""
    seq = 0
    while True:
        data = session.scalar(select(FileChunk.data).where(and_(FileChunk.file_id == file_id, FileChunk.seq == seq)))
        session.commit()
        if data is None:
            return
        yield bytes(data)
        seq += 1


def read_all(session: Session, file_id: str) -> bytes:
    return b"".join(read_chunks(session, file_id))


def delete_file(session: Session, file_id: str, tenant: str | None = None) -> bool:
    try:
        q = delete(File).where(File.id == file_id)
        if tenant is not None:
            q = q.where(File.tenant == tenant)
        n = session.execute(q).rowcount
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n == 1


def tenant_bytes(session: Session, tenant: str, *, commit: bool = True) -> int:
    """Bytes of the files the tenant uploaded or a native batch create stored as its input (batches'
    output files not counted). `commit=False`: read in the caller's transaction (quotas.reserve_file_bytes)."""
    n = session.scalar(select(func.coalesce(func.sum(File.bytes), 0))
                       .where(and_(File.tenant == tenant, File.purpose != "batch_output"))) or 0
    if commit:
        session.commit()
    return int(n)


__all__ = ["CHUNK_BYTES", "new_file_id", "ChunkWriter", "add_file", "create_file", "get_file", "list_files",
           "read_chunks", "read_all", "delete_file", "tenant_bytes"]
