"""Group claims in the worker (#17 item 4): a worker with free slots that claims a job on a stored
document also claims that tenant's queued jobs on the same document and runs them beside it.

Real processes: `specq api` (API keys on: two tenants) and `specq worker --slots 4` on the local Redis
and a throwaway PostgreSQL database, tiny random-weight models on the CPU (one llama.cpp thread),
stale after 8 s and a reconciler sweep every second (fault_helpers.FAULT_ENV). Jobs are submitted
while no worker runs, so a worker that starts finds them all queued.

How a group claim shows: the worker logs `group claim: job L took N more of its document: M1,M2,…`
once per group (its heartbeat also counts `group_claimed`); the store shows every job claimed by that
worker before any finished (start times overlap), attempts = 1 (no job ran twice) and one result row
each (reliability_figures.tally: also no "finished but not saved").

Why the grouped answers equal the ungrouped ones (the `ungrouped` fixture: the same questions with
SPECQ_GROUP_CLAIMS=off and no prompt cache): the stack runs the target in batch-invariant mode
(SPECQ_BATCH_INVARIANT=on; engine/llama/invariance.py) with one llama_decode call per prefill
(SPECQ_CALL_TOKENS=4096), so a job's logits do not depend on which jobs share the loop with it
(tests/test_serving.py checks four co-scheduled jobs against the same jobs alone) nor on whether
its document prefix was restored from the prompt cache or computed (tests/test_doc_cache.py::
test_questions_arriving_together_prefill_the_document_once: four questions arriving together, 1 miss +
3 hits, the same tokens as four uncached runs). A group claim changes only which worker claims which
job and when, i.e. exactly those two things; greedy decoding then picks the same tokens.
"""

from __future__ import annotations

import re

import httpx
import pytest

from fault_helpers import FAULT_ENV, job_row, kill9, start_slots_worker, wait_for, worker_logs, workers_reaped
from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

DOC = "".join(f"line {i}: the value of item_{i} is {(i * 7919) % 1000}; " + ("note. " if i % 5 == 0 else "")
              for i in range(40))
QUESTIONS = ["What is the value of item_3?", "Which item has the largest value?", "Sum items 1 to 4.",
             "Is any value repeated?"]
PARAMS = {"mode": "baseline", "max_tokens": 12, "seed": 1}
GROUP_LINE = re.compile(r"group claim: job (job_[0-9a-f]+) took (\d+) more of its document: ([job_0-9a-f,]+)")


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    home = tmp_path_factory.mktemp("groups")
    port = free_port()
    with pg_database() as pg:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), SPECQ_AUTH="keys", **FAULT_ENV,
                       **redis_pg_env(pg, "groups"))
        env.update(SPECQ_BATCH_INVARIANT="on", SPECQ_CALL_TOKENS="4096")  # the equality above needs both
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        st.keys = {t: st.cli("keys", "create", "--tenant", t, check=True).stdout.strip() for t in ("team-a", "team-b")}
        try:
            st.start("api", "api")
            st.wait_healthy()
            yield st
        finally:
            st.stop()


def _client(st: Stack, tenant: str = "team-a") -> httpx.Client:
    return httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": f"Bearer {st.keys[tenant]}"})


@pytest.fixture(autouse=True)
def _reap_workers(stack):
    with workers_reaped(stack):
        yield


def _worker(st: Stack, name: str, slots: int = 4, **env: str):
    return start_slots_worker(st, name, slots, **env)


def _document(client: httpx.Client, text: str = DOC) -> str:
    r = client.post("/v1/documents", json={"text": text})
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def _submit(client: httpx.Client, doc_id: str, question: str, params: dict = PARAMS) -> str:
    r = client.post("/v1/jobs", json={"document_id": doc_id, "question": question, "params": params})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _done(st: Stack, ids: list[str], timeout: float = 240) -> list[dict]:
    with httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": f"Bearer {st.keys['team-a']}"}) as a, \
            httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": f"Bearer {st.keys['team-b']}"}) as b:
        def view(j: str) -> dict:
            r = a.get(f"/v1/jobs/{j}")
            return r.json() if r.status_code == 200 else b.get(f"/v1/jobs/{j}").json()

        def check():
            views = [view(j) for j in ids]
            return views if all(v["status"] in ("succeeded", "failed", "cancelled") for v in views) else None
        return wait_for(check, timeout, f"jobs {ids} finished", interval=0.2)


