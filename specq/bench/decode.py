"""`specq bench decode`: decode tokens/s with drafters none / ngram / model, side by side in one run.

Jobs are built from the files in examples/ (CPython's textwrap.py and the Python license):

* copy-heavy: ``rename`` (return a function with a variable renamed), ``quote`` (quote a paragraph
  word for word);
* free-form: ``explain`` (explain a function in your own words).

Every method runs every job with the same prompt and prefill, greedy, so the output of every drafter
must equal `none`'s token for token (the table says so per row). Decode speed is emitted tokens ÷
decode wall-clock: the run's `decode` phase less the model drafter's own prompt prefill
(`draft_prefill`: in baseline mode the speculator first decodes the whole prompt on its own context),
which is booked separately as `draft_prefill_ms` — it is prompt work, paid once per job, not per
token. Drafting and verification stay in `decode`. `run_bench` also fills `provenance`
(specq/bench/provenance.py) with the engine's numerics.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..engine.options import EngineOptions, RunParams

from . import EXAMPLES


@dataclass(frozen=True)
class DecodeJob:
    name: str
    kind: str  # copy-heavy | free-form
    document: str
    question: str


def _function_source(text: str, name: str) -> str:
    """The source of top-level `def name(...)` in text (up to the next top-level statement)."""
    m = re.search(rf"^def {re.escape(name)}\(.*?(?=^\S)", text, flags=re.S | re.M)
    if not m:
        raise ValueError(f"function {name} not found")
    return m.group(0).rstrip() + "\n"


def _paragraph(text: str, needle: str) -> str:
    for para in re.split(r"\n\s*\n", text):
        if needle in para:
            return para.strip()
    raise ValueError(f"no paragraph contains {needle!r}")


def default_jobs(examples: Path = EXAMPLES) -> list[DecodeJob]:
    code = (examples / "textwrap.py").read_text(encoding="utf-8")
    license_text = (examples / "python-license.txt").read_text(encoding="utf-8")
    dedent = _function_source(code, "dedent")
    # the license's history section up to its release table (a few paragraphs: short prefill on CPU)
    cut = license_text.find("    Release")
    history = license_text[: cut if cut > 0 else 2000]
    assert _paragraph(history, "In May 2000")
    return [
        DecodeJob(
            "rename", "copy-heavy", dedent,
            "Return this function unchanged except that the variable `margin` is renamed to `common_prefix`. "
            "Output only the code.",
        ),
        DecodeJob(
            "quote", "copy-heavy", history,
            "Quote, word for word, the paragraph that says Guido and the Python core development team moved "
            "to BeOpen.com in May 2000. Output only the quoted paragraph.",
        ),
        DecodeJob(
            "explain", "free-form", dedent,
            "Explain in your own words, in a few sentences, what this function does and why.",
        ),
    ]


@dataclass
class Row:
    job: str
    kind: str
    method: str
    tokens: int
    decode_ms: float
    #: the model drafter's own prompt prefill (not in decode_ms); 0 for other drafters
    draft_prefill_ms: float
    tokens_per_s: float
    accept_rate: float
    mean_accepted_len: float
    verify_batches: int
    same_as_none: bool | None
    ratio: float = 0.0
    runs_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d.pop("runs_ms")
        return d


def run_bench(
    opts: EngineOptions,
    *,
    methods: Sequence[str] = ("none", "ngram", "model"),
    jobs: Sequence[DecodeJob] | None = None,
    max_tokens: int = 128,
    n_draft: int = 4,
    draft_min: int = 1,
    p_min: float = 0.0,
    ngram: int = 2,
    repeat: int = 1,
    mode: str = "baseline",
    on_row: Callable[[Row], None] | None = None,
    provenance: dict | None = None,
) -> list[Row]:
    """Run every job with every method (greedy), `repeat` times each; the median decode time counts.
    `provenance`, when given, is filled with the run's provenance (positions, warnings, numerics)."""
    from ..engine.pipeline import Engine
    from .provenance import Start
    from .provenance import provenance as collect

    jobs = list(jobs or default_jobs())
    start = Start()
    engine = Engine(opts)
    rows: list[Row] = []
    positions: list[str] = []
    warnings: list[str] = []
    try:
        if "model" in methods:
            _ = engine.speculator  # load before timing anything
        engine.run("warm up", RunParams(question="ok", max_tokens=4))
        for job in jobs:
            ref: list[int] | None = None
            base_tps = 0.0
            for method in methods:
                times, prefills, result = [], [], None
                for _ in range(max(1, repeat)):
                    params = RunParams(
                        question=job.question, mode=mode, min_tokens=0, max_tokens=max_tokens, temperature=0.0,
                        draft=method, n_draft=n_draft, draft_min=draft_min, p_min=p_min, ngram=ngram,
                    )
                    result = engine.run(job.document, params)
                    prefill = result.timings_ms.get("draft_prefill", 0.0)
                    times.append(result.timings_ms["decode"] - prefill)
                    prefills.append(prefill)
                    positions.append(result.spec.positions)
                    warnings.extend(result.warnings)
                ms = statistics.median(times)
                n = result.usage.completion_tokens
                tps = n / (ms / 1000.0) if ms > 0 else 0.0
                same = None if ref is None else (result.tokens == ref)
                if method == "none" or ref is None:
                    ref = list(result.tokens)
                if method == "none":
                    base_tps = tps
                row = Row(
                    job.name, job.kind, result.draft.method if method != "none" else "none", n, round(ms, 1),
                    round(statistics.median(prefills), 1), round(tps, 2), result.draft.accept_rate, result.draft.mean_accepted_len,
                    result.draft.verify_batches, same, round(tps / base_tps, 2) if base_tps else 0.0, times,
                )
                if method == "auto":
                    row.method = f"auto={row.method}"
                rows.append(row)
                if on_row:
                    on_row(row)
        if provenance is not None:
            provenance.update(collect(engine, positions=positions, warnings=warnings, start=start,
                                      settings={"methods": list(methods), "max_tokens": max_tokens, "n_draft": n_draft,
                                                "draft_min": draft_min, "p_min": p_min, "ngram": ngram,
                                                "repeat": repeat, "mode": mode}))
    finally:
        engine.close()
    return rows
