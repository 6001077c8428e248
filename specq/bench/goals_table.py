"""Issue 50's speed goals, one line per goal and run: the ratio measured against its bar and, where the bar is not
met, the measured part that stops it.

Every number is read from the result file the line names (the runs are chosen below, by hand, as the newest run of
the goal's workload as production runs it; a run made to try a setting that did not become the default is not a
goal's run). What stops a goal is computed from the same file:

* TTFT (`specq bench ttft`): specprefill's TTFT is scoring plus sparse prefill plus the rest; the bar needs
  specprefill ≤ baseline / bar, so with the sparse prefill and the rest as measured, scoring would have to take at
  most that less them ("scoring ≤ N ms"); with scoring free the ratio would be baseline / (specprefill - scoring).
* Follow-up questions (`bench serve`, per-doc arrival, specq beside llama-server from one machine start): the time
  until every document's first question ended (the full prefills) and the rest (the follow-ups), on each side.
* Distinct documents at t=0: jobs/min against llama-server's, and, in a one-slot run, the engine TTFT of the job
  the engine started first against the median job's (a cold start).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Protocol

#: (data, device, code, link text) of a result by its path under the repository (report.py supplies it)
Lookup = Callable[[str, str], tuple[dict, str, str, str]]


class Goal(Protocol):
    def row(self, get: Lookup) -> list[str]: ...


def ttft_row(data: dict, tokens: int) -> dict:
    """The `bench ttft` report's row at `tokens` prompt tokens (ValueError where it has none)."""
    for row in data.get("rows", []):
        if row.get("prompt_tokens") == tokens:
            return row
    raise ValueError(f"no ttft row at {tokens} prompt tokens")


def _met(ok: bool) -> str:
    return "**met**" if ok else "not met"


@dataclass(frozen=True)
class TtftGoal:
    """Specprefill against baseline TTFT, one prompt, as `bench ttft` measures it (its fastest baseline)."""

    what: str
    rel: str
    tokens: int
    bar: float
    note: str = ""

    def row(self, get: Lookup) -> list[str]:
        data, device, code, link = get(self.rel, "result")
        r = ttft_row(data, self.tokens)
        base = r.get("fastest_baseline_ms", r["baseline_ttft_ms"])
        spec = r["specprefill_ttft_ms"]
        ratio = r.get("ratio") or base / spec
        score = (r.get("specprefill_phases_ms") or {}).get("score")
        stops = "–"
        if ratio < self.bar and score is not None:
            rest = spec - score
            need = base / self.bar - rest
            stops = (f"scoring {score:,.0f} ms of {spec:,.0f}; the bar needs scoring ≤ {need:,.0f} ms "
                     f"(with it free: {base / rest:.2f}×)" if need > 0 else
                     f"sparse prefill and the rest alone take {rest:,.0f} ms > {base / self.bar:,.0f}")
        measured = f"{base:,.0f} → {spec:,.0f} ms: **{ratio:.2f}×**"
        return [self.what + (f" ({self.note})" if self.note else ""), f"≥ {self.bar:g}×", measured, _met(ratio >= self.bar),
                stops, link, f"{device}, `{code}`"]


def _phases(jobs: list[dict]) -> tuple[float, float]:
    """(when every document's first question had ended, the rest to the last end), seconds from the start."""
    first = max(j["end_s"] for j in jobs if j.get("question", 0) == 0)
    return first, max(j["end_s"] for j in jobs) - first


@dataclass(frozen=True)
class FollowupGoal:
    """Per-doc arrival: jobs/min and the follow-ups' client TTFT p50 against llama-server's, same machine start."""

    specq: str
    llama: str
    jobs_bar: float = 1.0
    ttft_bar: float = 1.5

    def row(self, get: Lookup) -> list[str]:
        a, device, code, la = get(self.specq, "specq")
        b, _, _, lb = get(self.llama, "llama-server")
        sa, sb = a["summary"], b["summary"]
        jobs = sa["jobs_per_min"] / sb["jobs_per_min"]
        ttft = sa["client_ttft_ms_later_questions_p50"] / sb["client_ttft_ms_later_questions_p50"]
        (fa, ra), (fb, rb) = _phases(a["jobs"]), _phases(b["jobs"])
        measured = (f"jobs/min {sa['jobs_per_min']:.1f} / {sb['jobs_per_min']:.1f}: **{jobs:.2f}×**; follow-up client "
                    f"TTFT p50 {sa['client_ttft_ms_later_questions_p50']:,.0f} / "
                    f"{sb['client_ttft_ms_later_questions_p50']:,.0f} ms: **{ttft:.2f}×**")
        ok = jobs >= self.jobs_bar and ttft <= self.ttft_bar
        stops = (f"first questions (full prefills) done at {fa:.1f} s against {fb:.1f} s; "
                 f"the follow-ups after them {ra:.1f} s against {rb:.1f} s")  # the parts, met or not
        return [f"Per-doc 8 × 8 at 32K (mode {a['workload'].get('mode')})",
                f"jobs/min ≥ {self.jobs_bar:g}×, TTFT ≤ {self.ttft_bar:g}×", measured,
                _met(ok) if ok else ("jobs/min " + _met(jobs >= self.jobs_bar) + ", TTFT " + _met(ttft <= self.ttft_bar)),
                stops, f"{la} · {lb}", f"{device}, `{code}`"]


def _first_started(jobs: list[dict]) -> dict:
    return min(jobs, key=lambda j: ((j.get("trace") or {}).get("engine_start") or float("inf"), j.get("index", 0)))


