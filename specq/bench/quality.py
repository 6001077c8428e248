"""`specq bench quality`: does SpecPrefill keep (and answer from) what matters, on real weights?

Two halves, both over the tasks of quality_tasks.py (real text, answer once, depths 0.1–0.9):

* `recall` (speculator only, cheap): per task and scorer, one scoring pass (the engine's own
  `SpecPrefillScorer.score`), then one ranking per chunk rule (`selection.chunk_order`, what
  `select_kept` keeps a prefix of) gives every keep level; a task's evidence is kept when every chunk
  holding an evidence token is. The random control at the same budget is exact: the
  probability that k chunks drawn at random hold all m evidence chunks. Scorers: `windowed` (the
  default), `full` (one window: only run where the document spans more than one window — at one
  window it is the same pass), `sliding`; and, from the windowed pass at no extra cost, two other
  ways of merging window scores (`windowed-max`: each window's scores over its maximum;
  `windowed-z`: each window's scores standardised, (s − mean) / std) to compare with the engine's merge.
  `windowed@W`: the windowed scorer with windows of W document tokens, a window-size arm beside the
  default window (`window`, 0 = the engine's DEFAULT_WINDOW), paired with `windowed` in the report.
* `answer` (target, expensive): closed-book first (the question without the document); tasks answered
  right closed-book are recorded and not run further (left out of the ratio); the others run
  `baseline` and `specprefill` (windowed, keep 0.3 by default) through `Engine.run`, greedy.

Each task's result is one JSON line appended (and fsync'd) to the journal; a rerun with the same
journal skips the tasks it holds for the same settings, so a run of hours can stop and resume.
`report` aggregates journals into the JSON report, the table and the plot (quality_report.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from ..engine.scoring.kept_spans import token_char_bounds
from ..engine.options import SPECULATOR_IMPLS, RunParams, Scorer
from ..engine.scoring.scorer import plan_windows
from ..engine.scoring.selection import CHUNK_RULES, DEFAULT_CHUNK_RULE, chunk_order, window_budget
from . import quality_grade as qg
from . import quality_kinds as qk
from . import quality_tasks as qt
from .quality_report import aggregate, read_journal

Say = Callable[[str], None]


@dataclass
class QualitySettings:
    lengths: list[int] = field(default_factory=lambda: [4000])
    n: int = 200
    start: int = 0
    seed: int = 0
    kinds: list[str] = field(default_factory=lambda: list(qt.KINDS))
    scorers: list[str] = field(default_factory=lambda: ["windowed", "full"])
    keeps: list[float] = field(default_factory=lambda: [0.2, 0.3, 0.5])
    keep: float = 0.3  #: the answer half's keep
    scorer: str = "windowed"  #: the answer half's scorer
    chunk: int = 32
    lookahead: int = 8
    pool: int = 13
    window: int = 0
    max_tokens: int = 24
    #: how chunks are ranked (engine/scoring/selection.py rank_scores); the engine's own rule by default.
    #: Recall also records `<scorer>-<rule>` for every other rule (CHUNK_RULES) from the same pass.
    chunk_rule: str = DEFAULT_CHUNK_RULE
    #: questions per document (quality_tasks.make_family); 0 = one document per task (make_task)
    family: int = 0
    #: recall: also save each task's token scores here (one .npz per task and scorer, with the
    #: document and its token character bounds), so that chunk rules can be compared offline
    #: without scoring again. Not part of the settings key.
    scores_dir: str = ""
    #: recall: take each task's token scores from this directory (saved by `scores_dir`) instead of
    #: scoring again, e.g. to rank an earlier run's scores by a new chunk rule; a task whose saved
    #: document differs is scored anew. Records say `scores_from`. Not part of the settings key.
    scores_from: str = ""
    #: the non-lookup kinds (quality_kinds.py): which side of the document catalogue (tuning | reported)
    split: str = "reported"
    #: answer: native (document, then question) or chat (document and question in one OpenAI user message)
    shape: str = "native"
    #: the non-lookup kinds: questions per kind per document
    per_kind: int = 2
    #: the non-lookup kinds: another document catalogue than bench/kinds-documents.json (tests)
    catalogue: str = ""
    #: the non-lookup kinds generate at least quality_kinds.ANSWER_TOKENS (off: max_tokens alone; tests)
    answer_floor: bool = True
    #: who runs the speculator's windows (EngineOptions.speculator_impl): llama or torch. Part of the settings
    #: key when torch (a journal of one never resumes as the other); baselines_from reuses either's answers
    speculator_impl: str = "llama"

    @property
    def code_kinds(self) -> bool:
        """Whether these settings ask the non-lookup kinds (quality_kinds.py) instead of quality_tasks.py's."""
        return any(k in qk.KINDS for k in self.kinds)

    def check(self) -> None:
        """ValueError for settings no run can follow."""
        if self.code_kinds and any(k not in qk.KINDS for k in self.kinds):
            raise ValueError(f"kinds {', '.join(qk.KINDS)} run apart from {', '.join(qt.KINDS)} (other documents)")
        if self.split not in ("tuning", "reported"):
            raise ValueError("split must be tuning or reported")
        if self.shape not in ("native", "chat"):
            raise ValueError("shape must be native or chat")
        if self.per_kind < 1:
            raise ValueError("per_kind must be >= 1")
        if self.speculator_impl not in SPECULATOR_IMPLS:
            raise ValueError(f"speculator_impl must be one of {', '.join(SPECULATOR_IMPLS)}")

    def key(self, half: str) -> str:
        """What a journal record must match to count as done (not n/start/lengths: they pick tasks)."""
        if half == "recall":
            d = {"seed": self.seed, "kinds": self.kinds, "scorers": self.scorers, "keeps": self.keeps, "chunk": self.chunk,
                 "lookahead": self.lookahead, "pool": self.pool, "window": self.window}
        else:
            d = {"seed": self.seed, "kinds": self.kinds, "keep": self.keep, "scorer": self.scorer, "chunk": self.chunk,
                 "lookahead": self.lookahead, "pool": self.pool, "window": self.window, "max_tokens": self.max_tokens}
        if self.family:  # (left out at 0, so that journals written before families keep their key)
            d["family"] = self.family
        if self.chunk_rule != "mean":  # (journals written before the rule existed ranked by means)
            d["chunk_rule"] = self.chunk_rule
        if self.code_kinds:  # (the lookup kinds' journals keep their key)
            d.update(split=self.split, per_kind=self.per_kind, **({"catalogue": self.catalogue} if self.catalogue else {}),
                     **({} if self.answer_floor else {"answer_floor": False}))
        if self.shape != "native" and half != "recall":
            d["shape"] = self.shape
        if self.speculator_impl != "llama":  # (journals written before the option keep their key)
            d["speculator_impl"] = self.speculator_impl
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


