"""Documents as first-class inputs (#17 item 1): stored once per tenant and text (sha256), jobs and
batch lines referencing them by `document_id`, tenant isolation, deletes refused while a job asks about
one, migration 0006 down and up. Storage on SQLite and PostgreSQL; the routes and `specq submit
--questions` against a real `specq api` process (embedded store and broker, API keys on; no worker)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from sqlalchemy import func, inspect, select

from service_helpers import Stack, empty_store, free_port, running, specq_cmd, REPO
from specq.storage import db, documents, jobs, lifecycle
from specq.storage.models import Document, JobInput

DOC = "def add(a, b):\n    return a + b\n" * 20


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path, monkeypatch):
    with empty_store(request.param, tmp_path) as u:
        monkeypatch.setenv("SPECQ_DATABASE_URL", u)
        db.upgrade(u)
        yield u


def test_same_text_same_tenant_is_one_document_and_tenants_never_share(url):
    with db.session(url) as s:
        a1, created1 = documents.put_document(s, tenant="team-a", text=DOC, filename="a.py")
        a2, created2 = documents.put_document(s, tenant="team-a", text=DOC, filename="other-name.py")
        b1, created3 = documents.put_document(s, tenant="team-b", text=DOC)
        assert created1 and not created2 and created3
        assert a1.id == a2.id and b1.id != a1.id and a1.sha256 == b1.sha256
        assert documents.get_document(s, a1.id, tenant="team-b") is None  # as if it did not exist
        assert documents.get_document(s, a1.id, tenant="team-a").text == DOC
        assert documents.get_document(s, a1.id).tenant == "team-a"  # admin scope
        assert [d.id for d in documents.list_documents(s, "team-b")] == [b1.id]
        assert s.scalar(select(func.count()).select_from(Document)) == 2


def test_a_job_references_its_document_and_deletes_wait_for_it(url):
    with db.session(url) as s:
        doc, _ = documents.put_document(s, tenant="team-a", text=DOC)
        job = jobs.create_job(s, text="", document_id=doc.id, question="what does add do?", tenant="team-a")
        raw = s.scalars(select(JobInput).where(JobInput.job_id == job.id)).one()
        assert raw.text == "" and raw.document_id == doc.id and raw.size_bytes == len(DOC.encode())  # stored once
        s.commit()
        inp = jobs.get_input(s, job.id)
        assert inp.text == DOC and inp.question == "what does add do?"
        s.commit()  # the filled-in text is never written back
        assert s.scalars(select(JobInput.text).where(JobInput.job_id == job.id)).one() == ""
        s.commit()
        # another tenant cannot ask about team-a's document
        with pytest.raises(jobs.UnknownDocument):
            jobs.create_job(s, text="", document_id=doc.id, tenant="team-b")
        with pytest.raises(ValueError):
            jobs.create_job(s, text="x", document_id=doc.id, tenant="team-a")
        with pytest.raises(documents.DocumentInUse):
            documents.delete_document(s, doc.id, tenant="team-a")
        assert documents.delete_document(s, doc.id, tenant="team-b") is None
        jobs.mark_failed(s, job.id, "done with it")
        assert documents.delete_document(s, doc.id, tenant="team-a") is True
        assert documents.get_document(s, doc.id) is None
        inp = jobs.get_input(s, job.id)
        assert inp.document_id is None and inp.text == ""
        assert lifecycle.delete_job(s, job.id, tenant="team-a")


def test_batch_requests_reference_documents(url):
    from specq.storage import batches

    with db.session(url) as s:
        doc, _ = documents.put_document(s, tenant="team-a", text=DOC)
        batch = batches.create_batch(s, tenant="team-a")
        ids = batches.add_requests(s, batch.id, [batches.BatchRequest(custom_id=f"q{i}", text="", question=f"q {i}?",
                                                                      document_id=doc.id) for i in range(3)],
                                   tenant="team-a")
        assert [jobs.get_input(s, i).text for i in ids] == [DOC] * 3
        other = batches.create_batch(s, tenant="team-b")
        with pytest.raises(jobs.UnknownDocument):
            batches.add_requests(s, other.id, [batches.BatchRequest(custom_id="x", text="", document_id=doc.id)],
                                 tenant="team-b")


def test_migration_0006_goes_down_and_up(url):
    from alembic import command

    cfg = db.alembic_config(url)
    with db.get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    insp = inspect(db.get_engine(url))
    assert "documents" not in insp.get_table_names()
    assert "document_id" not in {c["name"] for c in insp.get_columns("job_inputs")}
    assert db.upgrade(url, "0006") == "0006"
    assert "documents" in set(inspect(db.get_engine(url)).get_table_names())


# --- the routes and the CLI, against a real API process ----------------------------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    import os

    home = tmp_path_factory.mktemp("documents_api")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port), SPECQ_AUTH="keys", SPECQ_MAX_INPUT_BYTES="4096",
               PYTHONUNBUFFERED="1")
    st = Stack(env=env, port=port, logdir=home)
    st.cli("db", "upgrade", check=True)
    st.keys = {t: st.cli("keys", "create", "--tenant", t, check=True).stdout.strip() for t in ("team-a", "team-b")}
    with running(st, ("api", "api")):
        yield st


def _client(api, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=api.url, timeout=30, headers={"Authorization": f"Bearer {api.keys[tenant]}"})


def test_routes_reuse_ids_and_isolate_tenants(api):
    with _client(api, "team-a") as a, _client(api, "team-b") as b:
        r1 = a.post("/v1/documents", json={"text": DOC, "filename": "add.py"})
        assert r1.status_code == 201, r1.text
        doc = r1.json()
        assert doc["created"] is True and doc["id"].startswith("doc_") and doc["size_bytes"] == len(DOC)
        r2 = a.post("/v1/documents", files={"file": ("again.py", DOC.encode())})
        assert r2.status_code == 200 and r2.json()["id"] == doc["id"] and r2.json()["created"] is False
        rb = b.post("/v1/documents", json={"text": DOC})
        assert rb.status_code == 201 and rb.json()["id"] != doc["id"]
        # team-b never sees, uses or deletes team-a's document
        assert b.get(f"/v1/documents/{doc['id']}").status_code == 404
        assert b.get(f"/v1/documents/{doc['id']}/text").status_code == 404
        assert b.delete(f"/v1/documents/{doc['id']}").status_code == 404
        r = b.post("/v1/jobs", json={"document_id": doc["id"], "question": "steal?"})
        assert r.status_code == 404 and "no document" in r.text
        assert [d["id"] for d in b.get("/v1/documents").json()["data"]] == [rb.json()["id"]]
        # a job on the stored document
        r = a.post("/v1/jobs", json={"document_id": doc["id"], "question": "what does add do?"})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        got = a.get(f"/v1/jobs/{job_id}/document").json()
        assert got["text"] == DOC and got["question"] == "what does add do?"
        assert a.get(f"/v1/jobs/{job_id}").json()["input"]["document_id"] == doc["id"]
        assert a.get(f"/v1/documents/{doc['id']}").json()["jobs"] == 1
        assert a.get(f"/v1/documents/{doc['id']}/text").json()["text"] == DOC
        # exactly one of text and document_id
        assert a.post("/v1/jobs", json={"question": "nothing?"}).status_code == 422
        assert a.post("/v1/jobs", json={"text": DOC, "document_id": doc["id"]}).status_code == 422
        # limits as for job documents
        assert a.post("/v1/documents", json={"text": "x" * 5000}).status_code == 413
        assert a.post("/v1/documents", json={"text": ""}).status_code == 422
        assert a.post("/v1/documents", files={"file": ("b.bin", b"\x00\x01\x02" * 10)}).status_code == 422
        # a queued job holds it
        assert a.delete(f"/v1/documents/{doc['id']}").status_code == 409
        assert a.delete(f"/v1/jobs/{job_id}").status_code == 200  # cancel
        assert a.delete(f"/v1/documents/{doc['id']}").json()["deleted"] is True
        assert a.get(f"/v1/documents/{doc['id']}").status_code == 404


def test_batch_lines_take_document_id(api):
    with _client(api, "team-a") as a, _client(api, "team-b") as b:
        doc = a.post("/v1/documents", json={"text": DOC + "# batch\n"}).json()
        lines = [{"custom_id": f"q{i}", "document_id": doc["id"], "question": f"question {i}?"} for i in range(3)]
        data = "".join(json.dumps(x) + "\n" for x in lines).encode()
        r = a.post("/v1/batches", files={"input": ("qs.jsonl", data)})
        assert r.status_code in (200, 201), r.text
        batch = r.json()
        assert batch["status"] != "failed" and batch["request_counts"]["total"] == 3
        listed = a.get("/v1/jobs", params={"batch_id": batch["id"]}).json()["data"]
        assert {a.get(f"/v1/jobs/{j['id']}/document").json()["text"] for j in listed} == {DOC + "# batch\n"}
        # team-b's line naming team-a's document: the batch fails validation, nothing queued
        r = b.post("/v1/batches", files={"input": ("qs.jsonl", data)})
        body = r.json()
        assert body["status"] == "failed" and body["errors"]["data"][0]["code"] == "unknown_document", body
        both = json.dumps({"custom_id": "x", "text": "hello", "document_id": doc["id"]}).encode()
        body = a.post("/v1/batches", files={"input": ("x.jsonl", both)}).json()
        assert body["status"] == "failed" and body["errors"]["data"][0]["code"] == "missing_text"


def test_submit_questions_makes_one_job_per_question_on_one_document(api, tmp_path):
    doc_file = tmp_path / "lib.py"
    doc_file.write_text(DOC + "# cli\n")
    qs = tmp_path / "qs.txt"
    qs.write_text("What does add do?\n\nIs there a bug?\nName the arguments.\n")
    env = {**api.env, "SPECQ_API_URL": api.url, "SPECQ_API_KEY": api.keys["team-a"]}
    run = subprocess.run(specq_cmd("submit", "--questions", str(qs), str(doc_file), "--max-tokens", "4"),
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    batch_id = run.stdout.strip()
    assert "3 questions" in run.stderr
    with _client(api, "team-a") as a:
        listed = a.get("/v1/jobs", params={"batch_id": batch_id}).json()["data"]
        assert len(listed) == 3
        inputs = [a.get(f"/v1/jobs/{j['id']}").json()["input"] for j in listed]
        assert len({i["document_id"] for i in inputs}) == 1 and None not in {i["document_id"] for i in inputs}
        assert sorted(i["question"] for i in inputs) == ["Is there a bug?", "Name the arguments.", "What does add do?"]
        # each request's custom_id carries its question, so every view of the results says which it answers
        assert sorted(j["custom_id"] for j in listed) == ["q1: What does add do?", "q2: Is there a bug?",
                                                          "q3: Name the arguments."]
        assert listed[0]["params"]["max_tokens"] == 4
    # the same file again: the document is reused
    run = subprocess.run(specq_cmd("submit", "--questions", str(qs), str(doc_file)), env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "already stored" in run.stderr, run.stderr


def test_a_worker_answers_jobs_on_a_stored_document(tiny_models, tmp_path):
    """End to end on the embedded default with a real worker (tiny models): four questions about one
    stored document; the worker reads the document's text, runs mode auto and reuses the target's
    prompt cache from the second question on (one worker process: one engine, one cache)."""
    from service_helpers import base_env, wait_job

    port = free_port()
    env = base_env(tmp_path, tiny_models, SPECQ_API_PORT=str(port), SPECQ_CONCURRENCY="1")
    st = Stack(env=env, port=port, logdir=tmp_path)
    st.cli("db", "upgrade", check=True)
    with running(st, ("api", "api"), ("worker", "worker")):
        with httpx.Client(base_url=st.url, timeout=30) as c:
            doc = c.post("/v1/documents", json={"text": DOC}).json()
            results = []
            for q in ("What does add do?", "Is there a bug?", "Name the arguments.", "What does it return?"):
                job = c.post("/v1/jobs", json={"document_id": doc["id"], "question": q,
                                               "params": {"max_tokens": 2}}).json()
                done = wait_job(c, job["id"], timeout=180)
                assert done["status"] == "succeeded", done
                results.append(done["result"])
    assert all(r["usage"]["prompt_tokens"] > len(DOC) * 0.9 for r in results)  # the document's text was read
    assert all(r["spec"]["mode"] == "baseline" and r["spec"]["reason"].startswith("auto: ") for r in results)
    assert not results[0]["spec"]["cache"]["target"]["hit"]
    for r in results[1:]:
        assert r["spec"]["cache"]["target"]["hit"] and "prompt cache hit" in r["spec"]["reason"], r["spec"]
        assert r["timings_ms"]["cache_restore"] > 0


def test_group_claims_take_the_same_tenants_document_jobs_and_never_one_twice(url):
    """Two workers grouping at once (threads, each its own session): disjoint groups, every job claimed
    exactly once, only the tenant's jobs on that document."""
    import threading

    from specq.storage import groups

    with db.session(url) as s:
        doc, _ = documents.put_document(s, tenant="team-a", text=DOC)
        other, _ = documents.put_document(s, tenant="team-b", text=DOC)  # same text, other tenant
        mine = [jobs.create_job(s, text="", document_id=doc.id, question=f"q{i}", tenant="team-a", queue="q").id
                for i in range(12)]
        theirs = [jobs.create_job(s, text="", document_id=other.id, question="x", tenant="team-b", queue="q").id
                  for _ in range(3)]
        plain = jobs.create_job(s, text=DOC, question="no document", tenant="team-a", queue="q").id
        assert groups.group_candidates(s, plain, queue="q", limit=8) == []
        assert jobs.mark_running(s, mine[0], "w1") and jobs.mark_running(s, mine[1], "w2")
    got: dict[str, list[str]] = {}

    def grab(worker: str, first: str) -> None:
        with db.session(url) as s:
            got[worker] = [c.job_id for c in groups.claim_group(s, first, worker, queue="q", limit=7)]

    ts = [threading.Thread(target=grab, args=(w, j)) for w, j in (("w1", mine[0]), ("w2", mine[1]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    claimed = got["w1"] + got["w2"]
    assert len(claimed) == len(set(claimed)) == 10 and set(claimed) == set(mine[2:])  # each filled up to 7
    assert all(len(v) <= 7 for v in got.values())
    with db.session(url) as s:
        for w, ids in got.items():
            assert all(jobs.get_job(s, i).worker == w and jobs.get_job(s, i).status == "running" for i in ids)
        assert all(jobs.get_job(s, i).status == "queued" for i in theirs + [plain])
        assert groups.claim_group(s, mine[0], "w3", queue="q", limit=8) == []  # nothing left to group
