"""`specq calibrate`: evidence rows for the loaded model pair on your own documents, no labels needed
(issue 48 item 1; specq/bench/calibrate.py runs it, engine/calibration.py is one question's passes,
docs/quality.md "Calibrate" says what the metrics mean and that their bars are provisional). `--service` sends
the questions to POST /v1/calibrations instead: the service's workers run them (`specq calibrations` follows)."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import typer

from .app import app
from .common import fail, service_settings, with_models
from .output import print_json, print_table


def _floats(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise fail(f"--{what}: a comma-separated list of numbers, not {text!r}") from None
    if not vals:
        raise fail(f"--{what}: give at least one value")
    return vals


def _resolve_ids(questions, local: bool) -> None:
    """`document_id` lines: the stored document's text (the local store with --local, else the service)."""
    need = sorted({q.document_id for q in questions if q.document_id})
    if not need:
        return
    texts: dict[str, str | None] = {}
    if local:
        from ..storage import db, documents

        with db.session() as s:
            for d in need:
                doc = documents.get_document(s, d)
                texts[d] = None if doc is None else doc.text
    else:
        from ..client import ApiError
        from .common import client

        with client() as c:
            for d in need:
                try:
                    texts[d] = c.request("GET", f"/v1/documents/{d}/text", expect=("text",))["text"]
                except ApiError as e:
                    if e.status == 404:
                        texts[d] = None
                    else:
                        raise fail(f"document {d}: {e}") from None
    for q in questions:
        if q.document_id:
            if texts.get(q.document_id) is None:
                raise fail(f"line {q.line}: no stored document {q.document_id!r}")
            q.document = texts[q.document_id]


def _write_rows(rows: list[dict], local: bool) -> list[str]:
    """Each row through the service's POST /v1/evidence (admin key: SPECQ_API_KEY), or the local store."""
    from ..engine.policy.evidence import row_from_dict

    checked = [row_from_dict(r) for r in rows]  # a row that would not validate is never half-written
    ids = []
    if local:
        from ..storage import db, evidence as store

        with db.session() as s:  # all of the group's rows or none
            return [rec.id for rec in store.add_rows(s, [r.as_dict() for r in checked])]
    from ..client import ApiError
    from .common import client

    with client() as c:
        for r in rows:
            try:
                ids.append(c.request("POST", "/v1/evidence", json=r, expect=("id",))["id"])
            except ApiError as e:
                raise fail(f"POST /v1/evidence: {e} (rows are written by an admin key: SPECQ_API_KEY)") from None
    return ids


def _submit(questions, *, edges: list[int], keeps: list[float], n: int, task: str, max_tokens: int, as_json: bool,
            others: dict) -> None:
    """`--service`: the questions as POST /v1/calibrations lines; the service's workers run them."""
    if questions is None:
        raise fail("--service needs --documents (the built-in families are run here only)")
    given = [name for name, v in others.items() if v]
    if given:
        raise fail(f"--service: {', '.join(given)} do not apply (the service's workers run their own models and "
                   "store the rows)")
    lines = []
    for q in questions:
        line = {"document_id": q.document_id} if q.document_id else {"text": q.document}
        line["question"] = q.question
        if q.answer is not None:
            line["answer"] = q.answer
        lines.append(line)
    body = {"lines": lines, "keep": keeps, "n": n, "task": task, "max_tokens": max_tokens}
    if edges:
        body["lengths"] = edges
    from ..client import ApiError
    from .common import client

    try:
        with client() as c:
            made = c.request("POST", "/v1/calibrations", json=body, expect=("id", "progress"))
    except ApiError as e:
        raise fail(f"POST /v1/calibrations: {e} (calibrations are an admin key's: SPECQ_API_KEY)") from None
    if as_json:
        print_json(made)
        return
    typer.echo(made["id"])
    typer.echo(f"{made['progress']['total']} units queued at the lowest priority on the service's workers; "
               f"`specq calibrations show {made['id']}` follows it", err=True)


