"""`EvidenceKey`: the settings a specprefill job *actually runs* with, as mode auto matches them against
quality evidence (engine/policy/evidence.py, docs/quality.md "Evidence rows").

Resolved values, not the job's raw parameters: the effective scorer and window (a `windowed` job
whose document fits one window is one pass, the same pass as `full`), the positions after the
library probe (a stock llama-cpp-python runs `compressed` whatever the job asked), the score math
(the speculator's implementation: numpy or torch math on llama.cpp's forward, `torch-speculator` for
the PyTorch forward of EngineOptions.speculator_impl), the backend class. Models are named by the
sha256 of the whole file (a renamed copy of another GGUF is another model, a copy of the same file
under another name is the same); their names are labels only and never compared.

`first_difference(job, row)`: the first field (in `FIELDS` order) where a row's key is no evidence
for a job's: every field must be equal, except `keep`, where a job keeping at least the row's share
keeps the measured chunks too (max_keep, which caps kept tokens, must be equal: it is not capped by keep).

`prompt_shape`: native (document, then question, whole question protected), chat or completion
(engine/chat_prompt.py: what scoring may drop differs). Issue 47 item 5 refines chat/completion by
where the question was found; a new shape value then needs its own rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..options import DEFAULT_WINDOW, ONE_PASS_TOKENS, TASK_KINDS

#: the prompt shapes a key may name
PROMPT_SHAPES = ("native", "chat", "completion")
#: the backend classes a key may name
BACKENDS = ("cpu", "cuda")
#: a key's score_math when the PyTorch forward (scoring/torch_speculator.py) runs the speculator: recorded in
#: the existing field, so rows of llama.cpp's speculator (numpy or torch math) keep their keys and match as before
TORCH_SPECULATOR_KEY = "torch-speculator"
#: the score implementations a key may name
SCORE_MATHS = ("numpy", "torch", TORCH_SPECULATOR_KEY)
#: the sliding scorer's window when the job leaves it to us (scoring.SLIDING_WINDOW)
SLIDING_DEFAULT = 2048


@dataclass(frozen=True)
class EvidenceKey:
    """One set of resolved settings (module doc). Field order is the order `first_difference` checks."""

    target_sha256: str
    speculator_sha256: str
    backend: str  # cpu | cuda
    prompt_shape: str  # native | chat | completion
    task: Optional[str]  # the task kind (options.TASK_KINDS); a job's None = not declared (a row always names one)
    positions: str  # original | compressed, after the library probe
    #: the speculator's score implementation: numpy | torch (llama.cpp's forward, the score math on the host |
    #: the device) | torch-speculator (EngineOptions.speculator_impl torch: the PyTorch forward and its math)
    score_math: str
    scorer: str  # effective: full (one pass) | windowed | sliding
    window: int  # effective document tokens per window; 0 = one pass
    chunk_rule: str
    keep: float
    max_keep: int
    chunk: int
    lookahead: int
    pool: int
    selection: str
    pipelined: bool
    protect_tail: int  # chat/completion: RunParams.protect_tail; native: -1 (the whole question is protected)
    #: labels only (never compared): the models' names where the key was made
    target: str = dataclasses.field(default="", compare=False)
    speculator: str = dataclasses.field(default="", compare=False)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvidenceKey":
        """From `as_dict`'s shape; a missing or mistyped field raises ValueError naming it."""
        if not isinstance(data, dict):
            raise ValueError("key: must be an object")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.name in ("target", "speculator"):
                    continue
                raise ValueError(f"key.{f.name}: missing")
            v, want = data[f.name], FIELD_TYPES[f.name]
            if f.name == "task" and v is None:
                ok = True
            elif want is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                v = float(v) if ok else v
            elif want is int:
                ok = isinstance(v, int) and not isinstance(v, bool)
            else:
                ok = isinstance(v, want)
            if not ok:
                raise ValueError(f"key.{f.name}: bad value {v!r}")
            kwargs[f.name] = v
        key = cls(**kwargs)
        key.check()
        return key

    def check(self) -> None:
        """ValueError naming the first field out of its range."""
        if len(self.target_sha256) != 64 or len(self.speculator_sha256) != 64:
            raise ValueError(f"key.{'target_sha256' if len(self.target_sha256) != 64 else 'speculator_sha256'}: "
                             "must be a 64-hex-digit sha256")
        for name, choices in (("backend", BACKENDS), ("prompt_shape", PROMPT_SHAPES), ("positions", ("original", "compressed")),
                              ("score_math", SCORE_MATHS), ("scorer", ("full", "windowed", "sliding")),
                              ("chunk_rule", ("border", "mean", "scope", "block")), ("selection", ("global", "per-window"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"key.{name}: must be one of {', '.join(choices)}")
        if self.task is not None and self.task not in TASK_KINDS:
            raise ValueError(f"key.task: must be one of {', '.join(TASK_KINDS)}")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError("key.keep: must be in (0, 1]")
        for name, lo in (("max_keep", 0), ("chunk", 1), ("lookahead", 1), ("pool", 1), ("window", 0), ("protect_tail", -1)):
            if getattr(self, name) < lo:
                raise ValueError(f"key.{name}: must be >= {lo}")

    def describe(self, name: str) -> str:
        """`name=value` of one field, as a reason says it."""
        v = getattr(self, name)
        if name.endswith("sha256"):
            label = self.target if name.startswith("target") else self.speculator
            return f"{name}={v[:12]}…" + (f" ({label})" if label else "")
        if name == "window" and v == 0:
            return "window=one pass"
        return f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}"


FIELD_TYPES: dict[str, Any] = {
    "target_sha256": str, "speculator_sha256": str, "backend": str, "prompt_shape": str, "task": str,
    "positions": str, "score_math": str, "scorer": str, "window": int, "chunk_rule": str, "keep": float,
    "max_keep": int, "chunk": int, "lookahead": int, "pool": int, "selection": str, "pipelined": bool,
    "protect_tail": int, "target": str, "speculator": str,
}
#: the compared fields, in the order a job's key is checked against a row's
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EvidenceKey) if f.compare)