@dataclass(frozen=True)
class DistinctGoal:
    """All documents distinct and sent at t=0: jobs/min against llama-server's; and, from a run with one slot
    (`single`, serve.sh's second specq run), the first job's engine TTFT against the median job's. With several
    slots the first jobs start together and share the card, so only a one-slot run shows a cold start."""

    specq: str
    llama: str
    single: str = ""
    bar: float = 3.0
    first_bar: float = 1.3
    #: how the one-slot run differs from the workload's, where it does
    note: str = ""

    def row(self, get: Lookup) -> list[str]:
        a, device, code, la = get(self.specq, "specq")
        b, _, _, lb = get(self.llama, "llama-server")
        ratio = a["summary"]["jobs_per_min"] / b["summary"]["jobs_per_min"]
        ok_jobs = ratio >= self.bar
        w = a["workload"]
        measured = f"jobs/min {a['summary']['jobs_per_min']:.1f} / {b['summary']['jobs_per_min']:.1f}: **{ratio:.2f}×**"
        stops = [] if ok_jobs else [f"makespan {a['summary']['makespan_s']:.1f} s against {b['summary']['makespan_s']:.1f} s"]
        links = [la, lb]
        if self.single:
            one, _, _, l1 = get(self.single, "specq, 1 slot")
            links.append(l1)
            ttfts = [j["engine"]["ttft"] for j in one["jobs"] if (j.get("engine") or {}).get("ttft") is not None]
            first_ms, median_ms = _first_started(one["jobs"])["engine"]["ttft"], statistics.median(ttfts)
            ok_first = first_ms / median_ms <= self.first_bar
            measured += (f"; {self.note or '1 slot'}: first job's engine TTFT / median **{first_ms / median_ms:.2f}**")
            if not ok_first:
                stops.append(f"the first job's engine TTFT {first_ms:,.0f} ms against the median's {median_ms:,.0f}")
            status = _met(True) if ok_jobs and ok_first else f"jobs/min {_met(ok_jobs)}, first job {_met(ok_first)}"
        else:
            status = f"jobs/min {_met(ok_jobs)}, first job not measured (no 1-slot run)"
        return [f"{w.get('docs')} distinct documents at t=0, {w.get('doc_tokens', 0):,} tokens",
                f"≥ {self.bar:g}×, first ≤ {self.first_bar:g}× median", measured, status, "; ".join(stops) or "–",
                " · ".join(links), f"{device}, `{code}`"]


def table_rows(goals: list[Goal], get: Lookup) -> list[list[str]]:
    return [g.row(get) for g in goals]


HEADER = ["goal", "bar", "measured", "status", "what stops it (measured; per-doc: its parts)", "result", "device, code"]


_RUN = "bench/results/h100-2026-12-07c"  # one machine start (its README.md: every command)

#: the goals' runs (issue 50, "Goals"): GPU rows are random-weight 7B/14B targets with the 0.5B speculator, run by
#: the PyTorch forward (speculator_impl auto on a GPU) and, per-doc, with the prefill chunk the GPU default now is
GOALS: list[Goal] = [
    FollowupGoal(f"{_RUN}/serve-specq8-save-repeat-chunk4096-cache32G-q8-auto-docs-perdoc-32768.json",
                 f"{_RUN}/serve-llama0-q8-perdoc-32768.json"),
    TtftGoal("7B TTFT at 32K", f"{_RUN}/ttft-7b-torchspec.json", 32653, 3.0),
    TtftGoal("7B TTFT at 128K", f"{_RUN}/ttft-7b-torchspec-128k.json", 130584, 6.0),
    TtftGoal("14B TTFT at 32K", f"{_RUN}/ttft-14b-torchspec.json", 32653, 4.5),
    DistinctGoal(f"{_RUN}/serve-specq8-save-repeat-spectorch-32768.json", f"{_RUN}/serve-llama0-32768.json",
                 f"{_RUN}/serve-specq1-save-repeat-32768.json", note="1 slot: 16 documents, llama.cpp's speculator"),
    TtftGoal("CPU real pair at 4K", "bench/results/cpu-ttft-speculator-impl-2026-12-07-llama.json", 4093, 1.3),
    TtftGoal("CPU real pair at 6K", "bench/results/cpu-ttft-window-2026-12-07-onepass.json", 6158, 1.3),
    TtftGoal("CPU real pair at 8K", "bench/results/cpu-ttft-window-2026-12-07-onepass.json", 8157, 1.3),
    TtftGoal("CPU real pair at 16K", "bench/results/cpu-ttft-speculator-impl-2026-12-07-llama-16k.json", 16385, 1.3),
    TtftGoal("CPU real pair at 6K", "bench/results/cpu-ttft-window-2026-12-07-w4096.json", 6158, 1.3,
             "4,096-token windows, not the default one pass up to 8,192"),
    TtftGoal("CPU real pair at 8K", "bench/results/cpu-ttft-window-2026-12-07-w4096.json", 8157, 1.3,
             "4,096-token windows, not the default one pass up to 8,192"),
    TtftGoal("CPU real pair at 4K", "bench/results/cpu-ttft-speculator-impl-2026-12-07-torch.json", 4093, 1.3,
             "PyTorch speculator, not the CPU's default"),
    TtftGoal("CPU real pair at 8K", "bench/results/cpu-ttft-speculator-impl-2026-12-07-torch.json", 8157, 1.3,
             "PyTorch speculator, not the CPU's default"),
    TtftGoal("CPU real pair at 16K", "bench/results/cpu-ttft-speculator-impl-2026-12-07-torch-16k.json", 16385, 1.3,
             "PyTorch speculator, not the CPU's default"),
]