# ----------------------------------------------------------------------------------------- provenance


def git_describe() -> str:
    """`git describe --always --dirty`, except that changes under bench/results (this run's own
    journal and log, once committed) do not make the code dirty."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10, cwd=root)
        name = out.stdout.strip() or "unknown"
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":(exclude)bench/results"], cwd=root, timeout=10)
        return name + ("-dirty" if diff.returncode == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(engine=None, settings: QualitySettings | None = None) -> dict[str, Any]:
    import llama_cpp

    out = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "git_describe": git_describe(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "corpus": qt.corpus_fingerprint(),
    }
    if engine is not None:
        out["engine"] = vars(engine.info)
        out["n_ctx"] = engine.n_ctx
        out["threads"] = engine.options.resolved_threads()
    if settings is not None:
        out["settings"] = asdict(settings)
    return out


# ----------------------------------------------------------------------------------------- journal


class Journal:
    """Append-only JSONL; `done(half, task)` for records with this run's settings key."""

    def __init__(self, path: Path, settings: QualitySettings) -> None:
        self.path = path
        self.settings = settings
        path.parent.mkdir(parents=True, exist_ok=True)
        self._done = {(r.get("half"), r.get("task"), r.get("settings_key")) for r in read_journal(path)}
        self._repair()

    def _repair(self) -> None:
        """A run killed mid-line leaves a torn last line: end it so the next record starts clean."""
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
            if last != b"\n":
                with self.path.open("ab") as f:
                    f.write(b"\n")

    def done(self, half: str, task_id: str) -> bool:
        return (half, task_id, self.settings.key(half)) in self._done

    def append(self, half: str, record: dict) -> None:
        record = {"half": half, "settings_key": self.settings.key(half), **record}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._done.add((half, record["task"], record["settings_key"]))


