"""Calibration units in the worker (jobs of kind `calibration`: POST /v1/calibrations, storage/calibrations.py).

A unit is claimed like any job (claims.claim_next: at the lowest priority, so every other ready job of the
queue goes first) and runs under the job's watcher (heartbeat, cancel request, time limit, fencing). `run`:

1. plans the calibration once (storage.calibrations.plan: every document counted with this worker's tokenizer,
   units put under their lengths, those beyond `n` skipped); a skipped unit, or one of a failed or cancelled
   calibration, ends as `UnitSkipped` (the job is cancelled with that message);
2. runs the question's three passes in order (engine/calibration.run_unit: baseline, specprefill, then
   baseline's answer teacher-forced under both contexts) in the cache scope `SCOPE` (never a prompt-cache hit
   for a tenant's job), and returns the job's result with the unit's record (engine/policy/calibration_rows
   unit_record), which the runtime stores in the transaction that marks the job succeeded;
3. after that save, `write_rows` stores the rows of every (length, keep) now complete, exactly once
   (storage.calibrations.write_groups, with calibration_rows.validated_rows: the rows `specq calibrate` makes).

With serving slots the unit needs the engine alone (run_unit drives the target's context directly): it takes
the engine once every other job running here has ended, and no job is claimed here meanwhile
(WorkerRuntime.exclusive); units of this process run one at a time.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .. import __version__
from ..contracts import RunCancelled
from ..engine.calibration import run_unit
from ..engine.calibration_lines import document_sha256
from ..engine.options import RunParams
from ..engine.policy import calibration_rows as cr
from ..storage import calibrations as store, db

log = logging.getLogger("specq.worker")

#: the cache scope of calibration runs (real jobs' scopes are tenants)
SCOPE = "specq:calibration"
KIND = store.KIND


class UnitSkipped(RunCancelled):
    """The unit is not run: skipped by the plan, or its calibration failed or was cancelled (the message says)."""


def run(engine, s, job_id: str, text: str, params: RunParams, progress: Callable[[str, int, int], None], stop) -> dict[str, Any]:
    """The unit of job `job_id` (module doc, steps 1-2): the job's result, its record under "calibration"."""
    unit = store.unit_of(s, job_id)
    if unit is None:
        raise UnitSkipped(f"job {job_id} is no unit of a calibration")
    if not unit["error"] and not unit["cancel_requested"] and unit["length"] is None:
        edges = unit["lengths"]

        def length_of(doc: str) -> tuple[int, int | None]:
            tokens = len(engine.target.tokenize(doc, add_special=False, parse_special=False))
            return tokens, cr.length_for(tokens, edges)

        progress("plan", 0, 1)
        store.plan(s, unit["calibration_id"], length_of)
        unit = store.unit_of(s, job_id)
    if unit["cancel_requested"]:
        raise UnitSkipped(f"calibration {unit['calibration_id']} was cancelled")
    if unit["error"]:
        raise UnitSkipped(f"calibration {unit['calibration_id']} failed: {unit['error']}")
    if unit["skipped"]:
        raise UnitSkipped(f"skipped: beyond the calibration's n questions of its length ({unit['length']})")
    t0 = time.perf_counter()
    result = run_unit(engine, text, params.question, params, progress, scope=SCOPE, stop=stop)
    record = cr.unit_record(line=unit["line"], doc=document_sha256(text), length=unit["length"], keep=unit["keep"],
                            question=params.question, result=result,
                            right=cr.graded(unit["answer"], result["baseline"]["text"], result["specprefill"]["text"]))
    record["calibration"] = unit["calibration_id"]
    ms = (time.perf_counter() - t0) * 1000.0
    return {"text": result["specprefill"]["text"], "finish_reason": "stop",
            "usage": {"prompt_tokens": result["prompt_tokens"], "kept_tokens": result["kept_tokens"],
                      "completion_tokens": result["specprefill"]["tokens"]},
            "timings_ms": {"total": ms}, "spec": {"mode": "calibration", "reason": "a calibration unit: baseline, "
                                                  "specprefill, teacher-forced"},
            "calibration": record}


def write_rows(s, worker: str, job_id: str) -> list[str]:
    """Step 3 (module doc): the rows of the unit's calibration's groups that are now complete; their ids."""
    unit = store.unit_of(s, job_id)
    if unit is None:
        return []
    cal_id = unit["calibration_id"]
    rows_of = cr.service_rows(cal_id, specq=__version__, worker=worker)
    ids = store.write_groups(s, cal_id, rows_of)
    if ids:
        log.info("calibration %s: %d evidence rows written (%s)", cal_id, len(ids), ",".join(ids))
    return ids


__all__ = ["run", "write_rows", "UnitSkipped", "SCOPE", "KIND"]
