"""Calibrations' store (storage/calibrations.py, migration 0011) on SQLite and PostgreSQL: a line naming another
tenant's document stores nothing; the plan puts units under their lengths once, skips those beyond `n`, and fails
the calibration on a document longer than every edge; a group's rows are written once all its units are done,
exactly once even when two writers race, and not at all when one would not validate. tests/
test_calibrations_service.py runs it all through the API and a worker."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from evidence_helpers import migration_round_trip, tiny_evidence_key, url  # noqa: F401  (url: the fixture)
from specq.storage import calibrations as cal, db, documents
from specq.storage.models import CalibrationUnit, EvidenceRecord, Job

pytestmark = pytest.mark.engine  # tiny_evidence_key loads the tiny pair


def _create(s, lines, *, keep=(1.0,), n=0, lengths=(1024,), tenant="ops"):
    checked = [{**ln, "line": i} for i, ln in enumerate(lines, 1)]
    return cal.create(s, tenant=tenant, lines=checked, params={"max_tokens": 4, "task": "lookup"}, queue="q",
                      max_attempts=3, limit_bytes=1 << 20,
                      settings={"lengths": list(lengths), "keep": list(keep), "n": n, "task": "lookup", "max_tokens": 4})


def _lines(docs: int, per: int) -> list[dict]:
    return [{"text": f"document {d} " * (d + 1), "question": f"q{q}"} for d in range(docs) for q in range(per)]


def _length_of(edges):
    def length_of(text: str):
        tokens = len(text)  # a stand-in tokenizer: one token per character
        fit = [e for e in edges if e >= tokens]
        return tokens, (fit[0] if fit else None)

    return length_of


def _finish_all(s, cal_id: str, key: dict) -> None:
    """Store a record for every planned unit, as a worker's save_result does (storage.calibrations.store_record)."""
    for u in s.scalars(select(CalibrationUnit).where(CalibrationUnit.calibration_id == cal_id,
                                                     CalibrationUnit.skipped.is_(False))).all():
        rec = {"doc": f"{(u.line - 1) // 5:064x}", "length": u.length, "keep": u.keep, "key": key, "line": u.line,
               "doc_tokens": 100, "seconds": 0.1, "values": {"agreement": 1, "token_f1": 1.0}}
        cal.store_record(u.job_id, rec)(s)
    s.commit()


def _rows_of(records):
    from specq.engine.policy.calibration_rows import validated_rows

    return validated_rows(records, source="test", provenance={"by": "test"})


def test_a_line_naming_another_tenants_document_stores_nothing(url):
    with db.session() as s:
        doc, _ = documents.put_document(s, text="the other tenant's text", tenant="team-a")
        with pytest.raises(cal.LineRefused, match=rf"line 2: no stored document '{doc.id}'"):
            _create(s, [{"text": "mine", "question": "q"}, {"document_id": doc.id, "question": "q"}])
        assert s.scalar(select(func.count()).select_from(Job)) == 0
        assert cal.list_calibrations(s) == []


def test_the_plan_skips_beyond_n_and_fails_on_a_too_long_document(url):
    with db.session() as s:
        c, ids = _create(s, _lines(2, 3), keep=(0.5, 1.0), n=2, lengths=(20, 40))
        assert len(ids) == 12
        cal.plan(s, c.id, _length_of((20, 40)))
        cal.plan(s, c.id, lambda text: pytest.fail("planned twice"))
        units = s.scalars(select(CalibrationUnit).where(CalibrationUnit.calibration_id == c.id)
                          .order_by(CalibrationUnit.keep, CalibrationUnit.line)).all()
        # document 0 (11 characters) under 20, document 1 (22) under 40; 2 of each 3 per (length, keep) run
        assert [(u.line, u.length, u.skipped) for u in units if u.keep == 1.0] == [
            (1, 20, False), (2, 20, False), (3, 20, True), (4, 40, False), (5, 40, False), (6, 40, True)]
        skipped = {u.job_id for u in units if u.skipped}
        assert {j.id: j.status for j in s.scalars(select(Job).where(Job.id.in_(skipped)))} == dict.fromkeys(skipped, "cancelled")
        summary = cal.summary(s, cal.get(s, c.id))
        assert summary["status"] == "queued" and summary["progress"] == {"done": 0, "total": 8, "failed": 0, "skipped": 4}

        bad, _ = _create(s, _lines(2, 1), lengths=(15,))
        cal.plan(s, bad.id, _length_of((15,)))
        summary = cal.summary(s, cal.get(s, bad.id))
        assert summary["status"] == "failed" and summary["error"].startswith(
            "line 2: the document has 22 tokens, more than the largest length edge (15)"), summary
        assert all(j.status == "cancelled" for j in s.scalars(select(Job).join(CalibrationUnit, CalibrationUnit.job_id == Job.id)
                                                              .where(CalibrationUnit.calibration_id == bad.id)))


def test_rows_are_written_once_all_units_are_done_and_exactly_once(url, tiny_models):
    from specq.engine.policy.evidence import row_from_dict

    key = tiny_evidence_key(tiny_models)
    with db.session() as s:
        c, _ = _create(s, _lines(8, 5))
        cal_id = c.id
        cal.plan(s, c.id, _length_of((1024,)))
        assert cal.write_groups(s, c.id, _rows_of) == []  # nothing done yet
        _finish_all(s, c.id, key)
        with pytest.raises(ValueError):  # a row that would not validate: nothing written, the group left open
            cal.write_groups(s, c.id, lambda recs: [row_from_dict({"key": key, "metric": "agreement"}).as_dict()])
        assert s.scalar(select(func.count()).select_from(EvidenceRecord)) == 0

    # two writers at once (the last units' workers, an API read): one writes the group, the other nothing
    got: list[list[str]] = []
    barrier = threading.Barrier(2)

    def writer():
        with db.session() as s2:
            barrier.wait()
            got.append(cal.write_groups(s2, cal_id, _rows_of))

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(len(g) for g in got) == [0, 2], got  # agreement and token_f1 rows, once
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(EvidenceRecord)) == 2
        summary = cal.summary(s, cal.get(s, cal_id))
        assert summary["status"] == "succeeded" and summary["rows_written"] == {"1024:1": sorted(got, key=len)[1]}
        assert cal.write_groups(s, cal_id, _rows_of) == []


def test_migration_0011_goes_down_and_up(url):
    migration_round_trip(url, "0011", "calibrations")
