"""A small HTTP client of the specq API (used by `specq submit`, `status`, `result`, `jobs`, `cancel`).

It talks to the URL it is given (the CLI's `--url`), else ``SPECQ_API_URL``, else the URL the last
`specq up` on this machine's ``$SPECQ_HOME`` recorded in ``$SPECQ_HOME/up.url`` (so a service started
with `specq up --port 8391` is the one the CLI finds, not somebody else's on the default port), else
``http://127.0.0.1:8178``; it sends ``Authorization: Bearer $SPECQ_API_KEY`` when that is set. Every failure is an `ApiError` whose message
is one line a user can act on; nothing listening at the URL is `ApiUnavailable`.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import httpx

from .ascii_numbers import ascii_int
from .contracts import BATCH_TERMINAL, JOB_TERMINAL
from .settings import DEFAULT_API_HOST, DEFAULT_API_PORT

DEFAULT_API_URL = f"http://{DEFAULT_API_HOST}:{DEFAULT_API_PORT}"
TERMINAL = JOB_TERMINAL
#: the file under $SPECQ_HOME where `specq up` records the URL of the API it runs
UP_URL_FILE = "up.url"


def up_url_path() -> Path:
    from .config import specq_home

    return specq_home() / UP_URL_FILE


def recorded_url() -> str | None:
    """The URL the last `specq up` recorded under $SPECQ_HOME, or None."""
    try:
        text = up_url_path().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text.splitlines()[0].strip() if text else None


def api_url_source() -> tuple[str, str]:
    """(the API URL, where it came from): SPECQ_API_URL, else what `specq up` recorded, else the default."""
    env = os.environ.get("SPECQ_API_URL", "").strip()
    if env:
        return env.rstrip("/"), "SPECQ_API_URL"
    recorded = recorded_url()
    if recorded:
        return recorded.rstrip("/"), f"recorded by `specq up` in {up_url_path()}"
    return DEFAULT_API_URL, "the default"


def api_url() -> str:
    return api_url_source()[0]


class ApiError(Exception):
    """The API answered with an error (status >= 400) or the request failed; `str()` is one line."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ApiUnavailable(ApiError):
    """Nothing answers at the API URL."""


