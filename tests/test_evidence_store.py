"""Issue 47 item 4: the evidence table (migration 0007, storage/evidence.py), POST/GET /v1/evidence,
`specq evidence`, and workers that load rows at start and again when the table changes (no restart).
Storage on SQLite and PostgreSQL; the routes, the CLI and a worker as real processes (tiny models)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from evidence_helpers import DOC, migration_round_trip, tiny_evidence_key, url  # noqa: F401 (url: a fixture)
from service_helpers import Stack, base_env, free_port, running, specq_cmd, wait_job
from specq.engine.policy import evidence
from specq.storage import db, evidence as store


def _passing(key_dict: dict, **kw) -> dict:
    docs = {f"{i:064x}": {"n": 5, "baseline_right": 4, "arm_right": 4, "both_right": 4} for i in range(8)}
    return {"key": key_dict, "metric": "answer_right", "arm": "specprefill", "length": 1200, "doc_tokens": [200, 5000],
            "documents": docs, "source": "test: injected", "provenance": {"by": "test"}, **kw}


def test_rows_round_trip_and_the_revision_grows(url):
    row = evidence.row_from_dict(_passing(evidence.shipped_rows()[0].key.as_dict()))
    with db.session(url) as s:
        assert store.version(s) == 0 and store.list_rows(s) == []
        store.add_row(s, row.as_dict())
        store.add_row(s, row.as_dict())
        assert store.version(s) == 2
        back = store.list_rows(s)
    again = evidence.row_from_dict(back[0])
    assert again.key == row.key and again.documents == row.documents and again.bound == row.bound and again.passes
    assert back[0]["key"]["target"] == row.key.target and back[1]["revision"] == 2


def test_migration_0007_goes_down_and_up(url):
    migration_round_trip(url, "0007", "quality_evidence")


def test_posted_rows_reach_a_running_worker_without_a_restart(tiny_models, tmp_path):
    """GET lists the shipped rows; a malformed row is refused with the field named (and a bound above its
    counts, or `passes` it does not earn, too); a passing row for the tiny pair posted while the worker
    runs makes its next mode-auto job run specprefill, citing that row; `specq evidence --json` lists it all."""
    key = tiny_evidence_key(tiny_models)
    port = free_port()
    env = base_env(tmp_path, tiny_models, SPECQ_API_PORT=str(port), SPECQ_CONCURRENCY="1", SPECQ_AUTO_MIN_TOKENS="64",
                   SPECQ_CACHE_BYTES="0")
    st = Stack(env=env, port=port, logdir=tmp_path)
    st.cli("db", "upgrade", check=True)
    params = {"window": 256, "max_tokens": 2, "task": "lookup"}  # (declared: an undeclared job needs every kind's rows)
    with running(st, ("api", "api"), ("worker", "worker")):
        with httpx.Client(base_url=st.url, timeout=30) as c:
            listed = c.get("/v1/evidence").json()
            assert listed["version"] == 0 and len(listed["data"]) == len(evidence.shipped_rows())
            assert all(r["origin"] == "shipped" and not r["passes"] for r in listed["data"])

            def ask(q: str) -> dict:
                job = c.post("/v1/jobs", json={"text": DOC, "question": q, "params": params}).json()
                done = wait_job(c, job["id"], timeout=180)
                assert done["status"] == "succeeded", done
                return done["result"]["spec"]

            before = ask("What is the value of item 7?")
            assert before["mode"] == "baseline" and before["reason"].startswith("auto: no specprefill evidence row passes")
            bad = [({**_passing(key), "key": {k: v for k, v in key.items() if k != "pool"}}, "key.pool"),
                   ({**_passing(key), "documents": {"d": {"n": 1, "baseline_right": 2, "arm_right": 0, "both_right": 0}}},
                    "documents.d"),
                   ({**_passing(key), "bound": 1.5}, "bound"),
                   ({**_passing(key, documents={"d": {"n": 5, "baseline_right": 5, "arm_right": 5, "both_right": 5}}),
                     "passes": True}, "passes")]
            for body, field in bad:
                r = c.post("/v1/evidence", json=body)
                assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
                assert r.json()["error"]["message"].startswith(f"evidence row: {field}")
            assert c.post("/v1/evidence", content=b"[1, 2", headers={"content-type": "application/json"}).status_code == 400
            assert c.get("/v1/evidence").json()["version"] == 0  # nothing stored half-way
            r = c.post("/v1/evidence", json=_passing(key))
            assert r.status_code == 201 and r.json()["passes"] and r.json()["id"].startswith("ev_"), r.text
            after = ask("What is the value of item 9?")
            assert after["mode"] == "specprefill", after
            assert "one-off long document" in after["reason"] and "n 40 (8 documents)" in after["reason"]
            listed = c.get("/v1/evidence").json()
            assert listed["version"] == 1 and [r["origin"] for r in listed["data"]].count("store") == 1
    out = subprocess.run(specq_cmd("evidence", "--json"), env=st.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["data"]
    shipped = [r for r in rows if r["origin"] == "shipped"]
    assert len(shipped) == len(evidence.shipped_rows()) and all(set(r["key"]) >= {"max_keep", "positions", "prompt_shape", "backend"} for r in shipped)
    assert [r["in_sample"] for r in shipped].count(True) == sum(r.in_sample for r in evidence.shipped_rows()) == 3
    assert all(r["bound_method"] == evidence.METHOD for r in shipped)
    assert all(len(r["documents"]) <= 4 for r in shipped if r["key"]["task"] == "lookup")
    assert [r for r in rows if r["origin"] == "store"][0]["passes"]
    offline = subprocess.run(specq_cmd("evidence", "--shipped"), env=st.env, capture_output=True, text=True, timeout=120)
    assert offline.returncode == 0 and "4 documents < 8" in offline.stdout and "in-sample (" in offline.stdout, offline


def test_evidence_build_check_and_out(tmp_path):
    """`specq evidence build --check`: the shipped file matches the journals (exit 0); `--out` writes the same
    rows elsewhere and says per row which key fields were filled from defaults."""
    check = subprocess.run(specq_cmd("evidence", "build", "--check"), capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "up to date" in check.stderr, check.stderr
    out = tmp_path / "rows.json"
    built = subprocess.run(specq_cmd("evidence", "build", "--out", str(out)), capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert json.loads(out.read_text()) == json.loads(evidence.SHIPPED_PATH.read_text())
    lines = built.stdout.splitlines()
    assert len(lines) == len(evidence.shipped_rows()) and all("fields filled from defaults: " in ln for ln in lines)
    # the lookup journals before issue 47 predate the key in records (filled from defaults); the kinds journals
    # and the torch speculator's (2026-12-07) record it whole
    old = [ln for ln in lines if ": lookup " in ln and "torchspec" not in ln]
    assert len(old) == 10 and all("max_keep" in ln for ln in old)
    assert all(ln.endswith("fields filled from defaults: none") for ln in lines if ln not in old)
    assert sum("(in-sample)" in ln for ln in lines) == 3


def test_only_admin_keys_write_evidence(tmp_path):
    """SPECQ_AUTH=keys: a tenant key reads GET /v1/evidence but its POST is refused (403), nothing stored;
    an admin key's row is stored (a failing one here: 4 documents)."""
    import os

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(tmp_path), SPECQ_API_PORT=str(port), SPECQ_AUTH="keys", PYTHONUNBUFFERED="1")
    st = Stack(env=env, port=port, logdir=tmp_path)
    st.cli("db", "upgrade", check=True)
    tenant = st.cli("keys", "create", "--tenant", "team-a", check=True).stdout.strip()
    admin = st.cli("keys", "create", "--tenant", "ops", "--admin", check=True).stdout.strip()
    row = evidence.shipped_rows()[0].as_dict()
    with running(st, ("api", "api")):
        def client(key: str) -> httpx.Client:
            return httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": f"Bearer {key}"})

        with client(tenant) as c:
            assert c.get("/v1/evidence").status_code == 200
            r = c.post("/v1/evidence", json=row)
            assert r.status_code == 403, r.text
            assert c.get("/v1/evidence").json()["version"] == 0
        with client(admin) as c:
            r = c.post("/v1/evidence", json={**row, "length": 4001})
            assert r.status_code == 201 and not r.json()["passes"] and "4 documents < 8" in r.json()["fails"], r.text
            assert c.get("/v1/evidence").json()["version"] == 1