def _groups(log: str) -> dict[str, list[str]]:
    """{leader: [members]} from a worker's group-claim lines."""
    out: dict[str, list[str]] = {}
    for leader, n, members in GROUP_LINE.findall(log):
        ids = members.split(",")
        assert len(ids) == int(n) and leader not in out, log
        out[leader] = ids
    return out


def _counts(st: Stack, ids: list[str]) -> dict[str, int]:
    from reliability_figures import tally

    from specq.storage import db

    with db.session(st.database_url) as s:
        return tally(s, ids, worker_logs(st))


def _document_of(st: Stack, job_id: str) -> tuple[str, str]:
    """(tenant, document_id) of the job, from the store."""
    from sqlalchemy import select

    from specq.storage import db
    from specq.storage.models import Job, JobInput

    with db.session(st.database_url) as s:
        row = s.execute(select(Job.tenant, JobInput.document_id).join(JobInput, JobInput.job_id == Job.id)
                        .where(Job.id == job_id)).one()
        s.commit()
    return row.tenant, row.document_id


@pytest.fixture(scope="module")
def ungrouped(stack):
    """The four questions about DOC, queued while no worker runs, then a 4-slot worker with group claims
    off and no prompt cache (every job prefills the whole document itself): (ids, views, its log)."""
    with _client(stack) as a:
        doc = _document(a)
        ids = [_submit(a, doc, q) for q in QUESTIONS]
    _worker(stack, "worker-off", SPECQ_GROUP_CLAIMS="off", SPECQ_CACHE_BYTES="0")
    try:
        views = _done(stack, ids)
    finally:
        kill9(stack, "worker-off")
    return ids, views, stack.log("worker-off")


def test_group_claims_off_claims_each_job_by_its_own_message(stack, ungrouped):
    ids, views, log = ungrouped
    assert re.search(r"ready: target .*4 slots, group claims off", log), log[-3000:]  # this tree's worker
    assert _groups(log) == {} and "group claim:" not in log
    assert [v["status"] for v in views] == ["succeeded"] * 4, views
    assert [v["attempts"] for v in views] == [1] * 4
    assert _counts(stack, ids) == {"submitted": 4, "completed": 4, "failed": 0, "duplicated": 0, "lost": 0}


def test_queued_questions_on_one_document_are_group_claimed_and_run_once(stack, ungrouped):
    ref_ids, ref_views, _ = ungrouped
    with _client(stack) as a:
        doc = _document(a)  # the same text: the same document as the ungrouped run's
        ids = [_submit(a, doc, q) for q in QUESTIONS]
        assert all(job_row(stack, j).status == "queued" for j in ids)
        _worker(stack, "worker-on")
        try:
            views = _done(stack, ids)
        finally:
            kill9(stack, "worker-on")
    log = stack.log("worker-on")
    # the first claim (the oldest job, in claim order) took the three others: one group of four
    assert _groups(log) == {ids[0]: ids[1:]}, log[-4000:]
    assert re.search(r"ready: target .*4 slots, group claims on", log), log[-3000:]  # this tree's worker
    assert [v["status"] for v in views] == ["succeeded"] * 4, views
    assert [v["attempts"] for v in views] == [1] * 4  # every job claimed once: no second run
    assert _counts(stack, ids) == {"submitted": 4, "completed": 4, "failed": 0, "duplicated": 0, "lost": 0}
    assert "fenced" not in log
    rows = [job_row(stack, j) for j in ids]
    assert len({r.worker for r in rows}) == 1
    assert max(r.started_at for r in rows) < min(r.finished_at for r in rows)  # they ran together
    # the leader prefilled the document, the three others restored it from the prompt cache
    assert sum(bool(v["result"]["spec"]["cache"]["target"]["hit"]) for v in views) == 3, \
        [v["result"]["spec"]["cache"] for v in views]
    # the same answers as the ungrouped, uncached run (module doc: why they must be equal)
    assert [v["result"]["text"] for v in views] == [v["result"]["text"] for v in ref_views]
    assert [v["result"]["usage"]["completion_tokens"] for v in views] == \
        [v["result"]["usage"]["completion_tokens"] for v in ref_views]
    assert ref_ids != ids


