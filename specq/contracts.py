"""The names every layer shares: phase names, job and batch statuses, error types, stream keys.

Engine, storage, worker, API and CLI all import this module and nothing here imports any of them, so
storage never needs the engine to know what a phase or an input error is.
"""

from __future__ import annotations

# --- phases ---------------------------------------------------------------------------------------
#: phases every run reports (0.0 when a phase did not run, e.g. `score` in baseline mode)
CORE_PHASES = ("tokenize", "score", "select", "sparse_prefill", "ttft", "decode", "total")
#: sub-phases of `score` reported by specprefill runs
SCORE_PHASES = ("speculator_prefill", "lookahead", "score_math")
#: saved KV restored from the engine's caches (speculator windows, the target's prompt prefix); every
#: run reports it (0.0 when nothing was restored)
CACHE_PHASES = ("cache_restore",)

# --- a running job's text stream on Redis ----------------------------------------------------------


def redis_keys(job_id: str) -> tuple[str, str, str]:
    """(channel, text key, attempt key) of a job's stream on Redis: the worker publishes there
    (worker/stream.py), the API's SSE reads there (api/job_stream.py)."""
    base = f"specq:job:{job_id}"
    return f"{base}:events", f"{base}:text", f"{base}:attempt"


# --- statuses -------------------------------------------------------------------------------------
JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
#: statuses a job never leaves
JOB_TERMINAL = ("succeeded", "failed", "cancelled")
#: what a job holds: a document and a question (native), chat messages, a raw completion prompt, or one question
#: of a calibration (POST /v1/calibrations: its three passes, storage/calibrations.py)
JOB_KINDS = ("job", "chat", "completion", "calibration")
#: claim priorities (lowest first): interactive requests, batch requests, then calibration units, which run
#: only when no other job of the queue is ready
PRIORITY_INTERACTIVE, PRIORITY_BATCH, PRIORITY_CALIBRATION = 0, 1, 9
BATCH_STATUSES = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
)
BATCH_TERMINAL = ("completed", "failed", "expired", "cancelled")


# --- errors (each message is one line a user can act on) -------------------------------------------
class EngineError(Exception):
    """A run could not be done; the message says why (shown to users as is)."""


class InputError(EngineError):
    """The input itself is bad (empty, binary, too long for the context, bad option): retrying won't help."""


class ContextLengthExceeded(InputError):
    """The prompt, with max_tokens, does not fit the target's context (OpenAI's error code
    `context_length_exceeded`, which LiteLLM and LangChain look for). Its message always holds
    CONTEXT_LENGTH_MARK, so a failed job's stored one-line error says which failure it was."""

    def __init__(self, prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens; with max_tokens {max_tokens} it "
                         f"{CONTEXT_LENGTH_MARK} of {n_ctx} tokens (the model's maximum context length here)")


#: the words every ContextLengthExceeded message holds (`is_context_length_error`)
CONTEXT_LENGTH_MARK = "exceeds the target's context"


def is_context_length_error(message: str | None) -> bool:
    """Whether a job's stored error is a ContextLengthExceeded's."""
    return bool(message) and CONTEXT_LENGTH_MARK in message


class ModelError(EngineError):
    """A model file is missing, unreadable, or does not fit with its partner."""


class DecodeError(EngineError):
    """llama_decode returned non-zero: the message holds its return code and llama.cpp's last log line."""


class RunCancelled(EngineError):
    """The run was cancelled: raised by a progress callback between phases, windows and tokens, or by
    an aborted llama_decode (engine/llama/stop.py)."""


class JobTimeLimit(RunCancelled):
    """The run went past its deadline (the worker's SPECQ_TIME_LIMIT): engine/llama/stop.py."""


class Fenced(RunCancelled):
    """A job write matched no row: the job is no longer (job id, this attempt's token, running).

    The reconciler requeued or failed the job, or another worker claimed it since this worker's claim
    (each claim and each reconciler transition changes `jobs.attempt_token`). The storage functions a
    worker writes with raise it; the worker then stops its run at once and writes nothing more about
    the job (docs/reliability.md, "A job runs on one worker at a time"). A RunCancelled, so a progress
    callback that raises it ends the engine's run like a cancel."""


class Drained(RunCancelled):
    """The worker is shutting down (SIGTERM): the job was not started, or not finished within the
    grace period (SPECQ_DRAIN_GRACE); it goes back to the queue."""


__all__ = [
    "Drained",
    "CORE_PHASES", "SCORE_PHASES", "CACHE_PHASES", "JOB_KINDS", "PRIORITY_INTERACTIVE", "PRIORITY_BATCH", "PRIORITY_CALIBRATION", "JOB_STATUSES", "JOB_TERMINAL", "BATCH_STATUSES", "BATCH_TERMINAL",
    "EngineError", "InputError", "ContextLengthExceeded", "CONTEXT_LENGTH_MARK", "is_context_length_error", "ModelError",
    "DecodeError", "RunCancelled", "JobTimeLimit", "Fenced", "redis_keys",
]
