"""The configuration reference (docs/configuration.md), rendered from specq/settings.py.

Each field of `ServiceSettings` becomes one row: its environment variable, its default (the value the
dataclass holds, and the source expression where that reads better) and the `#:` comment above it —
so the reference cannot drift from the code: `specq bench report` writes it and
tests/test_docs_generated.py fails when the committed file differs. Section headings come from the
class's `# --- name ---` lines; the variables read by other modules come from the module doc.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re

from . import settings as settings_module
from .settings import ServiceSettings


#: fields handed to the engine as they are (ServiceSettings.engine_options): setting -> EngineOptions field
_ENGINE_FIELDS = {"n_gpu_layers": "n_gpu_layers", "n_ctx": "n_ctx", "n_batch": "n_batch", "n_ubatch": "n_ubatch",
                  "threads": "n_threads", "flash_attn": "flash_attn"}


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")


def _fields_with_comments() -> list[tuple[str, str, str, str]]:
    """(section, field name, source default, comment) in class order."""
    source = inspect.getsource(settings_module)
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ServiceSettings.__name__)
    out = []
    section = ""
    prev_end = cls.body[0].end_lineno or cls.lineno  # after the class docstring
    for node in cls.body[1:]:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            prev_end = node.end_lineno or prev_end
            continue
        comment: list[str] = []
        for line in lines[prev_end:node.lineno - 1]:
            s = line.strip()
            m = re.match(r"#\s*-{3}\s*(.*?)\s*-*$", s)
            if m and m.group(1):
                section, comment = m.group(1), []
            elif s.startswith("#:"):
                comment.append(s[2:].strip())
            elif s.startswith("#") or not s:
                continue
        default_src = ast.get_source_segment(source, node.value) if node.value is not None else ""
        out.append((section, node.target.id, default_src or "", " ".join(comment)))
        prev_end = node.end_lineno or node.lineno
    return out


def _default(field: dataclasses.Field, source: str) -> str:
    value = field.default
    shown = "unset" if value is None else '`""` (empty)' if value == "" else f"`{value!r}`"
    if value not in (None, "") and source and source.replace("_", "") != repr(value) and not source.startswith(("DEFAULT_", '"')):
        shown += f" (`{source}`)"
    elif source.startswith("DEFAULT_"):
        shown = f"`{value!r}`"
    return shown


def settings_markdown() -> str:
    """The reference: one table per section of ServiceSettings, then the variables read elsewhere."""
    fields = {f.name: f for f in dataclasses.fields(ServiceSettings)}
    out: list[str] = []
    section = None
    group_head = ""
    for sec, name, source, comment in _fields_with_comments():
        if sec != section:
            section = sec
            out += ["", f"### {sec[:1].upper()}{sec[1:]}", "", "| variable | default | what it does |", "|---|---|---|"]
        if comment:
            group_head, text = name, comment
        elif name in _ENGINE_FIELDS:
            text = f"the worker's `EngineOptions.{_ENGINE_FIELDS[name]}`; unset = the engine's default"
        else:  # a field that shares the comment above it
            text = f"see `SPECQ_{group_head.upper()}` above" if group_head else ""
        cell = _rst_to_md(text).replace("|", "\\|")
        out.append(f"| `SPECQ_{name.upper()}` | {_default(fields[name], source)} | {cell} |")
    doc = settings_module.__doc__ or ""
    _, _, elsewhere = doc.partition("Read by other modules, not here")
    elsewhere = elsewhere.split("\n\nThis module", 1)[0]
    items = re.findall(r"^\* (.*?)(?=^\* |\Z)", elsewhere, re.S | re.M)
    if items:
        out += ["", "### Read by other modules", ""]
        out += ["* " + " ".join(_rst_to_md(i).split()) for i in items]
    return "\n".join(out).strip("\n") + "\n"


__all__ = ["settings_markdown"]