class Client:
    """One connection pool to the API. Ids go into paths percent-encoded (`/v1/jobs/..%2Fmetrics`),
    never as path syntax. A GET answered 429 (or 503 with `Retry-After`) is retried after the
    server's `Retry-After` (seconds or an HTTP date; at most `RETRY_WAIT_MAX` s each, `RETRIES`
    times); a POST or DELETE is not retried (its error says when to retry)."""

    RETRIES = 5
    RETRY_WAIT_MAX = 30.0

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 60.0) -> None:
        url, self.url_source = (url, "--url") if url else api_url_source()
        self.url = url.rstrip("/")
        if not self.url.lower().startswith(("http://", "https://")):
            raise ApiError(f"the API URL {self.url!r} must start with http:// or https:// ({self._where()})")
        key = os.environ.get("SPECQ_API_KEY", "").strip() if api_key is None else api_key
        if key and not _KEY_CHARS.fullmatch(key):
            raise ApiError("SPECQ_API_KEY holds characters no key has (non-ASCII, spaces or control characters; "
                           "keys are sk-specq-… in plain ASCII): was a quote or dash pasted with it?")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        except (httpx.InvalidURL, ValueError) as e:  # a malformed SPECQ_API_URL (bad port, IDNA, …)
            raise ApiError(f"bad API URL {self.url!r} ({self._where()}): {e}") from None
        self._sleep = time.sleep

    def close(self) -> None:
        self._http.close()

    def _where(self) -> str:
        return "SPECQ_API_URL" if self.url_source == "the default" else self.url_source

    def unavailable(self) -> str:
        """The message of ApiUnavailable: nothing answers at the URL, and where that URL came from."""
        if self.url_source in ("SPECQ_API_URL", "the default"):
            return f"no specq API at {self.url}: start it with `specq up` (or set SPECQ_API_URL)"
        return (f"no specq API at {self.url} ({self.url_source}): start it with `specq up`, or give --url or "
                "SPECQ_API_URL")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The response to one request (retried as the class docstring says); ApiError for any
        failure or status >= 400."""
        for attempt in range(self.RETRIES + 1):
            try:
                r = self._http.request(method, path, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                raise ApiUnavailable(self.unavailable()) from e
            except (httpx.HTTPError, httpx.InvalidURL) as e:
                raise ApiError(f"request to {self.url}{path} failed: {type(e).__name__}: {e}") from e
            except UnicodeEncodeError as e:  # an id, name or question from argv with bytes that are not UTF-8
                bad = e.object[e.start:e.end] if isinstance(e.object, str) else ""
                raise ApiError(f"{bad!r} in a value of this request is not UTF-8 text (undecodable bytes in "
                               "an argument?)") from None
            wait = retry_after(r)
            retry = method == "GET" and (r.status_code == 429 or (r.status_code == 503 and wait is not None))
            if not retry or attempt == self.RETRIES or (wait or 0) > self.RETRY_WAIT_MAX:
                break
            self._sleep(1.0 if wait is None else wait)
        if r.status_code >= 400:
            later = f"; retry after {wait:g} s" if r.status_code in (429, 503) and wait is not None else ""
            raise ApiError(f"{_error_message(r)} (HTTP {r.status_code}{later})", r.status_code)
        return r

    def request(self, method: str, path: str, *, expect: tuple[str, ...] = (), **kwargs: Any) -> Any:
        """The JSON body of `send(...)`; with `expect`, an object that has those keys (else ApiError:
        the URL is not a specq API, and the CLI would fail on a missing field)."""
        r = self.send(method, path, **kwargs)
        try:
            body = r.json()
        except ValueError:
            raise ApiError(f"{self.url}{path} answered HTTP {r.status_code} with non-JSON: is it a specq API?") from None
        except RecursionError:
            raise ApiError(f"{self.url}{path} answered JSON nested too deeply to read") from None
        if expect and not (isinstance(body, dict) and all(k in body for k in expect)):
            raise ApiError(f"{self.url}{path} answered JSON without {', '.join(expect)}: is it a specq API?")
        return body

    # --- jobs -------------------------------------------------------------------------------------------
    def submit_file(self, path: Path, question: str | None = None, params: dict[str, Any] | None = None) -> dict:
        return self.submit_bytes(Path(path).name, Path(path).read_bytes(), question=question, params=params)

    def submit_bytes(self, filename: str, data: bytes, question: str | None = None,
                     params: dict[str, Any] | None = None) -> dict:
        """One job of a document's bytes (uploaded as the file `filename`)."""
        form: dict[str, str] = {"params": json.dumps(params or {})}
        if question is not None:
            form["question"] = question
        files = {"file": (filename, data, "application/octet-stream")}
        return self.request("POST", "/v1/jobs", data=form, files=files, expect=_JOB)

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{path_id(job_id)}", expect=_JOB)

    # --- documents --------------------------------------------------------------------------------------
    def create_document(self, filename: str, data: bytes) -> dict:
        """Store a document (its bytes uploaded as the file `filename`); the same text again gives the
        same id (`created` false)."""
        files = {"file": (filename, data, "application/octet-stream")}
        return self.request("POST", "/v1/documents", files=files, expect=("id", "sha256"))

    def document(self, document_id: str) -> dict:
        return self.request("GET", f"/v1/documents/{path_id(document_id)}", expect=("id", "sha256"))

    def delete_document(self, document_id: str) -> dict:
        return self.request("DELETE", f"/v1/documents/{path_id(document_id)}", expect=("id",))

    def submit_document_job(self, document_id: str, question: str | None = None,
                            params: dict[str, Any] | None = None) -> dict:
        """One job asking `question` about a stored document."""
        body: dict[str, Any] = {"document_id": document_id, "params": params or {}}
        if question is not None:
            body["question"] = question
        return self.request("POST", "/v1/jobs", json=body, expect=_JOB)

    def jobs(self, status: str | None = None, limit: int = 50, offset: int = 0) -> dict:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        return self.request("GET", "/v1/jobs", params=params, expect=_LIST)

    def cancel(self, job_id: str) -> dict:
        return self.request("DELETE", f"/v1/jobs/{path_id(job_id)}", expect=_JOB)

    def health(self) -> dict:
        return self.request("GET", "/healthz")

    # --- batches ----------------------------------------------------------------------------------------
    def submit_batch_files(self, paths: list[Path], question: str | None = None, params: dict[str, Any] | None = None,
                           metadata: dict[str, Any] | None = None, names: list[str] | None = None,
                           contents: list[bytes] | None = None) -> dict:
        """One batch of documents (custom_id = each file's name as given in `names`, default the paths;
        `contents`, when given, are their bytes instead of the files' own)."""
        form: dict[str, str] = {"params": json.dumps(params or {})}
        if question is not None:
            form["question"] = question
        if metadata:
            form["metadata"] = json.dumps(metadata)
        names = names or [str(p) for p in paths]
        contents = contents if contents is not None else [Path(p).read_bytes() for p in paths]
        files = [("file", (name, data, "application/octet-stream")) for name, data in zip(names, contents)]
        return self.request("POST", "/v1/batches", data=form, files=files, expect=_BATCH)

    def submit_batch_jsonl(self, path: Path, params: dict[str, Any] | None = None, question: str | None = None,
                           metadata: dict[str, Any] | None = None, content: bytes | None = None) -> dict:
        """One batch of a JSONL file (`content`, when given, is its bytes instead of the file's own)."""
        form: dict[str, str] = {"params": json.dumps(params or {})}
        if question is not None:
            form["question"] = question
        if metadata:
            form["metadata"] = json.dumps(metadata)
        data = Path(path).read_bytes() if content is None else content
        files = [("input", (Path(path).name, data, "application/jsonl"))]
        return self.request("POST", "/v1/batches", data=form, files=files, expect=_BATCH)

    def batch(self, batch_id: str) -> dict:
        return self.request("GET", f"/v1/batches/{path_id(batch_id)}", expect=_BATCH)

    def batches(self, status: str | None = None, name: str | None = None, limit: int = 20, offset: int = 0) -> dict:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        if name:
            params["name"] = name
        return self.request("GET", "/v1/batches", params=params, expect=_LIST)

    def resolve_batch(self, ref: str) -> dict:
        """A batch by id (`batch_…`) or by name (the newest batch submitted with `--batch NAME`)."""
        if ref.startswith("batch_"):
            return self.batch(ref)
        page = self.batches(name=ref, limit=1)
        if not page["data"]:
            raise ApiError(f"no batch {ref!r} (neither an id nor the name of a batch)", 404)
        return page["data"][0]

    def cancel_batch(self, batch_id: str) -> dict:
        return self.request("POST", f"/v1/batches/{path_id(batch_id)}/cancel", expect=_BATCH)

    def batch_stats(self, batch_id: str) -> dict:
        return self.request("GET", f"/v1/batches/{path_id(batch_id)}/stats",
                            expect=("batch_id", "status", "request_counts", "phases"))

    def batch_export(self, batch_id: str, what: str = "results", fmt: str = "jsonl") -> str:
        """The text of /results (jsonl or csv) or /errors (jsonl)."""
        params = {"format": fmt} if what == "results" else {}
        return self.send("GET", f"/v1/batches/{path_id(batch_id)}/{what}", params=params).text

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
            with self._http.stream("GET", f"/v1/jobs/{path_id(job_id)}/events",
                                   timeout=httpx.Timeout(30.0, read=timeout)) as r:
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
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise ApiUnavailable(self.unavailable()) from e
        except httpx.HTTPError as e:
            raise ApiError(f"the event stream of {job_id} broke: {type(e).__name__}: {e}") from e

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