# ----------------------------------------------------------------------------------------- helpers


def saved_scores(directory: str, task: qt.Task, name: str, n_doc: int, plan_len: int) -> tuple[np.ndarray, int] | None:
    """(scores, windows) saved by save_scores for this task and scorer, or None where there is no file
    or it was saved for another document (another corpus, seed or tokenizer)."""
    path = Path(directory) / f"{task.id}-{name}.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        if str(z["document"]) != task.document or z["scores"].shape != (n_doc,):
            return None
        if "windows" in z:
            windows = int(z["windows"])
        elif name == "windowed":  # saved before the count was: the windowed scorer runs the plan's windows
            windows = plan_len
        else:
            return None
        return z["scores"].astype(np.float32), windows


def _count(engine) -> Callable[[str], int]:
    return lambda s: len(engine.target.tokenize(s, add_special=False, parse_special=False))


class TaskPrompt(NamedTuple):
    prompt: Any  #: engine.prompt.Prompt under the engine's template
    evidence: list[int]  #: the evidence's chunk indices
    pieces: list[bytes]  #: the document tokens' bytes (what the `scope` rule reads)
    bounds: Any  #: where each document token starts, in characters of task.document


def task_prompt(engine, task: qt.Task, params: RunParams) -> TaskPrompt:
    """A task's prompt under the engine's template, with its evidence chunks and document pieces."""
    prompt = engine.tokenize_prompt(task.document, params)
    pieces = engine.target.pieces(prompt.document)
    bounds, _ = token_char_bounds(pieces, task.document)
    return TaskPrompt(prompt, qt.evidence_chunks(bounds, task.evidence, params.chunk), pieces, bounds)


def save_scores(directory: str, task: qt.Task, name: str, scores: np.ndarray, bounds, ev: list[int], chunk: int,
                windows: int) -> None:
    """One task's token scores from one scorer, with what an offline rule needs (document, bounds, evidence)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path / f"{task.id}-{name}.npz", scores=np.asarray(scores, dtype=np.float32), windows=windows,
                        bounds=np.asarray(bounds, dtype=np.int64), evidence_chunks=np.asarray(ev, dtype=np.int64),
                        evidence=np.asarray(task.evidence, dtype=np.int64).reshape(-1, 2), chunk=chunk,
                        document=np.array(task.document), kind=task.kind)


def tasks_for(settings: QualitySettings, length: int, count) -> "Iterator[tuple[qt.Task, str]]":
    """(task, cache scope) in order: tasks start…start+n-1, each its own document (scope ""), or, with
    `family`, families start, start+1, … until n tasks (scope: the family, so the speculator's window
    cache and the target's prompt cache reuse the document's KV for its later questions)."""
    if settings.code_kinds:  # always families: one window of a real file, its questions of every kind asked
        done, f = 0, settings.start
        limit = qk.max_families(length, settings.split, settings.catalogue or None)
        while done < settings.n and f < limit:
            fam = qk.family(f, length, count, kinds=settings.kinds, split=settings.split, seed=settings.seed,
                            per_kind=settings.per_kind, catalogue=settings.catalogue or None)
            for t in fam[: settings.n - done]:
                yield t, t.meta["family"]
            done += len(fam[: settings.n - done])
            f += 1
        return
    if not settings.family:
        for i in range(settings.start, settings.start + settings.n):
            yield qt.make_task(i, length, count, seed=settings.seed, kinds=settings.kinds), ""
        return
    done, f = 0, settings.start
    while done < settings.n:
        fam = [t for t in qt.make_family(f, length, count, seed=settings.seed, per=settings.family) if t.kind in settings.kinds]
        for t in fam[: settings.n - done]:
            yield t, t.meta["family"]
        done += len(fam[: settings.n - done])
        f += 1


def renormalise(scores: np.ndarray, plan: list[tuple[int, int]], how: str) -> np.ndarray:
    """Window scores merged another way than the engine's (× number of keys): `max` divides each
    window's scores by their maximum; `z` standardises them, (s − mean) / std. Both are linear within a
    window, so on a one-window document they select what the engine's merge selects."""
    out = np.array(scores, dtype=np.float64)
    for a, b in plan:
        s = out[a:b]
        if b <= a:
            continue
        if how == "max":
            out[a:b] = s / max(float(s.max()), 1e-30)
        elif how == "z":
            out[a:b] = (s - s.mean()) / max(float(s.std()), 1e-30)
        else:
            raise ValueError(how)
    return out


