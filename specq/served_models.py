"""Which `model` names name a served model: the one definition the API (chat, completions, batch
lines, GET /v1/models/{model}) and the CLI use.

A served model answers to exactly these names, compared whole (no path parts, no case folding):

* its id: the target's file name without `.gguf` (a registry name such as
  `qwen2.5-coder-1.5b-instruct-q4_k_m`, or `target` for `/path/target.gguf`);
* that file name with `.gguf`;
* for the target this service is configured with, the names of SPECQ_SERVED_MODEL_NAME
  (comma-separated; vLLM's `--served-model-name`), each listed in /v1/models as a model of its own.

Anything else — `gpt-4o/<id>`, a path ending in the id, the id with other text around it — names no
model (the API answers 404 `model_not_found`). Names are 1-255 characters (the store's column).
"""

from __future__ import annotations

from pathlib import PurePath

#: the longest model name (the jobs.model column)
MAX_MODEL_CHARS = 255


def model_id(target: str) -> str:
    """The id of a target given as a registry name or a GGUF path: its file name without `.gguf`."""
    base = PurePath(target).name
    return base[:-5] if base.endswith(".gguf") else base


def parse_aliases(raw: str) -> tuple[str, ...]:
    """The names of a SPECQ_SERVED_MODEL_NAME value (comma-separated, blanks around them dropped);
    ValueError for a name that is too long or holds a control character."""
    names: list[str] = []
    for part in (raw or "").split(","):
        name = part.strip()
        if not name:
            continue
        if len(name) > MAX_MODEL_CHARS or any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in name):
            raise ValueError(f"served model name {name[:60]!r}: at most {MAX_MODEL_CHARS} characters, no control "
                             "characters")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"served model name {name[:60]!r} is not valid UTF-8") from None
        if name not in names:
            names.append(name)
    return tuple(names)


def names_of(served_id: str) -> tuple[str, ...]:
    """The names a served model id answers to by itself: the id and its `.gguf` file name."""
    return (served_id, served_id + ".gguf")


def resolve(name: str, served_ids: list[str] | tuple[str, ...], aliases: dict[str, str] | None = None) -> str | None:
    """The served id `name` names (exact match against `names_of` each id, then the `aliases` map of
    alias -> id), or None."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_MODEL_CHARS:
        return None
    for served in served_ids:
        if name in names_of(served):
            return served
    target = (aliases or {}).get(name)
    return target if target in served_ids else None


__all__ = ["MAX_MODEL_CHARS", "model_id", "parse_aliases", "names_of", "resolve"]