@pytest.mark.parametrize("hold", [0, 30])
def test_a_group_hold_waits_for_slots_so_a_documents_questions_start_together(stack, hold):
    """SPECQ_GROUP_HOLD. A 2-slot worker runs document A's two questions as a group: one ends after 2
    tokens, the other decodes 400 (ignore_eos). Document B's two questions are queued behind them. When
    the short one's slot frees, B's first question is the next claim and B has two queued questions for
    one free slot: with a hold, the delivery waits until the long one ends and claims B's two as one
    group; without (0, the default), B's first takes the free slot alone while A's long one runs."""
    short = {**PARAMS, "max_tokens": 2}
    long = {"mode": "baseline", "max_tokens": 400, "ignore_eos": True, "seed": 1}
    with _client(stack) as a:
        doc_a, doc_b = _document(a, DOC + f"# hold {hold}: a\n"), _document(a, DOC + f"# hold {hold}: b\n")
        a1, a2 = _submit(a, doc_a, QUESTIONS[0], short), _submit(a, doc_a, QUESTIONS[1], long)
        b1, b2 = _submit(a, doc_b, QUESTIONS[2]), _submit(a, doc_b, QUESTIONS[3])
        name = f"worker-hold{hold}"
        _worker(stack, name, slots=2, SPECQ_GROUP_HOLD=str(hold))
        try:
            views = _done(stack, [a1, a2, b1, b2])
        finally:
            kill9(stack, name)
    log = stack.log(name)
    assert [v["status"] for v in views] == ["succeeded"] * 4 and [v["attempts"] for v in views] == [1] * 4, views
    assert _counts(stack, [a1, a2, b1, b2]) == {"submitted": 4, "completed": 4, "failed": 0, "duplicated": 0, "lost": 0}
    found = _groups(log)
    assert found.get(a1) == [a2], log[-4000:]
    rows = {j: job_row(stack, j) for j in (a1, a2, b1, b2)}
    assert rows[a1].finished_at < rows[a2].finished_at  # the short one freed its slot first
    if hold:
        assert found.get(b1) == [b2], log[-4000:]  # B's questions started together, one group
        assert "holding the claim up to 30.0s until 2 slots are free (1 now)" in log, log[-4000:]
        assert min(rows[b1].started_at, rows[b2].started_at) >= rows[a2].finished_at
    else:
        assert b1 not in found and b2 not in found and "holding the claim" not in log, log[-4000:]
        assert rows[b1].started_at < rows[a2].finished_at  # it took the short one's slot at once


def test_auto_runs_a_group_claim_as_one_group_sparse_prefill(stack):
    """Mode auto's rule 1a end to end: a worker's group claim of four questions about a stored document
    tells its engine loop they came together, and auto runs them as one group-sparse prefill (on this
    CPU only with SPECQ_AUTO_GROUP_MIN_TOKENS set: no CPU length was measured to win, engine/policy/auto.py;
    and with SPECQ_GROUP_SPARSE=on, which is opt-in),
    where quality is allowed (SPECQ_AUTO_QUALITY_MIN_TOKENS=0: the tiny models have no quality row)."""
    params = {"mode": "auto", "max_tokens": 6, "seed": 1}
    with _client(stack) as a:
        doc = _document(a, DOC + "# auto group\n")
        ids = [_submit(a, doc, q, params) for q in QUESTIONS]
        _worker(stack, "worker-auto-group", SPECQ_AUTO_MIN_TOKENS="64", SPECQ_AUTO_QUALITY_MIN_TOKENS="0",
                SPECQ_AUTO_GROUP_MIN_TOKENS="64", SPECQ_GROUP_SPARSE="on")
        try:
            views = _done(stack, ids)
            # a later question alone stays on its document's path (rule 1a: grouped before)
            (later,) = _done(stack, [_submit(a, doc, "Which item has the smallest value?", params)])
        finally:
            kill9(stack, "worker-auto-group")
    log = stack.log("worker-auto-group")
    assert later["status"] == "succeeded" and later["result"]["spec"]["mode"] == "specprefill", later
    assert "earlier questions ran as a group" in later["result"]["spec"]["reason"], later["result"]["spec"]
    assert _groups(log) == {ids[0]: ids[1:]}, log[-4000:]
    assert [v["status"] for v in views] == ["succeeded"] * 4 and [v["attempts"] for v in views] == [1] * 4, views
    for v in views:
        spec = v["result"]["spec"]
        assert spec["mode"] == "specprefill" and spec["reason"].startswith("auto: group of 4 questions"), spec
        assert v["result"]["group"]["size"] == 4, v["result"].get("group")
    assert sorted(v["result"]["group"]["index"] for v in views) == [0, 1, 2, 3]
    assert _counts(stack, ids) == {"submitted": 4, "completed": 4, "failed": 0, "duplicated": 0, "lost": 0}


