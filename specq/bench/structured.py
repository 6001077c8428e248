"""`specq bench structured`: field accuracy of extraction with and without a JSON Schema, and what the
grammar costs (issue 51's "Measure").

The documents and their hand-written reference values are in bench/structured/references.json (five
fields per document: a string, integer, number or boolean each). Every document is asked the same
question (`question_for`: the field names, types and descriptions, "answer with the JSON object only")
in each *arm*:

* `schema`: with `json_schema` = the fields as a strict object schema (`schema_for`), draft none;
* `plain`: the same question without a schema, draft none; the answer is parsed by `parse_answer` (the
  JSON text, else the first `{` to the last `}` of it, fences and prose around it ignored); an answer
  that does not parse to an object has every field wrong;
* `schema-draft`: as `schema` with the default drafter (`draft auto`: n-grams of the prompt on this
  build, engine/decode/drafters.py), so its decode speed compares with `schema`'s on the same tokens
  (greedy: the tokens must be the same, the record says whether they are);
* `plain-draft`: as `plain` with the default drafter (not run unless asked).

Grading (`grade`): a field is right when its value equals the reference after `normalise`: strings are
NFKC-normalised, case-folded, stripped of surrounding whitespace, quotes and backticks and of one
trailing period, and their inner whitespace collapsed to one space; a string that reads as a number
compares as that number and "true"/"yes"/"false"/"no" as booleans; numbers compare within 1e-9 (an
integer and a float of the same value are equal). A missing field is wrong.

Every run is greedy and in mode `baseline` (every prompt token prefilled): the measurement is about
the grammar, so specprefill's selection stays out of the accuracy. The arms of one document share
their prompt, so with the engine's prompt cache on (the command's default: a loaded 2-core CPU pays
minutes per prefill) only the first arm of a document prefills it and the others restore its KV
state; the first arm rotates from document to document, and the TTFT column is the median over the
runs that prefilled (`prefill_cached` false), so each arm's TTFT comes from its own share of the
documents. Per arm the report gives field accuracy, parse rate, median TTFT, decode tokens/s (emitted
tokens ÷ the `decode` phase), grammar ms per generated token (the engine's `grammar` timing: time in
the grammar mask, decode/grammar.py), the draft's acceptance rate, and for a drafting arm on how many
documents its tokens equal its undrafted twin's. Each (document, arm) is one JSON line appended to a journal; a rerun with
the same journal skips what it holds, so the command can stop and resume. The machine's load average
is recorded per record and at the start and end of the run (other work shares a CPU).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .provenance import REPO

#: the committed documents and reference values
REFERENCES = REPO / "bench" / "structured" / "references.json"

#: arm -> (with a schema, drafter)
ARMS: dict[str, tuple[bool, str]] = {
    "schema": (True, "none"),
    "plain": (False, "none"),
    "schema-draft": (True, "auto"),
    "plain-draft": (False, "auto"),
}
DEFAULT_ARMS = ("schema", "plain", "schema-draft")

_TYPES = {"string", "integer", "number", "boolean"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    description: str
    value: Any


@dataclass(frozen=True)
class Document:
    name: str
    path: str
    fields: tuple[Field, ...]

    def text(self, root: Path = REPO) -> str:
        return (root / self.path).read_text(encoding="utf-8")


def load_documents(path: Path = REFERENCES) -> list[Document]:
    """The documents of a references file; ValueError naming what is malformed."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    docs = []
    for d in data["documents"]:
        fields = []
        for f in d["fields"]:
            if f["type"] not in _TYPES:
                raise ValueError(f"{d['name']}.{f['name']}: type must be one of {sorted(_TYPES)}")
            fields.append(Field(f["name"], f["type"], f["description"], f["value"]))
        if len({f.name for f in fields}) != len(fields):
            raise ValueError(f"{d['name']}: field names repeat")
        docs.append(Document(d["name"], d["path"], tuple(fields)))
    if len({d.name for d in docs}) != len(docs):
        raise ValueError("document names repeat")
    return docs


def schema_for(doc: Document) -> dict[str, Any]:
    """The strict object schema of a document's fields (every field required, nothing else)."""
    return {"type": "object",
            "properties": {f.name: {"type": f.type, "description": f.description} for f in doc.fields},
            "required": [f.name for f in doc.fields], "additionalProperties": False}


def question_for(doc: Document) -> str:
    """The same question in every arm: the fields to extract, then "JSON only"."""
    lines = [f"- {f.name} ({f.type}): {f.description}" for f in doc.fields]
    return ("Extract these fields from the document above and answer with a JSON object that has exactly "
            "these keys:\n" + "\n".join(lines) + "\nAnswer with the JSON object only.")


# ----------------------------------------------------------------------------------------- grading


def parse_answer(text: str) -> dict | None:
    """The JSON object of an answer: the whole text, else its first `{` to its last `}`; None if
    neither is a JSON object."""
    for candidate in (text.strip(), text[text.find("{"): text.rfind("}") + 1] if "{" in text else ""):
        if not candidate:
            continue
        try:
            value = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


