"""The documents API: store a document once, ask many questions about it.

    POST   /v1/documents          JSON `DocumentCreate` {text, filename}, or multipart `file`
                                  -> 201 `DocumentOut` (200 with created=false when the tenant already
                                  stored this text: same sha256, same id)
    GET    /v1/documents          ?limit=&offset= -> `DocumentList` (the caller's tenant; without texts)
    GET    /v1/documents/{id}     `DocumentOut` (+ `jobs`: how many jobs ask about it)
    GET    /v1/documents/{id}/text  `DocumentText`: with its text
    DELETE /v1/documents/{id}     409 while a queued or running job asks about it

Jobs (`POST /v1/jobs`) and batch lines take `document_id` instead of `text`. Limits as for job
documents (SPECQ_MAX_INPUT_BYTES: 413; empty or binary: 422). A tenant never sees, reuses or deletes
another tenant's document (404 as if it did not exist); an admin key reads every tenant's.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ..contracts import InputError
from ..engine.inputs import decode_document
from ..settings import ServiceSettings
from ..storage import db, documents, limits
from ..storage.errors import InputTooLarge
from ..storage.keys import Caller
from . import schemas as S
from .errors import ApiError, from_validation, responses
from .jobs import FORM_TYPES, JSON_TYPES, check_document, check_field
from .query import OFFSET, limit_query

DocumentIdPath = Path(..., min_length=1, max_length=S.MAX_ID_CHARS, description="a document id (doc_…)")

DOC_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/DocumentCreate"}},
            "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "additionalProperties": False,
                                               "properties": {"file": {"type": "string", "format": "binary"}}}},
        },
    }
}


def documents_router(settings: ServiceSettings, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["documents"])

    @router.post("/v1/documents", status_code=201, summary="Store a document (the same text again: the same id)",
                 operation_id="createDocument", response_model=S.DocumentOut, openapi_extra=DOC_BODY,
                 responses={200: {"model": S.DocumentOut, "description": "the tenant already stored this text"},
                            **responses(400, 401, 413, 415, 422)})
    async def create_document(request: Request, caller: Caller = Depends(caller_of)) -> JSONResponse:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype in JSON_TYPES:
            text, filename = await run_in_threadpool(_parse_json, await request.body())
        elif ctype in FORM_TYPES:
            text, filename = await _read_form(request)
        else:
            raise ApiError(415, "send application/json {text, filename} or multipart/form-data with file",
                           "unsupported_media_type")
        await run_in_threadpool(check_document, text)  # megabytes of text: checked off the event loop

        def store() -> tuple[dict[str, Any], bool]:
            with db.session() as s:
                try:
                    row, created = documents.put_document(s, tenant=caller.tenant, text=text, filename=filename)
                except InputTooLarge as e:
                    raise ApiError(413, str(e), "too_large") from None
                return {**row.to_dict(), "created": created}, created

        out, created = await run_in_threadpool(store)
        body = S.DocumentOut.model_validate(out).model_dump(mode="json")
        return JSONResponse(status_code=201 if created else 200, content=body,
                            headers={"Location": f"/v1/documents/{out['id']}"})

    @router.get("/v1/documents", summary="List the tenant's documents, newest first", operation_id="listDocuments",
                response_model=S.DocumentList, responses=responses(401, 422))
    def list_documents(limit: int = limit_query(50), offset: int = OFFSET,
                       caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        limit = min(limit, settings.max_list_limit)
        with db.session() as s:
            rows = documents.list_documents(s, caller.scope, limit=limit, offset=offset)
            return {"object": "list", "data": [r.to_dict() for r in rows], "limit": limit, "offset": offset}

    @router.get("/v1/documents/{document_id}", summary="A stored document (without its text)",
                operation_id="getDocument", response_model=S.DocumentOut, responses=responses(401, 404, 422))
    def get_document(document_id: str = DocumentIdPath, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            row = _found(s, document_id, caller)
            return {**row.to_dict(), "jobs": documents.jobs_using(s, document_id)}

    @router.get("/v1/documents/{document_id}/text", summary="A stored document with its text",
                operation_id="getDocumentText", response_model=S.DocumentText, responses=responses(401, 404, 422))
    def get_document_text(document_id: str = DocumentIdPath, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            row = _found(s, document_id, caller)
            return {**row.to_dict(), "text": row.text}

    @router.delete("/v1/documents/{document_id}", summary="Delete a document no queued or running job asks about",
                   operation_id="deleteDocument", response_model=S.Deleted, responses=responses(401, 404, 409, 422))
    def delete_document(document_id: str = DocumentIdPath, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        with db.session() as s:
            try:
                done = documents.delete_document(s, document_id, tenant=caller.scope)
            except documents.DocumentInUse as e:
                raise ApiError(409, str(e), "conflict") from None
        if done is None:
            raise ApiError(404, f"no document {document_id}", "not_found")
        return {"id": document_id, "object": "document.deleted", "deleted": True, "jobs_deleted": 0}

    return router


def _parse_json(raw: bytes) -> tuple[str, str | None]:
    try:
        body = S.DocumentCreate.model_validate_json(raw)
    except ValidationError as e:
        raise from_validation(e) from None
    return body.text, body.filename


def _found(s, document_id: str, caller: Caller):
    row = documents.get_document(s, document_id, tenant=caller.scope)
    if row is None:
        raise ApiError(404, f"no document {document_id}", "not_found")
    return row


async def _read_form(request: Request) -> tuple[str, str | None]:
    try:
        form = await request.form(max_files=1, max_fields=2, max_part_size=1 << 20)
    except Exception as e:
        if getattr(e, "status_code", None) == 413:
            raise
        raise ApiError(400, f"bad multipart body: {str(e)[:200]}", "invalid_request") from None
    try:
        unknown = sorted(str(k)[:40] for k in set(form.keys()) - {"file"})
        if unknown:
            raise ApiError(422, f"unknown form field(s): {', '.join(unknown[:8])} (known: file)", "invalid_params")
        upload = form.get("file")
        if not isinstance(upload, UploadFile) or len(form.getlist("file")) > 1:
            raise ApiError(422, "file is required, once (a multipart file part)", "invalid_params")
        filename = check_field(upload.filename or "file", "the file name", S.Name)
        limit = limits.max_input_bytes()
        data = await upload.read(limit + 1)
        if len(data) > limit:
            raise ApiError(413, str(InputTooLarge(len(data), limit)), "too_large")
        try:
            return await run_in_threadpool(decode_document, data, name=filename), filename
        except InputError as e:
            raise ApiError(422, str(e), "invalid_input") from None
    finally:
        await form.close()


__all__ = ["documents_router"]