def evidence_place(scores: np.ndarray, chunk: int, ev: list[int], rule: str, pieces) -> int:
    """How many chunks the engine's selection (selection.chunk_order) must keep to hold all of `ev`:
    the worst evidence chunk's place in the order, plus one. Kept at keep k when it is at most
    window_budget(n_chunks, k), as select_kept keeps."""
    order = chunk_order(scores, chunk, rule, pieces)
    place = np.empty_like(order)
    place[order] = np.arange(order.shape[0])
    return int(max(place[c] for c in ev)) + 1


# ----------------------------------------------------------------------------------------- halves


def scorer_arm(name: str, window: int) -> tuple[str, int]:
    """(scorer, window) of a recall scorer name: `windowed@W` is the windowed scorer with windows of W
    document tokens; any other name runs at the settings' `window`."""
    base, at, size = name.partition("@")
    if not at:
        return name, window
    if base != "windowed" or not size.isdigit() or int(size) < 1:
        raise ValueError(f"scorer {name!r}: a window-size arm is windowed@W with W > 0 document tokens")
    return base, int(size)


def run_recall(engine, settings: QualitySettings, journal: Journal, say: Say = print) -> None:
    arms = {name: scorer_arm(name, settings.window) for name in settings.scorers}  # fails before any work
    count = _count(engine)
    scorer = engine.scorer()
    cache = engine.spec_cache() if settings.family or settings.code_kinds else None
    for L in settings.lengths:
        for task, scope in tasks_for(settings, L, count):
            if journal.done("recall", task.id):
                continue
            params = RunParams(question=task.question, chunk=settings.chunk)
            prompt, ev, pieces, bounds = task_prompt(engine, task, params)
            n_doc = len(prompt.document)
            n_chunks = -(-n_doc // settings.chunk)
            rec: dict[str, Any] = {"task": task.id, "kind": task.kind, "planted": task.planted, "length": L, "depth": task.depth,
                                   "actual_depth": round(task.actual_depth, 4), "doc_tokens": n_doc, "n_chunks": n_chunks,
                                   "evidence_chunks": ev, "answer": task.answer, "source": task.source,
                                   "kept": {}, "rank": {}, "windows": {}, "score_ms": {}}
            if scope:
                rec["family"] = scope
                rec["cache_restored_bytes"] = {}
            size = scorer.window_tokens(prompt, settings.lookahead, settings.window)
            plan = plan_windows(n_doc, size)
            for name in settings.scorers:
                if name == "full" and len(plan) == 1 and "windowed" in rec["kept"]:
                    # one window: the full scorer is the same pass
                    rec["kept"]["full"] = dict(rec["kept"]["windowed"])
                    rec["rank"]["full"] = rec["rank"]["windowed"]
                    rec["windows"]["full"] = 1
                    continue
                base, window = arms[name]
                saved = saved_scores(settings.scores_from, task, name, n_doc, len(plan)) if settings.scores_from else None
                if saved is not None:
                    scores, rec["windows"][name] = saved
                    rec.setdefault("scores_from", {})[name] = settings.scores_from
                else:
                    use = cache.begin() if cache is not None and base != "sliding" else None
                    t0 = time.perf_counter()
                    res = scorer.score(prompt, scorer=base, lookahead=settings.lookahead, pool=settings.pool, window=window,
                                       cache=cache if use is not None else None, scope=scope)
                    rec["score_ms"][name] = round((time.perf_counter() - t0) * 1000.0, 1)
                    if use is not None:
                        rec["cache_restored_bytes"][name] = use.bytes_restored
                    scores, rec["windows"][name] = res.scores, res.windows
                if settings.scores_dir:
                    save_scores(settings.scores_dir, task, name, scores, bounds, ev, settings.chunk, rec["windows"][name])
                variants = {name: (scores, settings.chunk_rule)}
                if name == "windowed":
                    variants["windowed-max"] = (renormalise(scores, plan, "max"), settings.chunk_rule)
                    variants["windowed-z"] = (renormalise(scores, plan, "z"), settings.chunk_rule)
                for rule in CHUNK_RULES:  # the same pass ranked by the other chunk rules
                    if rule != settings.chunk_rule:
                        variants[f"{name}-{rule}"] = (scores, rule)
                for vname, (sc, rule) in variants.items():  # one ranking per variant gives every keep level
                    need = evidence_place(sc, settings.chunk, ev, rule, pieces)
                    rec["kept"][vname] = {str(k): need <= window_budget(n_chunks, k) for k in settings.keeps}
                    rec["rank"][vname] = round(need / n_chunks, 4)
            rec["random"] = {str(k): qt.random_recall(n_chunks, window_budget(n_chunks, k), len(ev))
                             for k in settings.keeps}
            rec["load1"] = round(os.getloadavg()[0], 2)
            rec["t"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            journal.append("recall", rec)
            kept = " ".join(f"{s}:{''.join('1' if v else '0' for v in rec['kept'][s].values())}" for s in rec["kept"])
            say(f"recall {task.id} depth {task.depth} ev {ev} windows {rec['windows']} {kept} "
                f"score {rec['score_ms']} load {rec['load1']}")


def closed_book_question(task: qt.Task) -> str:
    if task.kind in qk.KINDS:
        return qk.closed_book(task)
    return task.question.replace("In the code above, ", "In the Python standard library's source code, ")


def judge(task: qt.Task, text: str) -> dict[str, Any]:
    """An answer's grade as a record holds it: {"correct"} for the lookup kinds; for the others also "score" and
    "grade" (quality_grade.py), and for a summary "correct" None (it has no answer-right) and "ids_named"."""
    if task.kind not in qk.KINDS:
        return {"correct": qt.is_correct(task, text)}
    g = qg.grade(task, text)
    out: dict[str, Any] = {"correct": g.right, "score": round(g.score, 4), "grade": g.detail}
    if task.kind == "summary":
        out["ids_named"] = round(g.score, 4)
        out["fidelity"] = g.fidelity
    return out


def answer_tokens(task: qt.Task, settings: QualitySettings) -> int:
    return max(settings.max_tokens, qk.ANSWER_TOKENS.get(task.kind, 0) if settings.answer_floor else 0)


def _task_record(task: qt.Task, length: int, settings: QualitySettings) -> dict[str, Any]:
    """The fields an answer or group record starts with."""
    return {"task": task.id, "kind": task.kind, "planted": task.planted, "length": length, "depth": task.depth,
            "answer": task.answer, "source": task.source, "settings": {"keep": settings.keep, "scorer": settings.scorer,
                                                                          "chunk_rule": settings.chunk_rule,
                                                                          **({"window": settings.window} if settings.window else {}),
                                                                          **({"shape": settings.shape} if settings.shape != "native" else {})}}


def _closed_book(engine, task: qt.Task, settings: QualitySettings) -> dict[str, Any]:
    """The question asked without its document: {"text", "correct"} (a right one is left out of the ratio)."""
    cb = engine.run("", RunParams(question=closed_book_question(task), mode="baseline", max_tokens=answer_tokens(task, settings)))
    return {"text": cb.text, **judge(task, cb.text)}


def _spec_params(settings: QualitySettings, question: str = "", task: qt.Task | None = None) -> RunParams:
    """The specprefill runs of the answer and group halves (`task`: its answer tokens)."""
    return RunParams(question=question, mode="specprefill", keep=settings.keep, scorer=settings.scorer,
                     lookahead=settings.lookahead, pool=settings.pool, window=settings.window, chunk=settings.chunk,
                     min_tokens=0, max_tokens=answer_tokens(task, settings) if task is not None else settings.max_tokens,
                     chunk_rule=settings.chunk_rule, task=task_kind(task) if task is not None else "")


def task_kind(task: qt.Task) -> str:
    """The kind a task's specprefill run declares (RunParams.task, so its journal's key names it): the lookup
    kinds of quality_tasks.py are all `lookup`."""
    return task.kind if task.kind in qk.KINDS else "lookup"


def evidence_fields(engine, task: qt.Task, prompt, params: RunParams, positions: str, shape: str = "native") -> dict[str, Any]:
    """What an evidence row needs of a record (issue 47 item 3): the full EvidenceKey the specprefill run ran
    with (engine/policy/evidence_key.py: resolved scorer and window, positions, both models' sha256, ...) and the
    document's content hash (rows count questions per document by it)."""
    return {"key": engine.evidence_key(prompt, params, positions, shape).as_dict(),
            "doc_sha256": hashlib.sha256(task.document.encode("utf-8")).hexdigest()}


def baselines_from(path: Path, settings: QualitySettings) -> dict[str, dict]:
    """Task id -> answer record of an earlier answer journal that ran these settings except how
    specprefill scores, ranks and keeps chunks (chunk rule, scorer, window, keep, speculator; so the same tasks, model
    settings and max_tokens): its closed-book and baseline answers do not depend on those, and
    `run_answer(baselines=...)` reuses them (a keep-0.1 arm beside a keep-0.3 run runs specprefill only)."""
    records = read_journal(path)
    windows = {0, settings.window} | {r.get("settings", {}).get("window", 0) for r in records}  # (records keep a set window)
    keeps = {settings.keep} | {r.get("settings", {}).get("keep", settings.keep) for r in records}
    want = {QualitySettings(**{**asdict(settings), "chunk_rule": rule, "scorer": scorer, "window": window, "keep": keep,
                               "speculator_impl": impl}).key("answer")
            for rule in CHUNK_RULES for scorer in typing.get_args(Scorer) for window in windows for keep in keeps
            for impl in SPECULATOR_IMPLS}
    out = {r["task"]: r for r in records
           if r.get("half") == "answer" and r.get("settings_key") in want and "closed_book" in r}
    if not out:
        raise ValueError(f"{path}: no answer records with these settings (seed, kinds, keep, scorer, chunk, max_tokens, family)")
    return out


def run_answer(engine, settings: QualitySettings, journal: Journal, say: Say = print,
               baselines: dict[str, dict] | None = None, baselines_path: str = "") -> None:
    """`baselines` (baselines_from): the closed-book and baseline answers of an earlier run of the same
    tasks, reused instead of run again (recorded as `reused_from`); tasks it lacks run both arms."""
    count = _count(engine)
    for L in settings.lengths:
        for task, scope in tasks_for(settings, L, count):
            if journal.done("answer", task.id):
                continue
            rec = _task_record(task, L, settings)
            old = (baselines or {}).get(task.id)
            if old is not None and (old["closed_book"]["correct"] or "baseline" in old):
                rec["closed_book"] = {**old["closed_book"], "reused_from": baselines_path}
            else:
                old = None
                rec["closed_book"] = _closed_book(engine, task, settings)
            if not rec["closed_book"]["correct"]:
                tokens = answer_tokens(task, settings)
                base = RunParams(question=task.question, mode="baseline", max_tokens=tokens)
                spec = _spec_params(settings, task.question, task)
                chat = [("user", f"{task.document}\n\n{task.question}")] if settings.shape == "chat" else None
                prompt, ev, _, _ = task_prompt(engine, task, spec)
                if chat is not None:  # the key and the kept tokens are the chat prompt's
                    prompt = engine.tokenize_prompt("", spec, messages=chat)
                if old is not None:
                    rec["baseline"] = {**old["baseline"], "reused_from": baselines_path}
                else:
                    rb = engine.run(task.document, base, scope=scope, messages=chat)
                    rec["baseline"] = {"text": rb.text, **judge(task, rb.text), "ttft_ms": round(rb.timings_ms["ttft"], 1),
                                       "cache_restored_bytes": rb.spec.cache.get("bytes_restored", 0)}
                rs = engine.run(task.document, spec, scope=scope, messages=chat)
                kept = set(rs.kept_indices)
                ev_tokens = [prompt.doc_start + c * settings.chunk for c in ev]
                rec["doc_tokens"] = len(prompt.document)
                rec["specprefill"] = {"text": rs.text, **judge(task, rs.text), "ttft_ms": round(rs.timings_ms["ttft"], 1),
                                      # (chat: the evidence's chunks are located in the native prompt only)
                                      "evidence_kept": all(t in kept for t in ev_tokens) if chat is None else None,
                                      "kept_tokens": rs.usage.kept_tokens,
                                      "windows": rs.spec.windows, "cache_restored_bytes": rs.spec.cache.get("bytes_restored", 0)}
                if tokens != settings.max_tokens:
                    rec["max_tokens"] = tokens
                rec.update(evidence_fields(engine, task, prompt, spec, rs.spec.positions, settings.shape))
                if scope:
                    rec["family"] = scope
            rec["load1"] = round(os.getloadavg()[0], 2)
            rec["t"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            journal.append("answer", rec)
            if "baseline" in rec:
                b, s = rec["baseline"], rec["specprefill"]
                say(f"answer {task.id}: closed-book no; baseline {b['correct']} ({b['text'].strip()[:30]!r}, {b['ttft_ms'] / 1000:.1f} s) "
                    f"specprefill {s['correct']} ({s['text'].strip()[:30]!r}, {s['ttft_ms'] / 1000:.1f} s, evidence kept {s['evidence_kept']}) "
                    f"load {rec['load1']}")
            else:
                say(f"answer {task.id}: closed-book right ({rec['closed_book']['text'].strip()[:30]!r}): left out; "
                    f"load {rec['load1']}")


def run_group(engine, settings: QualitySettings, journal: Journal, say: Say = print) -> None:
    """#17 item 4 on real weights: each family's questions (closed-book-right ones left out) served by ONE
    group-sparse prefill (`Engine.run_group`: every question scored, the target prefilled once on the
    union of their kept chunks, each question's tail + answer on top). Same settings as the answer half,
    so each record pairs with that half's baseline and specprefill answers by task id
    (quality_report.group_rows). Journaled per family (a family is one engine call)."""
    if not settings.family and not settings.code_kinds:
        raise ValueError("the group half needs families (--family)")
    count = _count(engine)
    for L in settings.lengths:
        fams: dict[str, list[qt.Task]] = {}
        for task, scope in tasks_for(settings, L, count):
            fams.setdefault(scope, []).append(task)
        for scope, tasks in fams.items():
            todo = [t for t in tasks if not journal.done("group", t.id)]
            if not todo:
                continue
            closed = {t.id: _closed_book(engine, t, settings) for t in todo}
            open_ = [t for t in todo if not closed[t.id]["correct"]]
            results = (engine.run_group(open_[0].document, [t.question for t in open_], _spec_params(settings), scope=scope)
                       if open_ else [])
            by_id = dict(zip((t.id for t in open_), results))
            for task in todo:
                rec = {**_task_record(task, L, settings), "family": scope, "closed_book": closed[task.id]}
                r = by_id.get(task.id)
                if r is not None:
                    p = _spec_params(settings, task.question, task)
                    rec.update(evidence_fields(engine, task, engine.tokenize_prompt(task.document, p), p, r.spec.positions))
                    g = r.group or {}
                    rec["group"] = {"text": r.text, **judge(task, r.text), "size": g.get("size"),
                                    "fallback": g.get("fallback"), "union_kept_fraction": g.get("union_kept_fraction"),
                                    "own_kept_tokens": r.usage.kept_tokens, "ttft_ms": round(r.timings_ms["ttft"], 1),
                                    "wall_ms": g.get("wall_ms")}
                rec["load1"] = round(os.getloadavg()[0], 2)
                rec["t"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                journal.append("group", rec)
            if results:
                g = results[0].group or {}
                right = sum(bool(judge(t, r.text)["correct"]) for t, r in zip(open_, results))
                say(f"group {scope}: {len(open_)} questions, right {right}, union {g.get('union_kept_fraction')}, "
                    f"fallback {g.get('fallback') or 'none'}, wall {(g.get('wall_ms') or 0) / 1000:.1f} s, load {os.getloadavg()[0]:.2f}")


def build_report(journals: list[Path], engine=None, settings: QualitySettings | None = None) -> dict[str, Any]:
    records = [r for p in journals for r in read_journal(p)]
    report = {"benchmark": "quality", "journals": [str(p) for p in journals], "records": len(records),
              "provenance": provenance(engine, settings), **aggregate(records)}
    loads = [r["load1"] for r in records if "load1" in r]
    if loads:
        report["load1_range"] = [min(loads), max(loads)]
    ts = sorted(r["t"] for r in records if "t" in r)
    if ts:
        report["records_span_utc"] = [ts[0], ts[-1]]
    return report
