"""Mode auto's quality evidence over HTTP (engine/policy/evidence.py, docs/quality.md "Evidence rows").

    GET  /v1/evidence   every row (shipped with the package, and the store's), each with `origin`,
                        `in_use` (what workers read: a stored row supersedes a shipped one of the same
                        in_sample and certified flags and the same
                        key, metric, arm and length only with at least as many documents), `passes` and
                        why not (`fails`), and its shadow checks (`shadow`: n, agreed, the agreement's
                        lower bound, whether it disables the row: engine/policy/shadow.py); `version`:
                        the store's revision, which workers watch
    POST /v1/evidence   admin only: one row (the GET's row shape; derived values are recomputed). A
                        malformed row is refused with 400 naming the field; a `bound` above what its
                        per-document counts give, or `passes: true` for a row that does not pass, is
                        refused too (a row never widens a band beyond its data). 201 with the stored row.

Workers load the rows at start and again when `version` changes (checked at claim time), without a restart.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..engine.policy import shadow
from ..engine.policy.evidence import listing, row_from_dict, shipped_rows
from ..storage import db, evidence as store, shadow as shadow_store
from ..storage.keys import Caller
from .auth import admin_only
from .errors import ApiError, responses

#: the largest row body accepted (per-document counts of a few thousand documents)
MAX_ROW_BYTES = 1 << 20


def evidence_listing() -> dict[str, Any]:
    with db.session() as s:
        stored, version = store.list_rows(s), store.version(s)
        checks = shadow.parse_keys(shadow_store.by_key(s))
    return {"object": "list", "data": shadow.annotate(listing(shipped_rows(), stored)[1], checks), "version": version}


def evidence_router(caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["evidence"])

    @router.get("/v1/evidence", summary="Quality evidence rows mode auto reads", operation_id="listEvidence",
                responses=responses(401))
    async def list_evidence(caller: Caller = Depends(caller_of)) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(evidence_listing))

    @router.post("/v1/evidence", status_code=201, summary="Add a quality evidence row (admin)",
                 operation_id="createEvidence", responses=responses(400, 401, 403, 413))
    async def create_evidence(request: Request, caller: Caller = Depends(admin_only(caller_of))) -> JSONResponse:
        body = await request.body()
        if len(body) > MAX_ROW_BYTES:
            raise ApiError(413, f"an evidence row is at most {MAX_ROW_BYTES} bytes")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the body must be one evidence row as a JSON object") from None
        try:
            row = row_from_dict(data)
        except ValueError as e:
            field = str(e).split(":", 1)[0]
            raise ApiError(400, f"evidence row: {e}", param=field) from None

        def save() -> dict[str, Any]:
            with db.session() as s:
                rec = store.add_row(s, row.as_dict())
                return {**store.to_row(rec), "passes": row.passes, "fails": row.fails_bar(), "origin": "store"}

        return JSONResponse(await run_in_threadpool(save), status_code=201)

    return router


__all__ = ["evidence_router", "evidence_listing"]