def test_two_tenants_with_the_same_text_never_group_together(stack):
    with _client(stack, "team-a") as a, _client(stack, "team-b") as b:
        text = DOC + "# shared by two tenants\n"
        doc_a, doc_b = _document(a, text), _document(b, text)
        assert doc_a != doc_b  # one text, two tenants: two documents
        a1, b1 = _submit(a, doc_a, QUESTIONS[0]), _submit(b, doc_b, QUESTIONS[0])
        a2, b2 = _submit(a, doc_a, QUESTIONS[1]), _submit(b, doc_b, QUESTIONS[1])
        _worker(stack, "worker-tenants")
        try:
            views = _done(stack, [a1, a2, b1, b2])
        finally:
            kill9(stack, "worker-tenants")
    log = stack.log("worker-tenants")
    found = _groups(log)
    # each tenant's first claim took its own other question, never the other tenant's (4 slots would
    # have room for all three others)
    assert found == {a1: [a2], b1: [b2]}, log[-4000:]
    for leader, members in found.items():
        assert {_document_of(stack, j) for j in [leader, *members]} == {_document_of(stack, leader)}
    assert [v["status"] for v in views] == ["succeeded"] * 4 and [v["attempts"] for v in views] == [1] * 4
    assert _counts(stack, [a1, a2, b1, b2])["completed"] == 4
    # the same question on the same text answers the same for both tenants (their caches are apart)
    assert views[0]["result"]["text"] == views[2]["result"]["text"]
    assert views[1]["result"]["text"] == views[3]["result"]["text"]


@pytest.mark.faults
def test_kill9_with_a_group_in_flight_requeues_each_and_completes_each_once(stack):
    """A worker killed while its group decodes: every member is `running` under it with a stale
    heartbeat, the next worker's reconciler requeues each, and each completes exactly once."""
    long = {"mode": "baseline", "max_tokens": 1000, "ignore_eos": True, "seed": 1}
    with _client(stack) as a:
        doc = _document(a, DOC + "# killed\n")
        ids = [_submit(a, doc, q, long) for q in QUESTIONS]
        _worker(stack, "worker-k1")

        def decoding() -> bool:
            rows = [job_row(stack, j) for j in ids]
            return all(r.status == "running" and r.progress_phase == "decode" and r.progress_done >= 5 for r in rows)
        wait_for(decoding, 180, "the group decoding")
        assert _groups(stack.log("worker-k1")) == {ids[0]: ids[1:]}
        kill9(stack, "worker-k1")
        _worker(stack, "worker-k2")
        try:
            views = _done(stack, ids, timeout=400)
        finally:
            kill9(stack, "worker-k2")
    requeued = set(re.findall(r"reconciler: job (job_[0-9a-f]+) requeued", stack.log("worker-k2")))
    assert requeued == set(ids)
    assert _counts(stack, ids) == {"submitted": 4, "completed": 4, "failed": 0, "duplicated": 0, "lost": 0}, views
    assert [v["attempts"] for v in views] == [2] * 4


def test_reclaim_own_never_takes_a_job_live_in_this_process(stack):
    """Storage level, on this stack's PostgreSQL: a job running under this worker's name that is live
    in the process (a group-claimed one whose message arrives) is never claimed again; once it is not
    live, reclaim_own starts a new attempt as before."""
    from specq.storage import claims, db, documents, groups, jobs

    with db.session(stack.database_url) as s:
        doc, _ = documents.put_document(s, tenant="team-a", text=DOC + "# storage\n")
        first = jobs.create_job(s, text="", document_id=doc.id, question="q0", tenant="team-a", queue="storage-q")
        second = jobs.create_job(s, text="", document_id=doc.id, question="q1", tenant="team-a", queue="storage-q")
        lead = claims.claim_next(s, first.id, "host:1", queue="storage-q")
        assert lead is not None and lead.job_id == first.id
        (member,) = groups.claim_group(s, lead.job_id, "host:1", queue="storage-q", limit=3)
        assert member.job_id == second.id and member.token
        live = {lead.job_id, member.job_id}
        assert claims.reclaim_own(s, member.job_id, "host:1", live=live) is None
        assert claims.claim_next(s, member.job_id, "host:1", queue="storage-q", live=live) is None  # nothing queued
        row = jobs.get_job(s, member.job_id)
        assert row.attempts == 1 and row.attempt_token == member.token
        assert jobs.heartbeat(s, member.job_id, token=member.token)  # its attempt still holds it
        again = claims.reclaim_own(s, member.job_id, "host:1", live={lead.job_id})
        assert again and again != member.token and jobs.get_job(s, member.job_id).attempts == 2