_BOOLS = {"true": True, "yes": True, "false": False, "no": False}


def normalise(value: Any) -> Any:
    """The comparable form of a value (the module doc's normalisation)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return json.dumps(value, sort_keys=True)
    s = unicodedata.normalize("NFKC", value).casefold().strip()
    s = s.strip("\"'`").strip()
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    s = " ".join(s.split())
    if s in _BOOLS:
        return _BOOLS[s]
    try:
        number = float(s)
    except ValueError:
        return s
    return number if math.isfinite(number) else s


def same(answer: Any, reference: Any) -> bool:
    a, r = normalise(answer), normalise(reference)
    if isinstance(a, bool) or isinstance(r, bool):
        return isinstance(a, bool) and isinstance(r, bool) and a == r
    if isinstance(a, float) and isinstance(r, float):
        return math.isclose(a, r, rel_tol=1e-9, abs_tol=1e-12)
    return a == r


def grade(doc: Document, text: str) -> dict[str, Any]:
    """{"parsed": bool, "right": {field: bool}, "values": {field: what the answer gave}}."""
    obj = parse_answer(text)
    right, values = {}, {}
    for f in doc.fields:
        given = obj.get(f.name) if obj is not None else None
        values[f.name] = given
        right[f.name] = obj is not None and f.name in obj and same(given, f.value)
    return {"parsed": obj is not None, "right": right, "values": values}


# ----------------------------------------------------------------------------------------- journal


def read_journal(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill: that run is redone
                continue
    return out


def _append(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------------------- running


def run_structured(engine, documents: Iterable[Document], journal: Path, *, arms: Iterable[str] = DEFAULT_ARMS,
                   max_tokens: int = 160, mode: str = "baseline", root: Path = REPO,
                   say: Callable[[str], None] = print) -> list[dict]:
    """Run every (document, arm) the journal does not hold yet (documents outer, arms inner, so the
    arms of one document run close together in time and share its cached prompt; the first arm rotates);
    returns the journal's records afterwards."""
    from ..engine.options import RunParams

    arms = list(arms)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s): {', '.join(unknown)} (known: {', '.join(ARMS)})")
    key = {"max_tokens": max_tokens, "mode": mode}
    done = {(r["document"], r["arm"]) for r in read_journal(journal) if r.get("settings") == key}
    for k, doc in enumerate(documents):
        text = doc.text(root)
        for arm in arms[k % len(arms):] + arms[: k % len(arms)]:  # the first arm (the one that prefills) rotates
            if (doc.name, arm) in done:
                continue
            with_schema, draft = ARMS[arm]
            params = RunParams(question=question_for(doc), mode=mode, min_tokens=0, max_tokens=max_tokens,
                               temperature=0.0, draft=draft, json_schema=schema_for(doc) if with_schema else None)
            load_before = _load()
            t0 = time.perf_counter()
            result = engine.run(text, params)
            wall = (time.perf_counter() - t0) * 1000.0
            t = result.timings_ms
            n = result.usage.completion_tokens
            g = grade(doc, result.text)
            rec = {
                "document": doc.name, "arm": arm, "settings": key, "draft": result.draft.method if draft != "none" else "none",
                "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": n, "finish_reason": result.finish_reason,
                "text": result.text, **g, "fields": len(doc.fields), "n_right": sum(g["right"].values()),
                "ttft_ms": round(t.get("ttft", 0.0), 1), "decode_ms": round(t.get("decode", 0.0), 1),
                "grammar_ms": round(t.get("grammar", 0.0), 2) if with_schema else None,
                "wall_ms": round(wall, 1), "accept_rate": result.draft.accept_rate if draft != "none" else None,
                "tokens_sha256": hashlib.sha256(json.dumps(list(result.tokens)).encode()).hexdigest(),
                "prefill_cached": bool(result.spec.cache.get("bytes_restored", 0)),
                "mode_ran": result.spec.mode, "loadavg_before": load_before, "loadavg_after": _load(),
            }
            _append(journal, rec)
            say(f"{doc.name:16} {arm:13} {rec['n_right']}/{len(doc.fields)} parsed={g['parsed']!s:5} "
                f"tokens={n:4d} ttft={rec['ttft_ms']:9.0f} ms decode={rec['decode_ms']:8.0f} ms "
                f"grammar={rec['grammar_ms'] if rec['grammar_ms'] is not None else '-'} ms")
    return read_journal(journal)


# ----------------------------------------------------------------------------------------- report


def _drafter(arm: str, records: list[dict]) -> str:
    """The arm's drafter, with what `auto` resolved to on the run's engine ("auto = ngram")."""
    asked = ARMS[arm][1]
    ran = sorted({str(r["draft"]) for r in records if r.get("draft") and r["draft"] != asked})
    return f"{asked} = {', '.join(ran)}" if asked != "none" and ran else asked


