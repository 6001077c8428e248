"""The Files API (OpenAI's), for batch input: upload, list, retrieve, download, delete.

    POST   /v1/files                 multipart `file` + `purpose` ("batch") -> the File object
    GET    /v1/files                 ?purpose=&limit=&after=&order= -> {object: list, data, first_id,
                                     last_id, has_more}
    GET    /v1/files/{id}            the File object
    GET    /v1/files/{id}/content    its bytes (output/error files of batches: JSONL)
    DELETE /v1/files/{id}            {id, object: file, deleted: true}

Limits: one file is at most SPECQ_MAX_BATCH_BYTES (413), a tenant's files together (with the inputs
its native batch creates stored) at most SPECQ_MAX_FILE_STORAGE_BYTES (413; counted and inserted
under a per-tenant lock, storage.quotas); names as other names (255 characters). Each file belongs to the
tenant that uploaded it (another tenant's id is a 404). Batches' output and error files are listed
with purpose `batch_output` and deleted with their batch.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ..settings import ServiceSettings
from ..storage import db, files
from ..storage.keys import Caller
from ..storage.quotas import FileQuotaExceeded, reserve_file_bytes
from . import openai_schemas as O
from . import schemas as S
from .errors import ApiError, responses
from .jobs import check_field, links

FileId = Path(..., min_length=1, max_length=S.MAX_ID_CHARS, description="a file id (file-…)")
PURPOSES = ("batch",)
UPLOAD_DOC = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"], "additionalProperties": False,
    "properties": {"file": {"type": "string", "format": "binary"},
                   "purpose": {"type": "string", "enum": list(PURPOSES)}}}}}}}


def files_router(settings: ServiceSettings, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["files"])

    def _get(file_id: str, scope: str | None):
        with db.session() as s:
            row = files.get_file(s, file_id, tenant=scope)
        if row is None:
            raise ApiError(404, f"No such File object: {file_id}", "invalid_request_error", param="id")
        return row

    @router.post("/v1/files", summary="Upload a file (purpose batch)", operation_id="createFile",
                 response_model=O.FileObject, openapi_extra=UPLOAD_DOC,
                 responses={200: {"links": links("$response.body#/id", "file_id", "getFile", "getFileContent",
                                                 "deleteFile")}, **responses(400, 401, 413, 415, 422)})
    async def create_file(request: Request, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "multipart/form-data":
            raise ApiError(415, "send multipart/form-data with `file` and `purpose`", "invalid_request_error")
        name, data, purpose = await _read_upload(request, settings)
        row = await run_in_threadpool(_store, settings, caller.tenant, name, data, purpose)
        return row.to_dict()

    @router.get("/v1/files", summary="List files, newest first", operation_id="listFiles", response_model=O.FileList,
                responses=responses(401, 422))
    def list_files(purpose: str | None = Query(None, max_length=32), limit: int = Query(20, ge=1, le=S.MAX_LIMIT),
                   after: str | None = Query(None, max_length=S.MAX_ID_CHARS),
                   order: Literal["asc", "desc"] = Query("desc"), caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        limit = min(limit, settings.max_list_limit)
        with db.session() as s:
            rows, more = files.list_files(s, tenant=caller.scope, purpose=purpose, limit=limit, after=after, order=order)
        data = [r.to_dict() for r in rows]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    @router.get("/v1/files/{file_id}", summary="A file", operation_id="getFile", response_model=O.FileObject,
                responses=responses(401, 404, 422))
    def get_file(file_id: str = FileId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        return _get(file_id, caller.scope).to_dict()

    @router.get("/v1/files/{file_id}/content", summary="A file's content", operation_id="getFileContent",
                response_class=StreamingResponse, responses={200: {"content": {"application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"}}}}, **responses(401, 404, 422)})
    def file_content(file_id: str = FileId, caller: Caller = Depends(caller_of)):
        row = _get(file_id, caller.scope)

        def chunks():
            with db.session() as s:
                yield from files.read_chunks(s, row.id)

        return StreamingResponse(chunks(), media_type="application/octet-stream",
                                 headers={"Content-Length": str(row.bytes),
                                          "Content-Disposition": f'attachment; filename="{row.id}.jsonl"'})

    @router.delete("/v1/files/{file_id}", summary="Delete a file", operation_id="deleteFile",
                   response_model=O.FileDeleted, responses=responses(401, 404, 422))
    def delete_file(file_id: str = FileId, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            if not files.delete_file(s, file_id, tenant=caller.scope):
                raise ApiError(404, f"No such File object: {file_id}", "invalid_request_error", param="id")
        return {"id": file_id, "object": "file", "deleted": True}

    return router


async def _read_upload(request: Request, settings: ServiceSettings) -> tuple[str, bytes, str]:
    try:
        form = await request.form(max_files=1, max_fields=4, max_part_size=1 << 16)
    except Exception as e:
        if getattr(e, "status_code", None) == 413:
            raise
        raise ApiError(400, f"bad multipart body: {str(e)[:200]}", "invalid_request_error") from None
    try:
        unknown = sorted(str(k)[:40] for k in set(form.keys()) - {"file", "purpose"})
        if unknown:
            raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}", "invalid_request_error",
                           param=unknown[0])
        purpose = form.get("purpose")
        if not isinstance(purpose, str) or purpose not in PURPOSES:
            raise ApiError(400, f"purpose must be one of {', '.join(PURPOSES)} (specq stores batch input files only)",
                           "invalid_request_error", param="purpose")
        upload = form.get("file")
        if not isinstance(upload, UploadFile) or len(form.getlist("file")) != 1:
            raise ApiError(400, "file is required (one multipart file part)", "invalid_request_error", param="file")
        name = check_field(upload.filename or "file", "the file name", S.Name)
        limit = settings.max_batch_bytes
        data = await upload.read(limit + 1)
        if len(data) > limit:
            raise ApiError(413, f"the file is over the limit of {limit} bytes (SPECQ_MAX_BATCH_BYTES)", "too_large")
        if not data.strip():
            raise ApiError(400, "the file is empty", "invalid_request_error", param="file")
        return name, data, purpose
    finally:
        await form.close()


def _store(settings: ServiceSettings, tenant: str, name: str, data: bytes, purpose: str):
    with db.session() as s:
        try:  # counted under the tenant's lock, the file inserted in the same transaction
            reserve_file_bytes(s, tenant, len(data), settings.max_file_storage_bytes)
        except FileQuotaExceeded as e:
            raise ApiError(413, str(e), "too_large") from None
        return files.create_file(s, tenant=tenant, purpose=purpose, filename=name, data=data)


__all__ = ["files_router"]