@app.command("calibrate")
def calibrate_cmd(
    documents: Path = typer.Option(None, "--documents", help="JSONL, one question a line: {\"text\" | \"path\" | \"document_id\", \"question\", \"answer\"?}. Without it: the built-in task families (graded)."),
    target: str = typer.Option(None, help="Target model: registry name or GGUF path (default: SPECQ_TARGET, else the default pair's)."),
    speculator: str = typer.Option(None, help="Speculator model: registry name or GGUF path; must share the target's vocabulary."),
    lengths: str = typer.Option("", help="Comma-separated token lengths. With --documents: the edges documents are grouped under (default 2048,4096,8192,16384,32768; a document goes to the smallest edge >= its tokens). Built-in families: the lengths they are made at (default 4000)."),
    keep: str = typer.Option("0.3", help="Keep fraction(s) to calibrate, comma-separated. One: every document measures it. Several: per length band, the smallest that passes on half of the documents (split by content hash; in-sample rows) is certified on the other half (certified rows: what a job that sets no keep runs); docs/quality.md."),
    n: int = typer.Option(0, help="Questions per length: at most this many from --documents (0 = all), or this many built-in ones (0 = 40: 8 documents x 5; with several --keep values 80, so each half reaches 8 documents)."),
    max_tokens: int = typer.Option(32, help="Tokens each answer generates at most (the teacher-forced pass scores baseline's)."),
    task_kind: str = typer.Option("lookup", "--task", help="The kind of question the lines ask (lookup, two-place, aggregation, review): the rows are that kind's, used by jobs that declare it as params.task; a job that declares none needs every kind's rows (docs/quality.md). The built-in families are lookups."),
    journal: Path = typer.Option(None, help="The resumable journal (default: $SPECQ_HOME/calibrate/<input+settings>.jsonl); rerun the same command to resume."),
    plot_path: Path = typer.Option(None, "--plot", help="Where the PNG goes (default: beside the journal)."),
    local: bool = typer.Option(False, "--local", help="Write the rows into the job store (SPECQ_DATABASE_URL) instead of POSTing them to the running service."),
    service: bool = typer.Option(False, "--service", help="Run the questions on the service's own workers instead of here (POST /v1/calibrations, admin key: SPECQ_API_KEY), at the lowest priority; prints the calibration's id (follow it with `specq calibrations show ID`). Needs --documents; `path` lines are read here and sent as text."),
    as_json: bool = typer.Option(False, "--json", help="Print the report (key, rows, per-length table, journal, PNG) as JSON."),
) -> None:
    """Calibrate mode auto for your model pair: each question runs baseline, specprefill with the same settings,
    and baseline's answer teacher-forced under both contexts; rows of answer_right (where answers exist),
    agreement, token_f1 and loglik_delta are written once a length's questions are all done. Several --keep values:
    per length, the smallest keep that passes on one half of the documents is chosen and certified on the other."""
    from ..bench import calibrate as cal
    from ..contracts import EngineError
    from ..engine.calibration import run_unit
    from ..engine.options import DEFAULT_KEEP, RunParams

    keeps = sorted(set(_floats(keep, "keep")))
    if any(not 0.0 < k <= 1.0 for k in keeps):
        raise fail("--keep: each value must be in (0, 1]")
    edges = [int(x) for x in _floats(lengths, "lengths")] if lengths else []
    if any(e <= 0 for e in edges):
        raise fail("--lengths: positive token counts")
    if n < 0 or max_tokens < 1:
        raise fail("--n must be >= 0 and --max-tokens >= 1")
    from ..engine.options import TASK_KINDS

    if task_kind not in TASK_KINDS or task_kind == "summary":
        raise fail(f"--task: one of {', '.join(k for k in TASK_KINDS if k != 'summary')} (summary rows have no pass bar yet)")
    if documents is None and task_kind != "lookup":
        raise fail("--task: the built-in families are lookups (give --documents for questions of another kind)")
    questions = None
    if documents is not None:
        try:
            questions = cal.read_questions(documents)
        except cal.InputLineError as e:
            raise fail(str(e)) from None
    if service:
        _submit(questions, edges=edges, keeps=keeps, n=n, task=task_kind, max_tokens=max_tokens, as_json=as_json,
                others={"--local": local, "--target": target, "--speculator": speculator, "--journal": journal,
                        "--plot": plot_path})
        return
    if local:
        from ..storage import db
        from .common import service_ready_db

        service_ready_db(upgrade=db.is_sqlite())
    if questions is not None:
        _resolve_ids(questions, local)

    opts = with_models(service_settings().engine_options(), target=target, speculator=speculator)
    opts.cache_bytes = 0  # each pass prefills: a cache hit would change what ran, never the answer
    try:
        from ..engine.pipeline import Engine

        engine = Engine(opts)
        engine.speculator  # refused here, before any question runs, where the vocabularies differ
    except EngineError as e:
        raise fail(str(e)) from None
    count = lambda s: len(engine.target.tokenize(s, add_special=False, parse_special=False))  # noqa: E731
    try:
        if questions is not None:
            cal.assign_lengths(questions, count, edges or cal.DEFAULT_EDGES)
            if n:
                per: dict[int, int] = {}
                kept_q = []
                for q in questions:
                    per[q.length] = per.get(q.length, 0) + 1
                    if per[q.length] <= n:
                        kept_q.append(q)
                questions = kept_q
        else:
            per_length = n or cal.FAMILY_N * (2 if len(keeps) > 1 else 1)  # several keeps: two halves of 8 documents
            questions = cal.family_questions(edges or cal.FAMILY_LENGTHS, per_length, count)
    except cal.InputLineError as e:
        raise fail(str(e)) from None

    from ..engine.policy.evidence_key import model_sha256

    # keep=DEFAULT_KEEP: the settings key as before RunParams.keep became optional (the units carry their own keeps)
    base = RunParams(max_tokens=max_tokens, task=task_kind, keep=DEFAULT_KEEP)
    settings = {"target_sha256": model_sha256(engine.target_path), "speculator_sha256": model_sha256(engine.speculator.path),
                "params": dataclasses.asdict(base), "backend": engine.info.backend}
    skey = cal.settings_key(settings)
    if journal is None:
        from ..config import specq_home

        src = cal.settings_key({"input": str(documents.resolve()) if documents else "families", "edges": edges})
        journal = specq_home() / "calibrate" / f"{src}-{skey}.jsonl"
    jr = cal.CalJournal(journal, skey)
    several = len(set(keeps)) > 1  # keep per band: chosen on one half of the documents, certified on the other

    def planned() -> tuple[list, list[tuple], int]:
        """(bands, (question, keep, role) units, most units left): one keep runs every question; several run
        the next step of each band's choice (bench/calibrate.keep_plan), recomputed from the journal."""
        if not several:
            plan_ = [(q, k, "all") for k in keeps for q in questions]
            return [], plan_, sum(q.unit_id(k) not in jr.units for q, k, _ in plan_)
        return cal.keep_plan(questions, keeps, jr.units)

    bands, plan, left = planned()
    typer.echo(f"journal: {journal} ({len(jr.units)} questions already done)", err=True)
    from ..engine.policy.evidence import PASS_BARS

    bar_ = PASS_BARS["agreement"]
    for b in bands:  # each half is judged on its own: a half below the bar can never pass
        small = [f"{name} half {len(docs)} documents, {n} questions" for name, docs, n in
                 (("choosing", b.choosing, b.choosing_n), ("certifying", b.certifying, b.certifying_n))
                 if len(docs) < bar_.min_documents or n < bar_.min_questions]
        if small:
            typer.echo(f"note: length {b.length}: {'; '.join(small)} (a row needs >= {bar_.min_documents} documents and "
                       f">= {bar_.min_questions} questions, so nothing there can pass or be certified)", err=True)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..bench.quality import cpu_model, git_describe

    code = git_describe()  # the code this process loaded: the tree may be committed to while a long run goes on
    t_run = time.perf_counter()
    ran = 0
    # Ctrl-C can land inside llama.cpp's callbacks, where Python cannot raise it (the exception is swallowed and the
    # run went on to the end, exit 0, under load) or it fails as an engine error. Remember the signal, and end as an
    # interrupt (130) at the next progress report or unit either way.
    interrupted: list[int] = []

    def on_sigint(signum, frame) -> None:
        interrupted.append(signum)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True),
                      transient=True) as bar:
            task = bar.add_task("calibrating", total=left)  # several keeps: at most this many (a band stops at its keep)
            while True:
                todo, seen = [], set()
                for q, k, role in plan:
                    if q.unit_id(k) not in jr.units and q.unit_id(k) not in seen:
                        seen.add(q.unit_id(k))
                        todo.append((q, k, role))
                if not todo:
                    break
                for q, k, role in todo:
                    def progress(phase: str, done: int, total: int, _q=q, _k=k, _r=role) -> None:
                        if interrupted:  # a Ctrl-C that a llama.cpp callback swallowed
                            raise KeyboardInterrupt
                        half = "" if _r == "all" else f" ({_r} half)"
                        bar.update(task, description=f"keep {_k:g}, {_q.length}{half}: {phase} {done}/{total}")

                    params = RunParams(max_tokens=max_tokens, keep=k, task=task_kind)
                    result = run_unit(engine, q.document, q.question, params, progress)
                    jr.add_unit(q.unit_id(k), cal.unit_record(q, k, result))
                    ran += 1
                    bar.advance(task)
                    if interrupted:
                        raise KeyboardInterrupt
                bands, plan, left = planned()
                bar.update(task, total=ran + left)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {len(jr.units)} questions in {journal}; rerun the same command to resume", err=True)
        raise typer.Exit(130) from None
    except (EngineError, ValueError) as e:
        if interrupted:
            typer.echo(f"interrupted: {len(jr.units)} questions in {journal}; rerun the same command to resume", err=True)
            raise typer.Exit(130) from None
        raise fail(f"calibrate: {e} ({len(jr.units)} questions kept in {journal}; rerun to resume)") from None
    finally:
        signal.signal(signal.SIGINT, previous)

    # rows: per (length, keep, role), once every planned question of it is in the journal; per resolved key
    groups: dict[str, list[dict]] = {}
    roles: dict[str, str] = {}
    complete: dict[tuple, bool] = {}
    for q, k, role in plan:
        rec = jr.units.get(q.unit_id(k))
        complete[(q.length, k, role)] = complete.get((q.length, k, role), True) and rec is not None
        if rec is not None:
            gid = cal.role_group(cal.group_id(q.length, k, rec["key"]), role)
            groups.setdefault(gid, []).append(rec)
            roles[gid] = role
    prov = {"command": "specq calibrate " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["calibrate"] else sys.argv[1:]),
            "git_describe": code, "cpu": cpu_model(), "backend": engine.info.backend,
            "target": engine.target_path.name, "speculator": engine.speculator.path.name, "journal": str(journal),
            "input": str(documents) if documents else "built-in families (bench/quality_tasks.py)",
            "note": "label-free metrics' bars are provisional (docs/quality.md, Calibrate)"}
    chosen = {b.length: b.chosen for b in bands}
    written: list[dict[str, Any]] = []
    from ..engine.policy.evidence import length_fails, row_from_dict

    for gid, recs in groups.items():
        length, k, role = recs[0]["length"], recs[0]["keep"], roles[gid]
        if not complete[(length, k, role)]:
            continue
        why = ""
        if role == "choose":
            why = (f"the choosing half of the {length:,}-token band's documents (by content hash): keep "
                   + (f"{k:g} was chosen here" if chosen.get(length) == k else f"{k:g} did not pass here")
                   + f" among {', '.join(f'{x:g}' for x in sorted(set(keeps)))} (specq calibrate)")
        rows = cal.rows_for(recs, source=f"calibrate:{journal}", provenance=prov, in_sample_why=why,
                            certified=role == "certify")
        if gid in jr.posted:
            ids = jr.posted[gid]
        else:
            ids = _write_rows(rows, local)
            jr.add_posted(gid, ids)
        for rid, r in zip(ids, rows):
            written.append({**row_from_dict(r).as_dict(), "id": rid, "role": role})
    table = cal.table_rows(groups, roles)
    for line in table:
        mine = [w for w in written
                if cal.role_group(cal.group_id(w["length"], w["key"]["keep"], w["key"]), w["role"]) == line["group"]]
        line["rows"] = {w["metric"]: {"id": w["id"], "bound": w["bound"], "passes": w["passes"], "fails": w["fails"]}
                        for w in mine}
    keep_bands = []
    for b in bands:
        d = b.as_dict()
        cert = [w for w in written if w["role"] == "certify" and w["length"] == b.length]
        d["certified"] = (None if not cert else
                          {"keep": b.chosen, "passes": not length_fails([row_from_dict(w) for w in cert]),
                           "fails": length_fails([row_from_dict(w) for w in cert]),
                           "rows": {w["metric"]: {"id": w["id"], "value": w["value"], "bound": w["bound"],
                                                  "passes": w["passes"], "fails": w["fails"]} for w in cert}})
        keep_bands.append(d)
    png = plot_path or journal.with_suffix(".png")
    all_recs = [r for recs in groups.values() for r in recs]
    why_no_png = cal.plot(all_recs, png) if all_recs else "nothing calibrated"
    seconds = time.perf_counter() - t_run
    n_units = len({q.unit_id(k) for q, k, _ in plan})
    report = {"object": "calibration", "journal": str(journal), "ran": ran, "from_journal": n_units - ran,
              "questions": n_units, "seconds": round(seconds, 1),
              "questions_per_hour": round(ran / seconds * 3600, 1) if ran and seconds > 0 else None,
              "keys": sorted({json.dumps(recs[0]["key"], sort_keys=True) for recs in groups.values()}),
              "rows": written, "table": table, "png": None if why_no_png else str(png),
              "written_to": "local store" if local else "service (POST /v1/evidence)",
              "keep_per_band": keep_bands if several else None}
    report["keys"] = [json.loads(k) for k in report["keys"]]
    if as_json:
        print_json(report)
        return
    cols = ["length", "keep", *(["half"] if several else []), "documents", "n", "tokens", "answer right", "agreement",
            "token F1", "loglik Δ", "s/question", "rows passing"]
    half = {"all": [], "choose": ["choosing (in-sample)"], "certify": ["certifying"]}
    print_table(cols, [(t["length"], f"{t['keep']:g}", *(half[t["role"]] if several else []), t["documents"], t["n"],
                        f"{t['doc_tokens'][0]:,}-{t['doc_tokens'][1]:,}",
                        "-" if t["answer_right"] is None else f"{t['answer_right']:.3f}", f"{t['agreement']:.3f}",
                        f"{t['token_f1']:.3f}", "-" if t["loglik_delta"] is None else f"{t['loglik_delta']:+.3f}",
                        t["seconds_per_question"],
                        (", ".join(f"{m}{'' if v['passes'] else ' no'}" for m, v in t["rows"].items()) or "not written (n incomplete)"))
                       for t in table])
    if several:
        typer.echo("")
        print_table(["length", "keeps tried on the choosing half", "chosen", "choosing half", "certifying half", "certified"],
                    [(b["length"],
                      ", ".join(f"{t['keep']:g} " + ("pass" if t["passes"] else "pending" if t["passes"] is None else "no")
                                for t in b["tried"]),
                      "-" if b["chosen"] is None else f"{b['chosen']:g}",
                      f"{len(b['choosing_documents'])} docs, {b['choosing_questions']} q",
                      f"{len(b['certifying_documents'])} docs, {b['certifying_questions']} q",
                      b["stage"] if b["certified"] is None else
                      ("passes" if b["certified"]["passes"] else f"fails: {b['certified']['fails']}"))
                     for b in keep_bands])
    for key in report["keys"]:
        typer.echo(f"key: {json.dumps(key, sort_keys=True)}")
    typer.echo(f"{len(written)} rows {'in the local store' if local else 'on the service'}; `specq evidence` lists them; "
               f"{ran} questions run now, {n_units - ran} from the journal", err=True)
    typer.echo(f"plot: {png}" if not why_no_png else why_no_png, err=True)
