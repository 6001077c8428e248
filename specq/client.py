"""A small HTTP client of the specq API (used by `specq submit`, `status`, `result`, `jobs`, `cancel`).

It talks to ``SPECQ_API_URL`` (default ``http://127.0.0.1:8178``, where `specq up` listens) and sends
``Authorization: Bearer $SPECQ_API_KEY`` when that is set. Every failure is an `ApiError` whose message
is one line a user can act on; nothing listening at the URL is `ApiUnavailable`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from .settings import DEFAULT_API_HOST, DEFAULT_API_PORT

DEFAULT_API_URL = f"http://{DEFAULT_API_HOST}:{DEFAULT_API_PORT}"
TERMINAL = ("succeeded", "failed", "cancelled")
BATCH_TERMINAL = ("completed", "failed", "expired", "cancelled")


def api_url() -> str:
    return (os.environ.get("SPECQ_API_URL", "").strip() or DEFAULT_API_URL).rstrip("/")


class ApiError(Exception):
    """The API answered with an error (status >= 400) or the request failed; `str()` is one line."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ApiUnavailable(ApiError):
    """Nothing answers at the API URL."""


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 60.0) -> None:
        self.url = (url or api_url()).rstrip("/")
        key = os.environ.get("SPECQ_API_KEY", "").strip() if api_key is None else api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _transport_error(self, e: httpx.HTTPError, what: str) -> ApiError:
        """Nothing listening (ApiUnavailable), or another transport failure of `what`."""
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            return ApiUnavailable(f"no specq API at {self.url}: start it with `specq up` (or set SPECQ_API_URL)")
        return ApiError(f"{what} failed: {type(e).__name__}: {e}")

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise self._transport_error(e, f"request to {self.url}{path}") from e
        if r.status_code >= 400:
            raise ApiError(f"{_error_message(r)} (HTTP {r.status_code})", r.status_code)
        try:
            return r.json()
        except ValueError:
            raise ApiError(f"{self.url}{path} answered HTTP {r.status_code} with non-JSON: is it a specq API?") from None

    # --- jobs -------------------------------------------------------------------------------------------
    def submit_file(self, path: Path, question: str | None = None, params: dict[str, Any] | None = None) -> dict:
        data = Path(path).read_bytes()
        form: dict[str, str] = {"params": json.dumps(params or {})}
        if question is not None:
            form["question"] = question
        files = {"file": (Path(path).name, data, "application/octet-stream")}
        return self.request("POST", "/v1/jobs", data=form, files=files)

    def submit_text(self, text: str, question: str | None = None, params: dict[str, Any] | None = None,
                    filename: str | None = None) -> dict:
        body: dict[str, Any] = {"text": text, "params": params or {}}
        if question is not None:
            body["question"] = question
        if filename is not None:
            body["filename"] = filename
        return self.request("POST", "/v1/jobs", json=body)

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def jobs(self, status: str | None = None, limit: int = 50, offset: int = 0) -> dict:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        return self.request("GET", "/v1/jobs", params=params)

    def cancel(self, job_id: str) -> dict:
        return self.request("DELETE", f"/v1/jobs/{job_id}")

    def health(self) -> dict:
        return self.request("GET", "/healthz")

    # --- batches ----------------------------------------------------------------------------------------
    def submit_batch_files(self, paths: list[Path], question: str | None = None, params: dict[str, Any] | None = None,
                           metadata: dict[str, Any] | None = None, names: list[str] | None = None) -> dict:
        """One batch of documents (custom_id = each file's name as given in `names`, default the paths)."""
        form: dict[str, str] = {"params": json.dumps(params or {})}
        if question is not None:
            form["question"] = question
        if metadata:
            form["metadata"] = json.dumps(metadata)
        names = names or [str(p) for p in paths]
        files = [("file", (name, Path(p).read_bytes(), "application/octet-stream")) for name, p in zip(names, paths)]
        return self.request("POST", "/v1/batches", data=form, files=files)

    def submit_batch_jsonl(self, path: Path, params: dict[str, Any] | None = None, question: str | None = None,
                           metadata: dict[str, Any] | None = None) -> dict:
        form: dict[str, str] = {"params": json.dumps(params or {})}
        if question is not None:
            form["question"] = question
        if metadata:
            form["metadata"] = json.dumps(metadata)
        files = [("input", (Path(path).name, Path(path).read_bytes(), "application/jsonl"))]
        return self.request("POST", "/v1/batches", data=form, files=files)

    def batch(self, batch_id: str) -> dict:
        return self.request("GET", f"/v1/batches/{batch_id}")

    def batches(self, status: str | None = None, name: str | None = None, limit: int = 20, offset: int = 0) -> dict:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        if name:
            params["name"] = name
        return self.request("GET", "/v1/batches", params=params)

    def resolve_batch(self, ref: str) -> dict:
        """A batch by id (`batch_…`) or by name (the newest batch submitted with `--batch NAME`)."""
        if ref.startswith("batch_"):
            return self.batch(ref)
        page = self.batches(name=ref, limit=1)
        if not page["data"]:
            raise ApiError(f"no batch {ref!r} (neither an id nor the name of a batch)", 404)
        return page["data"][0]

    def cancel_batch(self, batch_id: str) -> dict:
        return self.request("POST", f"/v1/batches/{batch_id}/cancel")

    def batch_stats(self, batch_id: str) -> dict:
        return self.request("GET", f"/v1/batches/{batch_id}/stats")

    def batch_export(self, batch_id: str, what: str = "results", fmt: str = "jsonl") -> str:
        """The text of /results (jsonl or csv) or /errors (jsonl)."""
        params = {"format": fmt} if what == "results" else {}
        try:
            r = self._http.get(f"/v1/batches/{batch_id}/{what}", params=params)
        except httpx.HTTPError as e:
            raise self._transport_error(e, f"request to {self.url}") from e
        if r.status_code >= 400:
            raise ApiError(f"{_error_message(r)} (HTTP {r.status_code})", r.status_code)
        return r.text

    def wait_batch(self, batch_id: str, on_update: Callable[[dict], None] | None = None, interval: float = 0.5,
                   timeout: float | None = None) -> dict:
        """Poll until the batch is completed, failed, expired or cancelled; return its last state."""
        t_end = time.monotonic() + timeout if timeout else None
        while True:
            batch = self.batch(batch_id)
            if on_update is not None:
                on_update(batch)
            if batch["status"] in BATCH_TERMINAL:
                return batch
            if t_end is not None and time.monotonic() > t_end:
                raise ApiError(f"batch {batch_id} still {batch['status']} after {timeout:g}s")
            time.sleep(interval)

    def events(self, job_id: str, timeout: float | None = None):
        """The job's events (GET /v1/jobs/{id}/events) as (event, data) pairs, until `done`."""
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(30.0, read=timeout)) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ApiError(f"{_error_message(r)} (HTTP {r.status_code})", r.status_code)
                event, data = "message", []
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line and data:
                        yield event, json.loads("\n".join(data))
                        if event == "done":
                            return
                        event, data = "message", []
        except httpx.HTTPError as e:
            raise self._transport_error(e, f"the event stream of {job_id}") from e

    def wait(self, job_id: str, on_update: Callable[[dict], None] | None = None, interval: float = 0.2,
             timeout: float | None = None) -> dict:
        """Poll until the job is succeeded, failed or cancelled; return its last state."""
        t_end = time.monotonic() + timeout if timeout else None
        while True:
            job = self.job(job_id)
            if on_update is not None:
                on_update(job)
            if job["status"] in TERMINAL:
                return job
            if t_end is not None and time.monotonic() > t_end:
                raise ApiError(f"job {job_id} still {job['status']} after {timeout:g}s")
            time.sleep(interval)


def _error_message(r: httpx.Response) -> str:
    try:
        body = r.json()
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        text = r.text.strip().splitlines()
        return text[0][:200] if text else r.reason_phrase


def progress_text(job: dict) -> str:
    """`decode 12/64`, `score window 3/8`, `queued`, … for a job dict."""
    status = job.get("status")
    p = job.get("progress") or {}
    phase = p.get("phase")
    if status != "running" or not phase:
        return str(status)
    done, total = p.get("done") or 0, p.get("total") or 0
    unit = {"score": "window ", "decode": "token "}.get(phase, "")
    return f"{phase} {unit}{done}/{total}" if total > 1 else phase


__all__ = ["Client", "ApiError", "ApiUnavailable", "api_url", "progress_text", "TERMINAL", "BATCH_TERMINAL",
           "DEFAULT_API_URL"]