def _same_as_undrafted(arm: str, rs: list[dict], records: list[dict]) -> list[bool]:
    """A drafting arm: per document, whether its tokens equal those of the same arm without drafting."""
    with_schema, draft = ARMS[arm]
    if draft == "none":
        return []
    twin = "schema" if with_schema else "plain"
    theirs = {r["document"]: r.get("tokens_sha256") for r in records if r["arm"] == twin}
    return [r["tokens_sha256"] == theirs[r["document"]] for r in rs
            if r.get("tokens_sha256") and theirs.get(r["document"])]


def aggregate(records: list[dict], arms: Iterable[str] | None = None) -> list[dict]:
    """One row per arm: field accuracy, parse rate, median TTFT, decode tokens/s, grammar ms/token."""
    rows = []
    names = list(arms) if arms is not None else [a for a in ARMS if any(r["arm"] == a for r in records)]
    for arm in names:
        rs = [r for r in records if r["arm"] == arm]
        if not rs:
            continue
        fields = sum(r["fields"] for r in rs)
        tokens = sum(r["completion_tokens"] for r in rs)
        decode_s = sum(r["decode_ms"] for r in rs) / 1000.0
        grammar = [r["grammar_ms"] for r in rs if r.get("grammar_ms") is not None]
        same_flags = _same_as_undrafted(arm, rs, records)
        prefilled = [r["ttft_ms"] for r in rs if not r.get("prefill_cached")]
        accept = [r["accept_rate"] for r in rs if r.get("accept_rate") is not None]
        rows.append({
            "arm": arm, "schema": ARMS[arm][0], "draft": _drafter(arm, rs), "documents": len(rs), "fields": fields,
            "fields_right": sum(r["n_right"] for r in rs),
            "field_accuracy": round(sum(r["n_right"] for r in rs) / fields, 4) if fields else None,
            "parse_rate": round(sum(1 for r in rs if r["parsed"]) / len(rs), 4),
            "finish_length": sum(1 for r in rs if r["finish_reason"] == "length"),
            "ttft_ms_median": round(statistics.median(prefilled), 1) if prefilled else None,
            "ttft_runs": len(prefilled),
            "completion_tokens": tokens,
            "decode_tokens_per_s": round(tokens / decode_s, 2) if decode_s > 0 else None,
            "grammar_ms_per_token": round(sum(grammar) / tokens, 3) if grammar and tokens else None,
            "accept_rate_mean": round(statistics.mean(accept), 3) if accept else None,
            "same_tokens_as_undrafted": f"{sum(same_flags)}/{len(same_flags)}" if same_flags else None,
        })
    return rows


def build_report(records: list[dict], provenance: dict, settings: dict) -> dict:
    """The result file: per-arm rows, every record, and the load average (1/5/15 min) before the journal's
    first run and after its last (a resumed run's invocations each have their own in their records;
    provenance.host has the last invocation's)."""
    load = {"start": records[0].get("loadavg_before") if records else None,
            "end": records[-1].get("loadavg_after") if records else None,
            "max_1min": max((r["loadavg_after"][0] for r in records if r.get("loadavg_after")), default=None)}
    return {"benchmark": "structured", "provenance": provenance, "settings": settings, "loadavg": load,
            "arms": aggregate(records, settings.get("arms")), "records": records}


def _cell(x: Any, fmt: str) -> str:
    return "–" if x is None else fmt.format(x)


def table_markdown(report: dict) -> str:
    """The per-arm table of one report (docs/openai.md renders it through `specq bench report`)."""
    head = ["arm", "schema", "draft", "documents", "fields right", "field accuracy", "parsed", "ended at max_tokens",
            "TTFT median ms (runs that prefilled)", "decode tok/s", "grammar ms/token", "draft acceptance", "same tokens as undrafted"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    for a in report.get("arms", []):
        lines.append("| " + " | ".join([
            f"`{a['arm']}`", "yes" if a["schema"] else "no", a["draft"], str(a["documents"]),
            f"{a['fields_right']}/{a['fields']}", f"**{_cell(a['field_accuracy'], '{:.2f}')}**",
            _cell(a["parse_rate"], "{:.2f}"), str(a["finish_length"]), (_cell(a["ttft_ms_median"], "{:,.0f}") + f" ({a.get('ttft_runs', a['documents'])})"),
            _cell(a["decode_tokens_per_s"], "{:.2f}"), _cell(a["grammar_ms_per_token"], "{:.2f}"),
            _cell(a["accept_rate_mean"], "{:.2f}"), a["same_tokens_as_undrafted"] or "–"]) + " |")
    return "\n".join(lines)


__all__ = ["ARMS", "DEFAULT_ARMS", "REFERENCES", "Document", "Field", "aggregate", "build_report", "grade",
           "load_documents", "normalise", "parse_answer", "question_for", "read_journal", "run_structured",
           "same", "schema_for", "table_markdown"]
