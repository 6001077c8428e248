"""The real-pair calibration's result file (issue 48's Done-when, bench/calibrate/README.md): after

    SPECQ_DATABASE_URL=sqlite:///FRESH.sqlite nice -n 15 .venv/bin/python -m specq calibrate \\
        --documents bench/calibrate/qs.jsonl --lengths 2048 --local --json --journal JOURNAL > REPORT

this reads REPORT and JOURNAL, lists the store's rows with `specq evidence --json` (same store), runs one
mode-auto job on a 2K document with the models and settings calibrate used and the store's rows loaded as a
worker loads them (worker/evidence.EvidenceWatch: the shipped rows merged with the store's), and writes one
JSON to bench/results (`specq bench report` renders its `calibrate-real` table into docs/quality.md).

Two decisions are recorded: the job as a client would send it (its ~2,030-token prompt is below the CPU
break-even, 2,071 tokens, so auto answers baseline before it reads any evidence), and the same job with
`min_tokens=0` (the break-even waived for this job), which reaches the evidence lookup and names the rows.
The second one is run to the end (its answer and timings are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _loads(path: Path | None) -> dict:
    """The 1-minute load averages sampled every minute during the calibrate run (`HH:MM:SS l1 l5 l15 …`)."""
    if path is None or not path.exists():
        return {}
    ones = [float(line.split()[1]) for line in path.read_text().splitlines() if len(line.split()) > 2]
    return {"samples": len(ones), "mean_1min": round(sum(ones) / len(ones), 2) if ones else None,
            "min_1min": min(ones, default=None), "max_1min": max(ones, default=None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, required=True, help="specq calibrate --json's output")
    ap.add_argument("--journal", type=Path, required=True)
    ap.add_argument("--stderr", type=Path, help="specq calibrate's stderr (its last lines are kept)")
    ap.add_argument("--load-log", type=Path, help="load samples taken during the run, one a minute")
    ap.add_argument("--run-meta", type=Path, help="start/end lines with the load average, written around the run")
    ap.add_argument("--document", type=Path, default=ROOT / "bench" / "calibrate" / "glob.py")
    ap.add_argument("--question", default="Which function of this module returns an iterator instead of a list?")
    ap.add_argument("--answer", default="iglob")
    ap.add_argument("--command", required=True, help="the calibrate command line as run")
    ap.add_argument("--calibrate-code", help="`git describe` of the checkout when the calibrate command started, where it "
                    "differs from what its rows record (specq calibrate before 2026-12-07 took it when the run ended)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    from specq.bench import provenance as pv
    from specq.engine.options import RunParams
    from specq.engine.pipeline import Engine
    from specq.engine.policy.evidence_metrics import answer_matches
    from specq.settings import ServiceSettings
    from specq.storage import db
    from specq.worker.evidence import EvidenceWatch

    start = pv.Start()
    report = json.loads(a.report.read_text())
    units = [json.loads(line) for line in a.journal.read_text().splitlines() if line.strip()]
    units = [u for u in units if "unit" in u]
    secs = [u["seconds"] for u in units]

    listed = subprocess.run([sys.executable, "-m", "specq", "evidence", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env=os.environ)
    if listed.returncode != 0:
        raise SystemExit(f"specq evidence --json: {listed.stderr}")
    evidence = json.loads(listed.stdout)
    stored = [d for d in evidence["data"] if d.get("origin") == "store"]

    opts = ServiceSettings.from_env().engine_options()
    opts.cache_bytes = 0  # as calibrate runs: every pass prefills
    engine = Engine(opts)
    try:
        with db.session() as s:
            EvidenceWatch().refresh(s, engine)
        doc = a.document.read_text(encoding="utf-8")
        doc_tokens = len(engine.target.tokenize(doc, add_special=False, parse_special=False))
        decisions = []
        as_sent = RunParams(question=a.question, mode="auto", task="lookup", max_tokens=32)
        _, mode, _, _, _, spec = engine.prepare(doc, as_sent)
        decisions.append({"params": {"mode": "auto", "task": "lookup", "max_tokens": 32}, "mode": mode,
                          "reason": spec.reason, "ran": False})
        waived = RunParams(question=a.question, mode="auto", task="lookup", max_tokens=32, min_tokens=0)
        t0 = time.perf_counter()
        result = engine.run(doc, waived).to_dict()
        decisions.append({"params": {"mode": "auto", "task": "lookup", "max_tokens": 32, "min_tokens": 0},
                          "mode": result["spec"]["mode"], "reason": result["spec"]["reason"], "ran": True,
                          "text": result["text"], "answer_right": answer_matches(result["text"], a.answer),
                          "prompt_tokens": result.get("usage", {}).get("prompt_tokens"),
                          "seconds": round(time.perf_counter() - t0, 1), "timings_ms": result.get("timings_ms")})
        prov = pv.provenance(engine, start=start, positions=[result["spec"].get("positions", "")],
                             warnings=result.get("warnings", []))
    finally:
        engine.close()

    ids = {w["id"] for w in report["rows"]}
    out = {
        "benchmark": "calibrate-real",
        "about": ("specq calibrate on the real default pair (issue 48's Done-when): its --json report, the rows "
                  "`specq evidence --json` lists from the same store, and mode auto's decision for a 2K document "
                  "of the same key with those rows loaded as a worker loads them. Too few documents and questions "
                  "for any row to pass (a row needs >= 8 documents and >= 40 questions): the run shows the path "
                  "working end to end and measures calibrate's questions per hour, not a certified keep."),
        "command": a.command,
        "calibrate_code": a.calibrate_code or (report["rows"][0]["provenance"].get("git_describe") if report["rows"] else None),
        "calibrate_code_in_rows": report["rows"][0]["provenance"].get("git_describe") if report["rows"] else None,
        "input": "bench/calibrate/qs.jsonl (bench/calibrate/README.md: where its documents come from)",
        "journal": a.journal.resolve().relative_to(ROOT).as_posix() if a.journal.resolve().is_relative_to(ROOT) else str(a.journal),
        "questions": len(units),
        "questions_run_by_this_command": report["ran"],
        "questions_from_journal": report["from_journal"],
        "journal_note": (f"{report['from_journal']} of the {len(units)} questions were run by the first, timing "
                         "invocation of the same command on the same two qs.jsonl lines (same settings key, same "
                         "unit ids) and carried into this journal; their seconds are in it as measured"
                         if report["from_journal"] else ""),
        "seconds_per_question": {"each": secs, "mean": round(sum(secs) / len(secs), 1),
                                 "median": round(_median(secs), 1), "min": min(secs), "max": max(secs)},
        "questions_per_hour": round(3600 / (sum(secs) / len(secs)), 2),
        "report_questions_per_hour": report["questions_per_hour"],
        "report_seconds": report["seconds"],
        "loadavg_during": _loads(a.load_log),
        "run_meta": a.run_meta.read_text().splitlines() if a.run_meta and a.run_meta.exists() else [],
        "stderr_tail": (a.stderr.read_text().replace("\r", "\n").strip().splitlines()[-3:]
                        if a.stderr and a.stderr.exists() else []),
        "calibrate_report": report,
        "evidence_listing": {"stored_rows": stored, "rows_total": len(evidence["data"]),
                             "calibrate_rows_listed": sorted(d["id"] for d in stored if d["id"] in ids),
                             "all_calibrate_rows_listed": ids <= {d["id"] for d in stored}},
        "auto": {"document": a.document.resolve().relative_to(ROOT).as_posix(), "document_source": "CPython 3.11.7 Lib/glob.py",
                 "document_tokens": doc_tokens, "question": a.question, "answer": a.answer, "decisions": decisions},
        "provenance": prov,
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"out": str(a.out), "questions_per_hour": out["questions_per_hour"],
                      "seconds_per_question": out["seconds_per_question"],
                      "decisions": [(d["mode"], d["reason"]) for d in decisions]}, indent=1))


if __name__ == "__main__":
    main()
