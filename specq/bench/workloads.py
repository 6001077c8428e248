"""`specq bench serve`'s mixed workload: a job list no server was tuned to (issue 50, item 3).

Each job gets its own document length, drawn log-uniform from a range (`--lengths-mix 4096:65536`: as
many 4-8K prompts as 32-64K ones, the way lengths spread in practice), its own output length, drawn
uniform from a range (`--max-tokens-mix 64:512`), and its send time from the arrival order
(`--arrival poisson:R` for random arrivals). Everything comes from the workload's seed alone, never
from the server, so specq and llama-server driven with one seed get the identical list: the same
documents, lengths, output lengths and offsets. The summary adds client TTFT p90 and, per length band
(by the planned document length, so a job sits in the same band on both sides), jobs, jobs/min,
output tokens/s and TTFT p50/p90.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from .stats import percentile


@dataclass(frozen=True)
class PlannedJob:
    index: int
    #: the document's tokens (about: the text is made for `chars_per_token` characters each)
    doc_tokens: int
    #: output tokens asked for (ignore_eos: exactly this many)
    max_tokens: int
    #: seconds after t=0 the job is sent (None: per-doc, sent when the one before it ended)
    offset_s: float | None


def parse_range(text: str, what: str) -> tuple[int, int]:
    """"LO:HI" -> (LO, HI), 1 <= LO <= HI; a ValueError that names `what` otherwise."""
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        a = b = 0
    if not sep or a < 1 or b < a:
        raise ValueError(f"{what} must be LO:HI with 1 <= LO <= HI (whole numbers), not {text!r}")
    return a, b


def parse_bands(text: str) -> list[int]:
    """"8192,32768" -> [8192, 32768]: the band edges in tokens, increasing."""
    try:
        edges = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        edges = []
    if not edges or any(e < 1 for e in edges) or edges != sorted(set(edges)):
        raise ValueError(f"length bands must be increasing positive token counts, e.g. 8192,32768, not {text!r}")
    return edges


def draw_lengths(n: int, lengths: str, max_tokens: str, seed: int) -> list[tuple[int, int]]:
    """(document tokens, output tokens) of `n` jobs: log-uniform and uniform draws from their own
    seeded streams (so another output range leaves the document lengths as they were)."""
    lo, hi = parse_range(lengths, "--lengths-mix")
    out_lo, out_hi = parse_range(max_tokens, "--max-tokens-mix")
    rl, ro = random.Random(f"lengths:{seed}"), random.Random(f"max-tokens:{seed}")
    return [(min(hi, int(round(math.exp(rl.uniform(math.log(lo), math.log(hi)))))), ro.randint(out_lo, out_hi))
            for _ in range(n)]


def plan(n: int, lengths: str, max_tokens: str, seed: int, offsets: list[float] | None) -> list[PlannedJob]:
    """The job list: lengths from `draw_lengths`, send offsets as given (the arrival order's)."""
    drawn = draw_lengths(n, lengths, max_tokens, seed)
    return [PlannedJob(i, d, m, None if offsets is None else round(offsets[i], 6)) for i, (d, m) in enumerate(drawn)]


def band_name(tokens: int, edges: list[int]) -> str:
    """"<8K", "8K-32K", ">=32K" for edges [8192, 32768] (K = 1024 tokens where it divides)."""
    def k(x: int) -> str:
        return f"{x // 1024}K" if x % 1024 == 0 else str(x)

    for i, e in enumerate(edges):
        if tokens < e:
            return f"<{k(e)}" if i == 0 else f"{k(edges[i - 1])}-{k(e)}"
    return f">={k(edges[-1])}"


def _rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Jobs, jobs/min and output tokens/s over these rows' own span (first sent -> last done), TTFT p50/p90."""
    ok = [r for r in rows if not r.get("error") and r.get("ttft_ms") is not None]
    span = max((r.get("end_s") or 0.0) for r in rows) - min(r["sent_s"] for r in rows) if rows else 0.0
    ttft = [r["ttft_ms"] for r in ok]
    out = sum(int(r.get("output_tokens") or 0) for r in ok)
    return {"jobs": len(rows), "succeeded": len(ok),
            "jobs_per_min": round(len(ok) / span * 60.0, 3) if span > 0 else None,
            "output_tok_s": round(out / span, 3) if span > 0 else None,
            "client_ttft_ms_p50": percentile(ttft, 0.5), "client_ttft_ms_p90": percentile(ttft, 0.9)}


def mixed_summary(rows: list[dict[str, Any]], edges: list[int]) -> dict[str, Any]:
    """Client TTFT p90 over all jobs and, per length band of the planned document length
    (`planned_doc_tokens`), the band's `_rates`: a band's jobs/min is over its own jobs' span."""
    ttft = [r["ttft_ms"] for r in rows if not r.get("error") and r.get("ttft_ms") is not None]
    bands: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["planned_doc_tokens"]):
        bands.setdefault(band_name(int(r["planned_doc_tokens"]), edges), []).append(r)
    return {"client_ttft_ms_p90": percentile(ttft, 0.9), "length_bands": edges,
            "bands": {name: _rates(rs) for name, rs in bands.items()}}


__all__ = ["PlannedJob", "parse_range", "parse_bands", "draw_lengths", "plan", "band_name", "mixed_summary"]
