"""The answer to a path no route serves: OpenAI-shaped, saying what specq does not serve.

An OpenAI client pointed at specq (`base_url=…/v1`) may call an API specq has not got —
`/v1/embeddings`, `/v1/responses`, images, audio, … A bare `Not Found` reads like a wrong URL; this
404 names the OpenAI API asked for, says specq does not serve it and lists what it does serve, in
OpenAI's error shape (`type` invalid_request_error, `code` unsupported_endpoint) so the SDKs raise
`NotFoundError` with that message. Any other unknown path gets the same shape with code
`unknown_url`. Only paths no route matches come here: a route's own 404 (no such job) is unchanged.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from .errors import error_response

#: OpenAI's APIs specq does not serve: the first path segment after /v1/, and what a reader calls it
UNSERVED = {
    "embeddings": "embeddings",
    "responses": "the Responses API",
    "moderations": "moderations",
    "images": "image generation",
    "audio": "audio (speech, transcription, translation)",
    "fine_tuning": "fine-tuning",
    "fine-tunes": "fine-tuning",
    "assistants": "the Assistants API",
    "threads": "the Assistants API (threads)",
    "vector_stores": "vector stores",
    "uploads": "multi-part uploads",
    "realtime": "the Realtime API",
    "evals": "evals",
    "containers": "containers",
    "conversations": "conversations",
    "videos": "video generation",
}
#: what specq does serve, for the message
SERVED = "/v1/chat/completions, /v1/completions, /v1/models, /v1/files, /v1/batches (and specq's own /v1/jobs)"


def unserved_response(method: str, path: str) -> JSONResponse:
    """The 404 of `method path`, which no route serves (module doc)."""
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "v1" and parts[1] in UNSERVED:
        return error_response(404, f"specq does not serve {UNSERVED[parts[1]]} ({method} {path}); it serves {SERVED}",
                              "invalid_request_error", param=None, code="unsupported_endpoint")
    return error_response(404, f"no such URL: {method} {path} (specq serves {SERVED}; /docs lists every route)",
                          "invalid_request_error", param=None, code="unknown_url")


__all__ = ["unserved_response", "UNSERVED"]
