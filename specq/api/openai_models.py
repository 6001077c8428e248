"""GET /v1/models: the models this API's workers serve, and the check of a request's `model`.

A model's id is its target's file name without `.gguf` (a registry name such as
`qwen2.5-coder-1.5b-instruct-q4_k_m`, or `target` for `/path/target.gguf`). The list holds the target
of every live worker consuming this API's queue (from their heartbeats, specq.monitor) with its
speculator, context and backend, the target this API is configured with (SPECQ_TARGET, else the
default) even before a worker runs, so requests can be queued for it, and each served-model alias
of that target (SPECQ_SERVED_MODEL_NAME) as a model of its own. Which names a request may use is
defined once, in specq/served_models.py; any other is a 404 `model_not_found`. Heartbeats are read
at most every CACHE_S seconds.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from fastapi import APIRouter, Depends

from ..served_models import model_id, parse_aliases, resolve
from ..settings import ServiceSettings
from ..storage.keys import Caller
from . import openai_schemas as O
from .errors import ApiError, responses

#: seconds a read of the workers' heartbeats is reused
CACHE_S = 2.0


class ModelCatalog:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._at = 0.0
        self._models: list[dict[str, Any]] = []
        #: alias -> the configured target's id
        self.aliases = {name: self.configured_id for name in parse_aliases(settings.served_model_name)}

    @property
    def configured_id(self) -> str:
        from ..engine.options import EngineOptions

        return model_id(self.settings.target or EngineOptions().target)

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
        configured = self.configured_id
        if configured not in found:
            found[configured] = {"id": configured, "object": "model", "created": 0, "owned_by": "specq",
                                 "speculator": model_id(self.settings.speculator or EngineOptions().speculator),
                                 "context": self.settings.n_ctx or None, "backend": None, "workers": 0}
        served = sorted(found.values(), key=lambda m: m["id"])
        aliases = [{**found[configured], "id": alias} for alias in self.aliases if alias not in found]
        return served + aliases

    def check(self, name: str) -> str:
        """The id of the served model `name` names (specq/served_models.py); 404 model_not_found otherwise."""
        models = self.models()
        served = [m["id"] for m in models if m["id"] not in self.aliases]
        return check_model(name, served, self.aliases, listed=[m["id"] for m in models])

    def entry(self, name: str) -> dict[str, Any]:
        """The /v1/models entry of `name` (a served id or alias); 404 model_not_found otherwise."""
        self.check(name)
        models = {m["id"]: m for m in self.models()}
        return models.get(name) or models[resolve(name, list(models), self.aliases)]


def check_model(name: str, ids: list[str], aliases: dict[str, str] | None = None, *,
                listed: list[str] | None = None) -> str:
    """The served id `name` names among `ids` (the served models; `aliases`: alias -> id), matched by
    specq/served_models.py; a 404 model_not_found naming what is served otherwise. `specq run-batch`
    checks its lines' `model` with it too."""
    found = resolve(name, ids, aliases)
    if found is not None:
        return found
    names = ", ".join(listed if listed is not None else ids)
    raise ApiError(404, f"The model `{name[:200]}` does not exist: this service serves {names} "
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
        return catalog.entry(model)

    return router


__all__ = ["ModelCatalog", "models_router", "check_model"]