#: the keys the CLI reads of a job, a list and a batch object
_JOB = ("id", "status")
_LIST = ("data",)
_BATCH = ("id", "status", "request_counts")
#: what an API key can hold: printable ASCII, no spaces (a header value must be ASCII)
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")


def path_id(value: str) -> str:
    """`value` as one percent-encoded path segment; ApiError for one that cannot name anything
    ("", ".", "..": an HTTP client resolves those as path syntax)."""
    if value in ("", ".", ".."):
        raise ApiError(f"{value!r} is not an id")
    try:
        return quote(value, safe="")
    except UnicodeEncodeError:
        raise ApiError(f"{value!r} is not an id (it holds bytes that are not UTF-8)") from None


def retry_after(r: httpx.Response) -> float | None:
    """The seconds of a `Retry-After` header (delta-seconds or an HTTP date), or None."""
    raw = r.headers.get("retry-after", "").strip()
    if not raw:
        return None
    seconds = ascii_int(raw, max_digits=9)  # a proxy's `Retry-After: ²` is no number (int('²') raises)
    if seconds is not None:
        return float(seconds)
    if not raw.isascii():
        return None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _error_message(r: httpx.Response) -> str:
    """The API's one-line error message, or for an answer that is not specq's JSON error (a proxy's
    HTML page, another server), the status's reason phrase saying so."""
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return f"{r.reason_phrase or 'error'} (not a specq API error: is {r.url.copy_with(path='/', query=None)} a specq API?)"


def progress_text(job: dict) -> str:
    """`decode 12/64 tokens`, `score 3/8 windows`, `sparse_prefill 2,048/4,096 tokens`, `queued`, … for a
    job dict (the API's phase names)."""
    status = job.get("status")
    p = job.get("progress") or {}
    phase = p.get("phase")
    if status != "running" or not phase:
        return str(status)
    done, total = p.get("done") or 0, p.get("total") or 0
    unit = {"score": " windows", "decode": " tokens", "sparse_prefill": " tokens"}.get(phase, "")
    return f"{phase} {done:,}/{total:,}{unit}" if isinstance(total, int) and total > 1 else phase


__all__ = ["Client", "ApiError", "ApiUnavailable", "api_url", "api_url_source", "recorded_url", "up_url_path",
           "UP_URL_FILE", "path_id", "retry_after", "progress_text", "TERMINAL",
           "BATCH_TERMINAL", "DEFAULT_API_URL"]
