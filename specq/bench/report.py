"""`specq bench report`: the tables of measured numbers in the docs, rendered from bench/results.

A number a reader sees in README.md or docs/*.md that came out of a benchmark is not typed by hand:
it sits between marker comments

    <!-- report:NAME -->
    …rendered table…
    <!-- /report:NAME -->

and `render_text` replaces what is between them with `RENDERERS[NAME]`'s output, computed from the
JSON reports under bench/results (prose around the markers stays hand-written). Each row names its
result file (a link) and the code that produced it as the report's provenance records it
(specq/bench/provenance.py: `git describe --dirty`; `-dirty` stays in the name). Reports written
before that object existed go into the `history` table, marked so: their commit is what the run typed,
the tree state and numerics are unknown, and no row elsewhere quotes them.

`specq bench report --check` fails when a committed table differs from what this renders
(tests/test_docs_generated.py runs the same check). The configuration reference
(docs/configuration.md) is rendered the same way, from specq/settings.py (`settings_reference`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..settings_reference import settings_markdown
from .provenance import REPO
from .quality_report import TORCH_LABEL, table_markdown
from .calibrate import table_markdown as calibrate_markdown
from .labelfree import table_markdown as labelfree_markdown
from .structured import table_markdown as structured_markdown
from . import goals_table, kinds_recall_table, kinds_table, speculator_swap

RESULTS = REPO / "bench" / "results"
#: the files whose marker blocks `specq bench report` renders
DOCS = ("README.md", "docs")

_BLOCK = re.compile(r"(<!-- report:([\w-]+) -->\n)(.*?)(<!-- /report:\2 -->)", re.S)


class ReportError(ValueError):
    """A marker names no renderer, or a result a table needs is missing."""


@dataclass(frozen=True)
class Result:
    """One JSON report under bench/results."""

    path: Path
    data: dict

    @property
    def rel(self) -> str:
        return self.path.relative_to(REPO).as_posix()

    @property
    def kind(self) -> str:
        d = self.data
        if "summary" in d and "workload" in d:
            return "serve"
        if d.get("benchmark") == "ttft":
            return "ttft"
        if d.get("benchmark") == "quality":
            return "quality"
        script = next((w for w in str(d.get("command", "")).split() if w.endswith(".py")), "")
        # else the file's name without its date: cpu-abort-cost-2026-12-02.json -> cpu-abort-cost
        stem = re.sub(r"-?\d{4}-\d{2}-\d{2}.*$", "", self.path.stem)
        return str(d.get("benchmark") or Path(script).stem or stem or "other")

    @property
    def provenance(self) -> dict | None:
        """The provenance object (specq/bench/provenance.py), or the quality benchmark's own record."""
        p = self.data.get("provenance")
        if isinstance(p, dict) and (isinstance(p.get("code"), dict) or "git_describe" in p):
            return p
        return None

    @property
    def code(self) -> str:
        p = self.provenance
        if p is None:
            return str(self.data.get("commit") or "?")
        if isinstance(p.get("code"), dict):
            return str(p["code"].get("describe") or "?")
        return str(p["git_describe"])

    @property
    def device(self) -> str:
        p = self.provenance or {}
        host = p.get("host") or self.data.get("hardware") or {}
        gpu = host.get("gpu")
        if gpu:
            name = str(gpu).split(",")[0].strip()
            count = host.get("gpu_count", 1)
            return name if count == 1 else f"{count}× {name}"
        cpu = host.get("cpu") or p.get("cpu") or ""
        cores = host.get("cores") or p.get("cores")
        cpu = re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b", "", str(cpu))
        cpu = " ".join(cpu.split()) or "CPU"
        return f"{cpu}, {cores} cores" if cores else cpu

    @property
    def date(self) -> str:
        p = self.provenance or {}
        d = p.get("date_utc") or self.data.get("date") or self.data.get("measured") or ""
        if not d:  # the date in the file's or its folder's name
            m = re.search(r"\d{4}-\d{2}-\d{2}", self.rel)
            d = m.group(0) if m else ""
        return str(d)[:10]