def first_difference(job: EvidenceKey, row: EvidenceKey) -> str | None:
    """The first field where `row` is no evidence for `job` (module doc), or None: it is."""
    for name in FIELDS:
        a, b = getattr(job, name), getattr(row, name)
        if name == "keep":
            if a < b:
                return name
        elif a != b:
            return name
    return None


def effective_scoring(scorer: str, window: int, n_doc: int, room: int) -> tuple[str, int]:
    """(scorer, window) as a job scores a document of `n_doc` tokens (scoring.SpecPrefillScorer.window_tokens
    and plan_windows): `windowed` with one window covering the document is one pass (`full`, 0); `room`: the
    document tokens one window of the speculator's context can hold."""
    if scorer == "full":
        return "full", 0
    if scorer == "sliding":
        return "sliding", window or SLIDING_DEFAULT
    if not window:
        window = n_doc if DEFAULT_WINDOW < n_doc <= min(ONE_PASS_TOKENS, room) else DEFAULT_WINDOW
    size = max(64, min(window, room))
    return ("full", 0) if size >= n_doc else ("windowed", size)


def model_sha256(path: str | Path) -> str:
    """sha256 of a model file: the registry's digest for a pulled model whose marker matches its size and
    mtime (models.py), else the whole file hashed once per process per (path, size, mtime)."""
    from .. import models
    from ..cache.speculator import file_sha256

    p = Path(path)
    for name in models.registry_names():
        try:
            st = models.model_status(name)
        except Exception:  # noqa: BLE001 - a broken registry entry is no reason not to hash the file
            continue
        if st.verified and st.path.resolve() == p.resolve():
            return st.spec.sha256
    return file_sha256(p)


__all__ = ["EvidenceKey", "FIELDS", "TORCH_SPECULATOR_KEY", "SCORE_MATHS", "PROMPT_SHAPES", "BACKENDS", "first_difference", "effective_scoring", "model_sha256"]
