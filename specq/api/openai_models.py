"""GET /v1/models: the models this API's workers serve, and the check of a request's `model`.

A model's id is its target's file name without `.gguf` (a registry name such as
`qwen2.5-coder-1.5b-instruct-q4_k_m`, or `target` for `/path/target.gguf`). The list holds the target
of every live worker consuming this API's queue (from their heartbeats, specq.monitor) with its
speculator, context and backend, and the target this API is configured with (SPECQ_TARGET, else the
default) even before a worker runs, so requests can be queued for it. A request naming another
model is a 404 `model_not_found`. Heartbeats are read at most every CACHE_S seconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, Depends

from ..settings import ServiceSettings
from ..storage.keys import Caller
from . import openai_schemas as O
from .errors import ApiError, responses

#: seconds a read of the workers' heartbeats is reused
CACHE_S = 2.0


def model_id(name: str) -> str:
    base = Path(name).name
    return base[:-5] if base.endswith(".gguf") else base


class ModelCatalog:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._at = 0.0
        self._models: list[dict[str, Any]] = []

    def models(self) -> list[dict[str, Any]]:
        if time.monotonic() - self._at > CACHE_S:
            self._models = self._read()
            self._at = time.monotonic()
        return self._models

    def _read(self) -> list[dict[str, Any]]:
        from ..engine.options import EngineOptions
        from ..monitor import read_heartbeats

        try:
            beats = [b for b in read_heartbeats(self.settings) if b.get("queue") in (None, self.settings.queue)]
        except Exception:  # the broker is unreachable: the configured model is still listed
            beats = []
        found: dict[str, dict[str, Any]] = {}
        for b in beats:
            mid = model_id(str(b.get("target") or ""))
            if not mid:
                continue
            m = found.setdefault(mid, {"id": mid, "object": "model", "created": int(b.get("started_at") or 0),
                                       "owned_by": "specq", "speculator": model_id(str(b.get("speculator") or "")) or None,
                                       "context": int(b.get("n_ctx") or 0) or None, "backend": b.get("backend"),
                                       "workers": 0})
            m["workers"] += 1
            m["created"] = min(m["created"], int(b.get("started_at") or m["created"]))
        configured = model_id(self.settings.target or EngineOptions().target)
        if configured not in found:
            found[configured] = {"id": configured, "object": "model", "created": 0, "owned_by": "specq",
                                 "speculator": model_id(self.settings.speculator or EngineOptions().speculator),
                                 "context": self.settings.n_ctx or None, "backend": None, "workers": 0}
        return sorted(found.values(), key=lambda m: m["id"])

    def check(self, name: str) -> str:
        """`name` if this service serves it; a 404 model_not_found otherwise."""
        return check_model(name, [m["id"] for m in self.models()])


def check_model(name: str, ids: list[str]) -> str:
    """The id `name` asks for if it is one of `ids` (the served models); a 404 model_not_found
    otherwise. `specq run-batch` checks its lines' `model` with it too."""
    if name in ids or model_id(name) in ids:
        return model_id(name)
    raise ApiError(404, f"The model `{name[:200]}` does not exist: this service serves {', '.join(ids)} "
                        "(GET /v1/models)", "invalid_request_error", param="model", code="model_not_found")


def models_router(catalog: ModelCatalog, caller_of: Callable[..., Caller]) -> APIRouter:
    router = APIRouter(tags=["openai"])

    @router.get("/v1/models", summary="The models the workers serve (OpenAI format)", operation_id="listModels",
                response_model=O.ModelList, responses=responses(401))
    def list_models(caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        return {"object": "list", "data": catalog.models()}

    @router.get("/v1/models/{model}", summary="One model", operation_id="getModel", response_model=O.ModelObject,
                responses=responses(401, 404))
    def get_model(model: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        mid = catalog.check(model)
        return next(m for m in catalog.models() if m["id"] == mid)

    return router


__all__ = ["ModelCatalog", "models_router", "model_id", "check_model"]