def load_results(root: Path = RESULTS) -> list[Result]:
    """Every JSON object report under `root` (sorted by path); other files are skipped."""
    out = []
    for path in sorted(root.rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            out.append(Result(path, data))
    return out


# ----------------------------------------------------------------------------------------- formatting


def _link(r: Result, base: Path, text: str | None = None) -> str:
    rel = os.path.relpath(r.path, base).replace(os.sep, "/")
    return f"[{text or r.rel.removeprefix('bench/results/')}]({rel})"


def _ms(x: Any) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _model(name: Any) -> str:
    name = Path(str(name or "?")).name.removesuffix(".gguf")
    m = re.match(r"qwen2\.5-coder-([\d.]+b)-instruct-(\w+)", name)
    return f"Qwen2.5-Coder {m.group(1)} {m.group(2)}" if m else name


def _table(header: list[str], align: str, rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ttft_rows(r: Result) -> list[dict]:
    return [row for row in r.data.get("rows", []) if "baseline_ttft_ms" in row]


# ----------------------------------------------------------------------------------------- tables


def ttft_table(results: list[Result], base: Path) -> str:
    """`specq bench ttft` reports with provenance: baseline vs specprefill time to first token."""
    rows = []
    for r in results:
        if r.kind != "ttft" or r.provenance is None:
            continue
        e = r.data.get("engine", {})
        st = r.data.get("settings", {})
        for row in _ttft_rows(r):
            window = st.get("window")
            windows = row.get("windows")
            shape = "–" if windows is None else "1 pass" if windows == 1 else f"{windows} × {window:,}" if window else f"{windows}"
            if st.get("scorer", "windowed") != "windowed":
                shape = f"{st['scorer']}: {shape}"
            rows.append([_link(r, base), r.device, f"`{r.code}`", f"{_model(e.get('target'))} / {_model(e.get('speculator'))}"
                         + (TORCH_LABEL if e.get("speculator_impl") == "torch" else ""),
                         f"{row.get('prompt_tokens', row.get('length')):,}", f"{st.get('keep', '–')}", shape,
                         _ms(row.get("fastest_baseline_ms", row["baseline_ttft_ms"])), _ms(row["specprefill_ttft_ms"]),
                         f"**{row['ratio']:.2f}×**" if row.get("ratio") else "–",
                         _ms(row.get("speculator_tokens_per_s")), _f(row.get("fraction_of_peak"), "{:.1%}")])
    return _table(["result", "device", "code", "target / speculator", "prompt tokens", "keep", "scoring windows",
                   "baseline TTFT ms", "specprefill TTFT ms", "speed-up", "speculator prefill tokens/s",
                   "of the card's F16 peak"], "lllllrrrrrrr", rows)


def _workload(w: dict) -> str:
    arrival = {"t0": "all at once", "per-doc": "one document after another"}.get(w.get("arrival"), w.get("arrival", ""))
    q = w.get("questions", 1)
    docs = f"{w.get('docs')} docs × {q} questions" if q and q > 1 else f"{w.get('docs')} docs"
    stored = ", stored documents" if w.get("documents") else ""
    if w.get("lengths_mix") or w.get("max_tokens_mix"):  # the mixed workload (specq/bench/workloads.py)
        lengths = (f"{w['lengths_mix'].replace(':', '–')} tokens (log-uniform)" if w.get("lengths_mix")
                   else f"{w.get('doc_tokens', 0):,} tokens")
        out = f"{w['max_tokens_mix'].replace(':', '–')} out" if w.get("max_tokens_mix") else f"{w.get('max_tokens')} out"
        return f"{w.get('docs')} docs × {lengths}, {out}, {arrival}, mode {w.get('mode')}"
    return f"{docs} × {w.get('doc_tokens', 0):,} tokens, {arrival}, mode {w.get('mode')}{stored}"


def serve_table(results: list[Result], base: Path) -> str:
    """`specq bench serve` reports with provenance: jobs/min and client TTFT of one workload each."""
    rows = []
    for r in results:
        if r.kind != "serve" or r.provenance is None:
            continue
        s, w = r.data["summary"], r.data["workload"]
        ttft = s.get("client_ttft_ms_p50")
        rows.append([_link(r, base), r.device, f"`{r.code}`", str(r.data.get("label", "")), _model(r.data.get("model")),
                     _workload(w), f"{s.get('succeeded', '–')}/{s.get('jobs', '–')}",
                     f"**{s['jobs_per_min']:.1f}**" if s.get("jobs_per_min") is not None else "–",
                     _f(None if ttft is None else ttft / 1000, "{:.1f}")])
    return _table(["result", "device", "code", "server", "target", "workload", "ok", "jobs/min", "client TTFT p50 s"],
                  "llllllrrr", rows)


def other_table(results: list[Result], base: Path) -> str:
    """Other reports with provenance (their figures are in the sections that discuss them)."""
    rows = []
    for r in results:
        if r.kind in ("serve", "ttft", "quality", "speculator-throughput") or r.provenance is None:
            continue
        rows.append([_link(r, base), r.kind, r.device, f"`{r.code}`", r.date])
    return _table(["result", "benchmark", "device", "code", "date (UTC)"], "lllll", rows)


def _history_figure(r: Result) -> str:
    if r.kind == "ttft":
        return "; ".join(f"{row.get('prompt_tokens', row.get('length')):,} tokens: {_ms(row['baseline_ttft_ms'])} → "
                         f"{_ms(row['specprefill_ttft_ms'])} ms" for row in _ttft_rows(r))
    if r.kind == "serve":
        return f"{r.data.get('label', '')}: {r.data['summary'].get('jobs_per_min', 0):.1f} jobs/min ({_workload(r.data['workload'])})"
    return "–"


def history_table(results: list[Result], base: Path) -> str:
    """Reports without a provenance object (written before specq/bench/provenance.py): kept, not quoted."""
    rows = []
    for r in results:
        if r.provenance is not None:
            continue
        commit = f"`{r.code}` (as typed by the run)" if r.data.get("commit") else "none recorded"
        rows.append([_link(r, base), r.kind, _history_figure(r), commit, r.date or "–"])
    note = ("No provenance object: these reports predate specq/bench/provenance.py, or came from a script that did "
            "not record it yet (bench/gpu/speculator_throughput.py's first run). The commit is what the run "
            "wrote down (not whether the tree was dirty), the numerics and the host load are unknown; no other "
            "table or the README quotes them.\n\n")
    return note + _table(["result (no provenance)", "benchmark", "figures", "commit", "date"], "lllll", rows)


def _quality_results(results: list[Result]) -> list[Result]:
    return [r for r in results if r.kind == "quality"]


def quality_answer_table(results: list[Result], base: Path) -> str:
    """Answer right, baseline vs specprefill on the real pair, from every aggregated quality report
    (a row that several reports hold is shown once, naming each)."""
    seen: dict[tuple, list] = {}
    for r in _quality_results(results):
        for a in r.data.get("answer", []):
            key = (a["length"], a["scorer"], a.get("window", 0), a["keep"], a.get("chunk_rule", "mean"), a["n"],
                   a["both_right"], a["baseline_only"], a["specprefill_only"])
            seen.setdefault(key, [a, []])[1].append(r)
    rows = []
    for key in sorted(seen, key=lambda k: (k[4], k[0], k[1])):
        a, rs = seen[key]
        rows.append([f"{a['length']:,}", f"{a['scorer']}{'@' + str(a['window']) if a.get('window') else ''}",
                     f"{a['keep']}", a.get("chunk_rule", "mean"), f"{a['n']} ({a.get('documents', '–')})",
                     _f(a["baseline_acc"]), _f(a["specprefill_acc"]), _f(a["ratio"]), f"**{_f(a['ratio_lower'])}**",
                     f"{a['baseline_only']} / {a['specprefill_only']}",
                     ", ".join(_link(r, base) for r in rs), ", ".join(sorted({f"`{r.code}`" for r in rs}))])
    return _table(["doc tokens", "scorer", "keep", "chunk rule", "n (documents)", "baseline acc", "specprefill acc",
                   "ratio", "90% lower", "baseline only / specprefill only", "results", "code"], "rllllrrrrrll", rows)


def quality_recall_table(results: list[Result], base: Path) -> str:
    """Answer-chunk recall at keep 0.3 of each report's scorers (no ranking-rule arms), deduplicated."""
    seen: dict[tuple, list] = {}
    for r in _quality_results(results):
        for a in r.data.get("recall", []):
            if a["keep"] != 0.3 or "-" in a["scorer"]:
                continue
            key = (a["length"], a["scorer"], a["n"], round(a["recall"], 6), a.get("documents"))
            seen.setdefault(key, [a, []])[1].append(r)
    rows = []
    for key in sorted(seen, key=lambda k: (seen[k][1][0].rel, k)):
        a, rs = seen[key]
        rows.append([f"{a['length']:,}", a["scorer"], f"{a['n']} ({a.get('documents', '–')})", f"**{a['recall']:.3f}**",
                     _f(a.get("recall_lower")), _f(a.get("random_recall")),
                     ", ".join(_link(r, base) for r in rs), ", ".join(sorted({f"`{r.code}`" for r in rs}))])
    return _table(["doc tokens", "scorer", "n (documents)", "recall", "90% lower", "random", "results", "code"],
                  "rllrrrll", rows)


def quality_group_table(results: list[Result], base: Path) -> str:
    """Group-sparse answers against the same questions' baseline and single specprefill answers."""
    rows = []
    for r in _quality_results(results):
        for g in r.data.get("group", []):
            rows.append([f"{g['length']:,}", f"{g['n']} ({g['documents']})", _f(g["baseline_acc"]), _f(g["specprefill_acc"]),
                         f"**{_f(g['group_acc'])}**", _f(g["ratio_vs_baseline"]), _f(g["ratio_vs_baseline_lower"]),
                         _link(r, base), f"`{r.code}`"])
    return _table(["doc tokens", "n (documents)", "baseline acc", "specprefill acc", "group acc", "group / baseline",
                   "90% lower", "result", "code"], "rlrrrrrll", rows)


def quality_default_table(results: list[Result], base: Path) -> str:
    """The default settings' full table (quality_report.table_markdown) from its aggregated report."""
    r = _find(results, "bench/results/quality-cpu-default.json")
    return (f"From {_link(r, base)} (code `{r.code}`, {r.device}):\n\n" + table_markdown(r.data)).rstrip("\n")


# ----------------------------------------------------------------------------------------- README's headline


def _find(results: list[Result], rel: str) -> Result:
    for r in results:
        if r.rel == rel:
            return r
    raise ReportError(f"a headline row needs {rel}, which is not under bench/results")


def _ttft_at(r: Result, tokens: int) -> dict:
    try:
        return goals_table.ttft_row(r.data, tokens)
    except ValueError:
        raise ReportError(f"{r.rel} has no row at {tokens} prompt tokens") from None


def headline_table(results: list[Result], base: Path) -> str:
    """README's one table: each figure from its report (code as recorded) and where it is reproduced."""
    rows = []

    def ttft(what: str, rel: str, tokens: int, where: str) -> None:
        r = _find(results, rel)
        row = _ttft_at(r, tokens)
        rows.append([what, f"{_ms(row['baseline_ttft_ms'])} → {_ms(row['specprefill_ttft_ms'])} ms TTFT "
                           f"(**{row['ratio']:.2f}×**) at {tokens:,} tokens", f"{r.device}, `{r.code}`",
                     f"{_link(r, base, 'result')} · {where}"])

    def serve(what: str, rel: str, vs: str | None, where: str) -> None:
        r = _find(results, rel)
        jpm = r.data["summary"]["jobs_per_min"]
        text = f"**{jpm:.1f}** jobs/min"
        modes = r.data["summary"].get("modes")
        if modes:
            text += " (ran: " + ", ".join(f"{m} {n}" for m, n in sorted(modes.items())) + ")"
        links = [_link(r, base, "result")]
        if vs:
            o = _find(results, vs)
            ojpm = o.data["summary"]["jobs_per_min"]
            text += f" vs {o.data.get('label', 'llama-server')} {ojpm:.1f} (**{jpm / ojpm:.2f}×**)"
            links.append(_link(o, base, "llama-server"))
            if o.code != r.code:
                text += f" (llama-server at `{o.code}`)"
        rows.append([what, text, f"{r.device}, `{r.code}`", " · ".join(links) + f" · {where}"])

    def answers(what: str, rel: str, where: str) -> None:
        r = _find(results, rel)
        cells = [f"{a['length'] // 1000}K: {a['ratio']:.2f} (≥ {a['ratio_lower']:.2f}, n {a['n']})"
                 for a in sorted(r.data["answer"], key=lambda a: a["length"])]
        rows.append([what, "; ".join(cells), f"{r.device}, `{r.code}`", f"{_link(r, base, 'result')} · {where}"])

    bench_doc = os.path.relpath(REPO / "docs" / "benchmarks.md", base).replace(os.sep, "/")
    quality_doc = os.path.relpath(REPO / "docs" / "quality.md", base).replace(os.sep, "/")
    run = "bench/results/h100-2026-12-07c"  # one machine start: the GPU defaults as shipped (torch speculator)
    ttft("TTFT, 7B / 0.5B random-weight shapes, keep 0.3", f"{run}/ttft-7b-torchspec.json",
         32653, f"[`bench/gpu/ttft.sh`]({bench_doc}#ttft)")
    ttft("… the same", f"{run}/ttft-7b-torchspec-128k.json", 130584,
         f"[`bench/gpu/ttft.sh`]({bench_doc}#ttft)")
    ttft("TTFT on a 2-core CPU, real pair (Qwen2.5-Coder 1.5B / 0.5B)", "bench/results/cpu-real-4k-both-2026-12-03.json",
         4015, f"[`specq bench ttft`]({bench_doc}#ttft)")
    serve("64 distinct ~31K-token documents at once, 8 slots, specprefill",
          f"{run}/serve-specq8-save-repeat-spectorch-32768.json", f"{run}/serve-llama0-32768.json",
          f"[`bench/gpu/serve.sh`]({bench_doc}#serving)")
    serve("8 documents × 8 questions at 32K, one after another, mode `auto`", f"{run}/serve-specq8-save-repeat-chunk4096-cache32G-q8-auto-docs-perdoc-32768.json",
          f"{run}/serve-llama0-q8-perdoc-32768.json", f"[`bench/gpu/serve.sh`]({bench_doc}#follow-up-questions-per-doc-arrival-issue-50)")
    answers("Answers right, specprefill / baseline (keep 0.3, `border`; 90% lower bound), real pair, CPU",
            "bench/results/quality-cpu-default.json", f"[`specq bench quality`]({quality_doc}#answers-right)")
    answers("… at 30K", "bench/results/quality-cpu-border-group-30000.json",
            f"[`specq bench quality`]({quality_doc}#answers-right)")
    return _table(["what", "measured", "where, code", "reproduce"], "llll", rows)


# ----------------------------------------------------------------------------------------- history

#: the pages whose dated sections (a heading with a YYYY-MM-DD date) docs/history.md indexes: its own
#: (the measurements' narrative, moved there from benchmarks.md and quality.md) and the runs from
#: before provenance was recorded
DATED_PAGES = ("docs/history.md", "docs/benchmarks-history.md")
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def heading_slug(text: str) -> str:
    """The anchor GitHub gives a heading (tests/test_doc_links.py checks every link made with it)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "").strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def dated_sections(_results: list[Result], base: Path) -> str:
    """Every dated section of the measurement pages, newest first (the same day: in page order)."""
    items = []
    for order, page in enumerate(DATED_PAGES):
        path = REPO / page
        if not path.exists():
            continue
        seen: dict[str, int] = {}
        fenced = False
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
            if not m:
                continue
            slug = heading_slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            date = _DATE.search(m.group(2))
            if date and len(m.group(1)) == 2:
                rel = os.path.relpath(path, base).replace(os.sep, "/")
                anchor = slug if n == 0 else f"{slug}-{n}"
                items.append((date.group(1), -order, -no, f"* {date.group(1)} · [{m.group(2)}]({rel}#{anchor})"))
    items.sort(reverse=True)
    return "\n".join(line for *_, line in items)


# ----------------------------------------------------------------------------------------- rendering

Renderer = Callable[[list[Result], Path], str]

def compose_up_table(_results: list[Result], base: Path) -> str:
    """The step times of each `tests/test_compose_up.py` run kept under bench/compose/ (its JSON names the
    command, code and machine, and how the worker-cpu image got llama.cpp: compiled, from wheels/, cached)."""
    rows = []
    for path in sorted((REPO / "bench" / "compose").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        rel = os.path.relpath(path, base).replace(os.sep, "/")
        steps = "; ".join(f"{k} {v:g} s" for k, v in data.get("seconds", {}).items())
        rows.append([f"[{path.name}]({rel})", str(data.get("date", "–")), str(data.get("code", "–")),
                     str(data.get("hardware", "–")), str(data.get("llama_cpp_in_image", "–")),
                     str(data.get("result", "–")), steps])
    return _table(["run", "date", "code", "machine", "worker-cpu's llama.cpp", "result", "seconds per step"],
                  "lllllll", rows)


def structured_table(results: list[Result], base: Path) -> str:
    """`specq bench structured` reports with provenance: field accuracy with and without a JSON Schema,
    TTFT, decode speed and grammar cost per arm (specq/bench/structured.py), each under its source line."""
    parts = []
    for r in results:
        if r.kind != "structured" or r.provenance is None:
            continue
        load = r.data.get("loadavg") or {}
        end, top = (load.get("end") or [None])[0], load.get("max_1min")
        loads = "–" if not load.get("start") else (f"{load['start'][0]:.1f} → {_f(end, '{:.1f}')} "
                                                   f"(highest after a run {_f(top, '{:.1f}')})")
        st = r.data.get("settings", {})
        parts.append(f"From {_link(r, base)} (code `{r.code}`, {r.device}, {r.date}, mode {st.get('mode', '–')}, "
                     f"max_tokens {st.get('max_tokens', '–')}, 1-min load average {loads}):\n\n"
                     + structured_markdown(r.data))
    if not parts:
        raise ReportError("no `specq bench structured` report with provenance under bench/results")
    return "\n\n".join(parts)


def speculator_throughput_table(results: list[Result], base: Path) -> str:
    """bench/gpu/speculator_throughput.py reports with provenance: one prefill of the same tokens under each order,
    micro-batch and call size, against the card's measured F16 GEMM throughput."""
    rows = []
    for r in results:
        if r.kind != "speculator-throughput" or r.provenance is None:
            continue
        for row in r.data.get("rows", []):
            if "seconds" not in row:
                continue
            rows.append([_link(r, base), r.device, f"`{r.code}`", row["role"], f"{row['streams']} × {row['per_stream']:,}",
                         row.get("order", "window-major"), f"{row['n_ubatch']:,}", f"{row['call_tokens']:,}",
                         _ms(row["seconds"] * 1000), f"{row['tokens_per_s']:,.0f}", f"{row['tflops']:.0f}",
                         f"**{100 * row['fraction_of_card']:.1f}%** of {r.data.get('card_f16_tflops', 0):.0f}"])
    return _table(["result", "device", "code", "model", "streams × tokens", "order", "n_ubatch", "call tokens", "ms",
                   "tokens/s", "TFLOP/s", "of the card's F16 GEMM TFLOP/s"], "lllllllrrrrr", rows)


def followup_table(results: list[Result], base: Path) -> str:
    """Per-doc arrival (each document's next question sent when its last one ended): specq beside llama-server from
    the same folder (one machine start), with specq's server-side breakdown (p50, ms) of where a job's time went."""
    by_dir: dict[str, dict[str, list[Result]]] = {}
    for r in results:
        w = r.data.get("workload", {})
        if r.kind != "serve" or r.provenance is None or w.get("arrival") != "per-doc":
            continue
        side = "llama" if str(r.data.get("label", "")).startswith("llama-server") else "specq"
        by_dir.setdefault(str(r.path.parent), {}).setdefault(side, []).append(r)
    rows = []
    # each specq run of a folder (one machine start) against its llama-server run
    pairs = [{"specq": s, "llama": sides["llama"][-1]} for d, sides in sorted(by_dir.items()) if "llama" in sides
             for s in sides.get("specq", [])]
    for pair in pairs:
        a, b = pair["specq"].data["summary"], pair["llama"].data["summary"]
        bd = a.get("breakdown_ms") or {}

        def gap(name: str) -> str:
            return _ms((bd.get(name) or {}).get("p50"))

        later = (a.get("client_ttft_ms_later_questions_p50"), b.get("client_ttft_ms_later_questions_p50"))
        rows.append([_link(pair["specq"], base, str(pair["specq"].data.get("label") or "specq")),
                     _link(pair["llama"], base, "llama-server"), pair["specq"].device,
                     f"`{pair['specq'].code}`", _workload(pair["specq"].data["workload"]),
                     f"{a['jobs_per_min']:.1f} / {b['jobs_per_min']:.1f}", f"**{a['jobs_per_min'] / b['jobs_per_min']:.2f}×**",
                     f"{_ms(later[0])} / {_ms(later[1])}",
                     f"**{later[0] / later[1]:.2f}×**" if None not in later else "–",
                     gap("stored_to_claimed"), gap("claimed_to_engine_start"), gap("engine_start_to_first_token")])
    return _table(["specq", "llama-server", "device", "code", "workload (specq's)", "jobs/min specq / llama-server",
                   "ratio", "follow-up client TTFT p50 ms specq / llama-server", "TTFT ratio", "stored → claimed",
                   "claimed → engine start", "engine start → first token"], "llllllrrrrrr", rows)


def goals_50_table(results: list[Result], base: Path) -> str:
    """Issue 50's speed goals, each from the run specq/bench/goals_table.py names: ratio, bar, what stops it."""

    def get(rel: str, text: str) -> tuple[dict, str, str, str]:
        r = _find(results, rel)
        return r.data, r.device, r.code, _link(r, base, text)

    return _table(goals_table.HEADER, "lllllll", goals_table.table_rows(goals_table.GOALS, get))


def calibrate_real_table(results: list[Result], base: Path) -> str:
    """`specq calibrate` on the real pair (bench/calibrate/collect.py's reports): the per-length table, the
    seconds a question took and the load during the run, whether `specq evidence --json` listed the rows, and
    mode auto's decision with them loaded, each under its source line."""
    parts = []
    for r in results:
        if r.kind != "calibrate-real" or r.provenance is None:
            continue
        d = r.data
        sp, load, ev = d["seconds_per_question"], d.get("loadavg_during") or {}, d["evidence_listing"]
        cal = d["calibrate_report"]
        head = (f"From {_link(r, base)} (calibrate at code `{d.get('calibrate_code') or '?'}`, the auto job at `{r.code}`, "
                f"{r.device}, {r.date}, `nice -n 15`; 1-minute load average during the run: mean "
                f"{_f(load.get('mean_1min'), '{:.1f}')}, {_f(load.get('min_1min'), '{:.1f}')}–"
                f"{_f(load.get('max_1min'), '{:.1f}')} over {load.get('samples', 0)} samples):")
        keys = cal.get("keys") or [{}]
        k = keys[0]
        facts = [f"**{d['questions_per_hour']:.1f} questions per hour**: {d['questions']} questions, "
                 f"{sp['mean']:.0f} s each on average (median {sp['median']:.0f}, {sp['min']:.0f}–{sp['max']:.0f}; "
                 "each is baseline, specprefill and two teacher-forced passes)"
                 + (f"; {d['questions_from_journal']} of them carried from the timing run's journal" if d.get("questions_from_journal") else ""),
                 f"key: {_model(k.get('target'))} / {_model(k.get('speculator'))}, backend {k.get('backend', '?')}, task "
                 f"{k.get('task', '?')}, keep {k.get('keep', '?')}, scorer {k.get('scorer', '?')}, positions {k.get('positions', '?')}",
                 f"`specq evidence --json` lists {len(ev['calibrate_rows_listed'])} of the {len(cal['rows'])} rows written"
                 + ("" if ev["all_calibrate_rows_listed"] else " (**not all**)")]
        for dec in d["auto"]["decisions"]:
            p = ", ".join(f"{a}={b}" for a, b in dec["params"].items())
            facts.append(f"mode auto on {d['auto']['document']} ({d['auto']['document_tokens']:,} document tokens; {p}): "
                         f"**{dec['mode']}** — “{dec['reason']}”")
        parts.append(head + "\n\n" + "\n".join(f"* {x}" for x in facts) + "\n\n" + calibrate_markdown(cal))
    if not parts:
        raise ReportError("no real-pair calibration report (bench/calibrate/collect.py) with provenance under bench/results")
    return "\n\n".join(parts)


#: harm pairs (baseline right, specprefill wrong) issue 48 item 5 wants before the label-free bars are judged
HARMS_WANTED = 20


def labelfree_table(results: list[Result], base: Path) -> str:
    """The newest `specq bench labelfree` report (by date, then name; older ones stay in the `other` table): what
    was counted, then the confusion tables of the label-free metrics against answer-right labels and the row means
    they imply (specq/bench/labelfree.py)."""
    found = [r for r in results if r.kind == "labelfree" and r.provenance is not None]
    if not found:
        raise ReportError("no `specq bench labelfree` report with provenance under bench/results")
    r = max(found, key=lambda r: (r.date, r.rel))
    d = r.data
    lab, ch, ck, ll = d["labels"], d["choosing"], d["checking"], d["metrics"]["loglik_delta"]
    names = ", ".join(f"`{Path(j['path']).name}`" for j in d["journals"] if j["questions"])
    check_set = ("journals matching " + ", ".join(f"`{g}`" for g in d["check_on"])) if d["check_on"] else "every other journal"
    ll_names = ", ".join(f"`{Path(j).name}`" for j in ll["journals"]) or "no journal"
    head = (f"From {_link(r, base)} (code `{r.code}`, {r.date}): **{d['questions']} graded questions** on {d['documents']} "
            f"documents ({names}); **{lab['harm']} harm** (baseline right, specprefill wrong), {lab['gain']} gain, "
            f"{lab['both-right']} both right, {lab['both-wrong']} both wrong; harms by keep: "
            + ", ".join(f"{k}: {v}" for k, v in d["harms_by_keep"].items())
            + (f" — **{'at least' if lab['harm'] >= HARMS_WANTED else 'fewer than'} the {HARMS_WANTED} harm pairs issue 48 "
               "item 5 asks for**" + ("" if lab["harm"] >= HARMS_WANTED else ", so every rate below is a first look") + "."))
    sets = (f"Choosing set (journals matching {', '.join(f'`{g}`' for g in d['choose_on'])}): {ch['questions']} questions, "
            f"{ch['documents']} documents, {ch['harms']} harms — **in-sample**. Check set ({check_set}): "
            f"{ck['questions']} questions, {ck['documents']} documents, {ck['harms']} harms, after leaving out "
            f"{ck['left_out_shared_documents']} questions about documents the choosing set holds. Rule: {d['rule']}; "
            f"intervals: {d['interval']}. `loglik_delta` has values on {ll['questions']} questions ({ll['documents']} "
            f"documents; {ll_names}).")
    return head + "\n\n" + sets + "\n\n" + labelfree_markdown(d)


#: the command that writes calibrate-service.json and shadow-cost.json (bench/gpu/README.md)
CALSHADOW_COMMAND = "bash bench/gpu/serve.sh calshadow 16384 32"


def _gpu_runs(results: list[Result], kind: str) -> tuple[list[Result], str]:
    """`kind`'s reports with provenance, and the note to print while none of them ran on a GPU."""
    found = [r for r in results if r.kind == kind and r.provenance is not None]
    on_gpu = any(((r.provenance or {}).get("host") or {}).get("gpu") for r in found)
    note = "" if on_gpu else (f"**Not run on a GPU yet**: `{CALSHADOW_COMMAND}` (bench/gpu/README.md) writes the file "
                              "this table is rendered from.")
    return found, note


def calibrate_service_table(results: list[Result], base: Path) -> str:
    """`specq bench calibrate-service` reports (bench/gpu/serve.sh calshadow): questions per minute of a calibration
    run by the service's own workers, wall from the POST to the last unit done, and the seconds per unit."""
    found, note = _gpu_runs(results, "calibrate-service")
    rows = []
    for r in found:
        d, w = r.data, r.data.get("workload", {})
        rows.append([_link(r, base), r.device, f"`{r.code}`", r.date,
                     f"{w.get('docs')} docs × {w.get('questions')} questions × {w.get('doc_tokens', 0):,} tokens, keep "
                     f"{w.get('keep')}, {w.get('max_tokens')} answer tokens", f"{d.get('units_done')}/{d.get('units')}",
                     _f(d.get("wall_s"), "{:.1f}"), f"**{_f(d.get('questions_per_min'), '{:.1f}')}**",
                     _f(d.get("unit_s_p50"), "{:.2f}"), _f(d.get("unit_engine_s_p50"), "{:.2f}"), str(d.get("rows_written", "–"))])
    table = _table(["result", "device", "code", "date", "calibration", "units done", "wall s", "questions/min",
                    "unit s p50 (worker)", "unit s p50 (engine)", "rows written"], "lllllrrrrrr", rows) if rows else ""
    return "\n\n".join(x for x in (note, table) if x)


def shadow_cost_table(results: list[Result], base: Path) -> str:
    """`specq bench shadow-cost --against` reports (bench/gpu/serve.sh calshadow): the same Poisson job list against
    the service without and with shadow checks, jobs/min, client TTFT and the checks inside the window (/metrics)."""
    found, note = _gpu_runs(results, "shadow-cost")
    rows, routing = [], set()
    for r in found:
        d = r.data
        routing.add(str(d.get("routing") or "–"))
        for side in ("without", "with"):
            x = d[side]
            w = (x.get("run") or {}).get("workload", {})
            win = x.get("shadow_window") or {}
            rows.append([_link(r, base), r.device, f"`{r.code}`", f"{x['shadow_rate']:g}",
                         f"{x.get('jobs')} jobs × {w.get('doc_tokens', 0):,} tokens, {w.get('max_tokens')} out, poisson:"
                         f"{x.get('arrival_rate')}/s", _f(x.get("busy_fraction"), "{:.2f}"),
                         f"**{_f(x.get('jobs_per_min'), '{:.1f}')}**", _ms(x.get("client_ttft_ms_p50")),
                         _ms(x.get("client_ttft_ms_p90")), f"{win.get('checks', 0):g} / {win.get('cancelled', 0):g}",
                         f"{_f(win.get('seconds'), '{:.2f}')} ({_f(100 * (x.get('shadow_seconds_share_of_makespan') or 0), '{:.1f}')}%)"])
        q = d.get("ratio_with_over_without") or {}
        rows.append([_link(r, base), "", "", "with / without", "", "", f"**{_f(q.get('jobs_per_min'))}×**",
                     f"{_f(q.get('client_ttft_ms_p50'))}×", f"{_f(q.get('client_ttft_ms_p90'))}×", "", ""])
    parts = [note]
    if rows:
        parts.append(_table(["result", "device", "code", "shadow rate", "workload (identical in both)", "busy",
                             "jobs/min", "client TTFT p50 ms", "p90 ms", "checks in the window / cancelled",
                             "shadow s in the window (of the makespan)"], "llllllrrrrr", rows))
        parts.append("Routing: " + "; ".join(sorted(routing)) + ".")
    return "\n\n".join(x for x in parts if x)


def quality_kinds_table(_results: list[Result], base: Path) -> str:
    """The task kinds' kind x length table (issue 49 item 2) from every kinds answer journal in bench/results
    (JSONL, not the JSON reports `results` holds): specq/bench/kinds_table.py."""
    return kinds_table.table_markdown(kinds_table.rows(RESULTS), base)


def quality_kinds_recall_table(_results: list[Result], base: Path) -> str:
    """Whether the task kinds' evidence is kept (issue 49 item 4) from every kinds recall journal in bench/results:
    specq/bench/kinds_recall_table.py."""
    return kinds_recall_table.table_markdown(kinds_recall_table.rows(RESULTS), base)


def speculator_swap_table(_results: list[Result], base: Path) -> str:
    """Another speculator file against today's: kept-set overlap and answers (specq/bench/speculator_swap.py;
    overlap JSONs and answer journals, not the reports `results` holds)."""
    return speculator_swap.table_markdown(RESULTS, base, REPO)


RENDERERS: dict[str, Renderer] = {
    "structured": structured_table,
    "calibrate-real": calibrate_real_table,
    "labelfree": labelfree_table,
    "calibrate-service": calibrate_service_table,
    "shadow-cost": shadow_cost_table,
    "compose-up": compose_up_table,
    "headline": headline_table,
    "ttft": ttft_table,
    "serve": serve_table,
    "followup": followup_table,
    "goals-50": goals_50_table,
    "speculator-throughput": speculator_throughput_table,
    "other": other_table,
    "history": history_table,
    "quality-answer": quality_answer_table,
    "quality-recall": quality_recall_table,
    "quality-group": quality_group_table,
    "quality-default": quality_default_table,
    "quality-kinds": quality_kinds_table,
    "quality-kinds-recall": quality_kinds_recall_table,
    "speculator-swap": speculator_swap_table,
    "dated-sections": dated_sections,
    "settings": lambda _results, _base: settings_markdown(),
}


def render_text(text: str, base: Path, results: list[Result]) -> str:
    """`text` with every marker block re-rendered (`base`: the folder of the file, for relative links)."""

    def block(m: re.Match) -> str:
        name = m.group(2)
        if name not in RENDERERS:
            raise ReportError(f"<!-- report:{name} --> names no table (known: {', '.join(sorted(RENDERERS))})")
        return m.group(1) + RENDERERS[name](results, base).rstrip("\n") + "\n" + m.group(4)

    return _BLOCK.sub(block, text)


def doc_files(repo: Path = REPO) -> list[Path]:
    """README.md and every docs/**.md."""
    out = []
    for name in DOCS:
        p = repo / name
        out += sorted(p.rglob("*.md")) if p.is_dir() else [p] if p.exists() else []
    return out


def render_all(write: bool, repo: Path = REPO, results: list[Result] | None = None) -> list[Path]:
    """Re-render every marker block; returns the files whose committed text differs (written when
    `write`)."""
    results = load_results() if results is None else results
    changed = []
    for path in doc_files(repo):
        text = path.read_text(encoding="utf-8")
        if "<!-- report:" not in text:
            continue
        new = render_text(text, path.parent, results)
        if new != text:
            changed.append(path)
            if write:
                path.write_text(new, encoding="utf-8")
    return changed


__all__ = ["quality_kinds_table", "quality_kinds_recall_table", "calibrate_real_table", "calibrate_service_table", "shadow_cost_table", "labelfree_table", "compose_up_table", "structured_table", "RENDERERS", "ReportError", "Result", "load_results", "render_text", "render_all", "doc_files"]
