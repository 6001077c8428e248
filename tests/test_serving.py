"""Serving slots with real processes: one worker process runs several jobs at once (specq/engine/serving/loop.py).

`specq api` + `specq worker --slots N` on the local Redis and a throwaway PostgreSQL database, tiny
random-weight models on the CPU (one llama.cpp thread). Fault settings as in the reliability tests
(fault_helpers.FAULT_ENV: stale after 8 s, reconciler every second).

Why several jobs decoded together return exactly the text each returns alone: the stack runs the
target in batch-invariant mode (SPECQ_BATCH_INVARIANT=on; off is the CPU default; engine/llama/invariance.py: no repacking, flash attention with a q8_0 K
cache, which takes one per-row path for every batch size) and the loop keeps each job's kernels as
they are alone: its own KV stream (cells in position order, no other job's cells), the prefill
chunks in batches of their own, and, for these F16 models, each job's decode rows in a batch of
their own (serving.invariant_rows; a K-quant target shares batches of up to 7 rows). Scoring runs
whole per job in the speculator's own context. So every logit, hence greedy and seeded sampled
tokens alike, is bit-identical.
"""

from __future__ import annotations

import json
import re
import signal

import httpx
import pytest

from fault_helpers import (FAULT_ENV, job_row, kill9, start_seamed_worker, start_slots_worker, wait_for, worker_logs,
                           workers_reaped)
from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers

pytestmark = [pytest.mark.timeout(600)]

QUESTION = "What does the code do?"
DOCS = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" * (4 + 2 * i) for i in range(4)]
#: the four jobs: greedy baseline, specprefill (two windows), n-gram drafting, seeded sampling
#: (ignore_eos: each decodes its 600 tokens, so the four overlap even when a loaded machine claims
#: them ~0.3 s apart; with 120 tokens and an early EOS one finished before the last started)
PARAMS = [
    {"mode": "baseline", "max_tokens": 600, "seed": 1, "ignore_eos": True},
    {"mode": "specprefill", "min_tokens": 0, "window": 64, "max_tokens": 600, "seed": 1, "ignore_eos": True},
    {"mode": "baseline", "draft": "ngram", "max_tokens": 600, "seed": 1, "ignore_eos": True},
    {"mode": "baseline", "temperature": 0.8, "max_tokens": 600, "seed": 7, "ignore_eos": True},
]
LONG = {"mode": "baseline", "max_tokens": 1500, "seed": 3}


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    home = tmp_path_factory.mktemp("serving")
    port = free_port()
    with pg_database() as pg:
        env = base_env(home, tiny_models, SPECQ_API_PORT=str(port), **FAULT_ENV, **redis_pg_env(pg, "serving"))
        env["SPECQ_N_CTX"] = "8192"
        env["SPECQ_BATCH_INVARIANT"] = "on"  # the equality above needs it
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        try:
            st.start("api", "api")
            st.wait_healthy()
            yield st
        finally:
            st.stop()


@pytest.fixture(autouse=True)
def _reap_workers(stack):
    with workers_reaped(stack):
        yield


def _worker(st: Stack, name: str, slots: int, **env: str):
    return start_slots_worker(st, name, slots, **env)


def _submit(client: httpx.Client, text: str, params: dict, question: str = QUESTION) -> str:
    r = client.post("/v1/jobs", json={"text": text, "question": question, "params": params})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _done(client: httpx.Client, ids: list[str], timeout: float = 240) -> list[dict]:
    def check():
        views = [client.get(f"/v1/jobs/{j}").json() for j in ids]
        return views if all(v["status"] in ("succeeded", "failed", "cancelled") for v in views) else None
    return wait_for(check, timeout, f"jobs {ids} finished", interval=0.2)


def _running_together(st: Stack, ids: list[str]) -> bool:
    rows = [job_row(st, j) for j in ids]
    return all(r.status == "running" and r.progress_phase == "decode" and r.progress_done >= 5 for r in rows)


@pytest.mark.parametrize("score_thread", ["off", "on"])
def test_four_jobs_run_at_once_and_each_returns_its_text_alone(stack, score_thread):
    # score_thread on: the GPU default (engine/serving/score_thread.py), here on the CPU: the specprefill job is
    # scored on a thread of its own while the others decode, and still returns its text alone.
    # Prompt cache off: the four jobs run again on the documents run alone, so with it on they would
    # restore the cached prompt and recompute only its last token. That changes the last token's logits
    # at rounding level (equal within tolerance: tests/test_doc_cache.py) on CPUs without AVX-512
    # (seen on a 2-core AVX2 AMD EPYC, 2026-12-02), enough to flip the seeded sampling of job 3; this
    # test is about co-scheduling in slots, not about the cache.
    _worker(stack, "worker-four", 4, SPECQ_CACHE_BYTES="0", SPECQ_SCORE_THREAD=score_thread)
    where = "its own thread" if score_thread == "on" else "the engine thread"
    assert f"scoring on {where}" in stack.log("worker-four")
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        alone = []
        for doc, params in zip(DOCS, PARAMS):  # one at a time: nothing shares a batch with them
            (view,) = _done(client, [_submit(client, doc, params)])
            assert view["status"] == "succeeded", view
            alone.append(view["result"]["text"])
        # the four wait in the queue for a fresh worker, which takes them at once: submitted one by one to
        # a running worker, the first could finish before the fourth is claimed on a loaded machine
        kill9(stack, "worker-four")
        ids = [_submit(client, doc, params) for doc, params in zip(DOCS, PARAMS)]
        _worker(stack, "worker-four-b", 4, SPECQ_CACHE_BYTES="0", SPECQ_SCORE_THREAD=score_thread)
        views = _done(client, ids)
        metrics = client.get("/metrics").text
    assert [v["status"] for v in views] == ["succeeded"] * 4, views
    rows = [job_row(stack, j) for j in ids]
    # the four ran at the same time: every one started before any one finished
    assert max(r.started_at for r in rows) < min(r.finished_at for r in rows), [(r.started_at, r.finished_at, r.worker) for r in rows]
    assert len({r.worker for r in rows}) == 1
    assert [v["result"]["text"] for v in views] == alone
    for v in views:
        t = v["result"]["timings_ms"]
        assert {"slot_wait", "interleave_wait", "decode_engine", "tokenize_engine"} <= set(t)
        assert t["decode_engine"] <= t["decode"] + 1.0
    assert views[1]["result"]["spec"]["windows"] >= 2
    assert "specq_worker_slots{" in metrics and "specq_worker_kv_cells_used{" in metrics
    kill9(stack, "worker-four-b")


def test_cancel_one_mid_decode_and_a_failing_one_leave_the_others_alone(stack):
    """One job cancelled while it decodes, one whose decode batches fail (the loop's `fails` test seam,
    injected by tests/seamed_worker.py; on both attempts): the two others finish. Batch-invariant mode
    off, so the four jobs' decode rows share batches: the failing batch is rolled back and each job
    decoded alone, and only the faulty one fails."""
    start_seamed_worker(stack, "worker-faults", 4, fails="FAIL ME", SPECQ_BATCH_INVARIANT="off")
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        victim = _submit(client, DOCS[1], LONG)
        failing = _submit(client, DOCS[2], LONG, question="FAIL ME")
        others = [_submit(client, DOCS[0], PARAMS[0]), _submit(client, DOCS[3], PARAMS[3])]
        wait_for(lambda: (j := job_row(stack, victim)).progress_phase == "decode" and j.progress_done >= 20, 120,
                 "victim decoding")
        assert client.delete(f"/v1/jobs/{victim}").json()["cancel_requested"] is True
        views = _done(client, [victim, failing, *others])
    assert [v["status"] for v in views] == ["cancelled", "failed", "succeeded", "succeeded"], views
    assert "injected by the loop's `fails` test seam" in views[1]["error"]
    assert all(v["result"]["usage"]["completion_tokens"] > 0 for v in views[2:])
    log = stack.log("worker-faults")
    assert "decoding each alone" in log
    kill9(stack, "worker-faults")


def test_kill9_with_four_in_flight_requeues_four_and_completes_each_once(stack):
    from reliability_figures import record, tally

    from specq.storage import db

    _worker(stack, "worker-k1", 4)
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        ids = [_submit(client, doc, LONG) for doc in DOCS]
        wait_for(lambda: _running_together(stack, ids), 180, "four jobs decoding together")
        kill9(stack, "worker-k1")
        _worker(stack, "worker-k2", 4)
        views = _done(client, ids, timeout=400)
    logs = worker_logs(stack)
    requeued = set(re.findall(r"reconciler: job (job_[0-9a-f]+) requeued", stack.log("worker-k2")))
    with db.session(stack.database_url) as s:
        counts = tally(s, ids, logs)
    assert requeued == set(ids)
    assert counts == {"submitted": 4, "completed": 4, "failed": 0, "duplicated": 0, "lost": 0}, views
    assert all(v["attempts"] == 2 for v in views)
    record("kill_worker_four_slots", counts, requeued=len(requeued))
    kill9(stack, "worker-k2")


def test_sigterm_drains_running_jobs_finish_late_ones_go_back(stack):
    """SIGTERM with two slots busy: the short job finishes within the grace period, the long one is
    requeued when the grace ends (attempt 1 used), and the next worker completes it and the job
    submitted behind them, each once."""
    from reliability_figures import tally

    from specq.storage import db

    # 600 tokens, ignore_eos: long enough to be seen decoding beside the long one on a fast CPU (150
    # tokens took ~0.5 s on an EPYC and the poll missed them; 300 without ignore_eos stopped at EOS after
    # 255 and was missed too, 2026-12-04), short enough to end within the grace on a slow one
    # grace 5 s: the 6,000-token job took 9.5 s on an idle 2-core AVX2 EPYC (2026-12-02), so a 15 s grace
    # let it finish there; the 600-token one ends well within 5 s after being seen decoding
    p = _worker(stack, "worker-drain", 2, SPECQ_DRAIN_GRACE="5")
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        short = _submit(client, DOCS[0], {"mode": "baseline", "max_tokens": 600, "seed": 1, "ignore_eos": True})
        # 6,000 tokens: far longer than the grace period on the tiny models (one thread)
        long = _submit(client, DOCS[1], {"mode": "baseline", "max_tokens": 6000, "seed": 1})
        later = _submit(client, DOCS[2], PARAMS[0])
        wait_for(lambda: _running_together(stack, [short, long]), 120, "both decoding")
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        log = stack.log("worker-drain")
        assert "draining" in log
        assert job_row(stack, short).status == "succeeded", log[-3000:]
        row = job_row(stack, long)
        assert row.status == "queued" and row.attempts == 1 and "shutting down" in (row.error or ""), log[-3000:]
        assert job_row(stack, later).status in ("queued", "succeeded")  # it may have taken the short one's slot
        _worker(stack, "worker-after", 2)
        views = _done(client, [long, later], timeout=300)
    assert [v["status"] for v in views] == ["succeeded", "succeeded"]
    assert views[0]["attempts"] == 2
    with db.session(stack.database_url) as s:
        counts = tally(s, [short, long, later], worker_logs(stack))
    assert counts == {"submitted": 3, "completed": 3, "failed": 0, "duplicated": 0, "lost": 0}
    kill9(stack, "worker-after")


def test_first_job_is_warm(stack):
    """The warm-up (a two-window specprefill job) runs before the worker is ready and is logged; the
    first job's TTFT is then within 1.3x of the second's."""
    _worker(stack, "worker-warm", 1, SPECQ_WARM_UP="true")
    log = stack.log("worker-warm")
    assert re.search(r"warm-up: a specprefill job of \d+ tokens in [2-9]\d* windows", log), log[-2000:]
    assert log.index("warm-up:") < log.index("ready: target")
    doc = "".join(f"def handler_{i}(request):\n    return request.get('field_{i}', {i})\n\n" for i in range(40))
    params = {"mode": "specprefill", "min_tokens": 0, "max_tokens": 8, "seed": 1}
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        ttfts = []
        for k in range(2):
            # the marker leads the document: no window prefix of job 2 is in job 1's caches, so the
            # comparison is warm-up against steady state, not a cache hit against a miss
            (view,) = _done(client, [_submit(client, f"# job {k}\n" + doc, params)])
            assert view["status"] == "succeeded", view
            cache = view["result"]["spec"]["cache"]
            assert cache["bytes_restored"] == 0, cache
            ttfts.append(view["result"]["timings_ms"]["ttft"])
    assert ttfts[0] <= 1.3 * ttfts[1], ttfts  # the bound: first vs second
    kill9(stack, "worker-warm")


def test_bench_serve_reports_a_workload_run_against_the_service(stack):
    """`specq bench serve`'s driver against this real service (2 slots, tiny byte-vocabulary models):
    every job streamed exactly max_tokens tokens (ignore_eos), the summary counts them, and the report
    names the code and host it ran from."""
    from specq.bench.serve import Workload, run_serve_bench

    _worker(stack, "worker-bench", 2)
    w = Workload(docs=3, doc_tokens=200, max_tokens=6, chars_per_token=1.0)
    report = run_serve_bench(stack.url, w, kind="specq", timeout=240)
    s = report["summary"]
    assert s["jobs"] == s["succeeded"] == 3 and s["output_tokens"] == 18, s
    assert all(j["output_tokens"] == 6 and j["ttft_ms"] and j["ttft_ms"] > 0 for j in report["jobs"])
    assert s["jobs_per_min"] > 0 and report["provenance"]["code"]["commit"]
    # the prefill-compute floor: each job's own prefill work, which the loop's one thread runs one job
    # at a time (the CPU scores on that thread too), so jobs/min cannot pass the rate it allows
    assert s["prefill_floor_ms_p50"] > 0 and s["jobs_per_min"] <= s["jobs_per_min_prefill_floor"], s
    assert report["provenance"]["measured_from"] == "client" and report["provenance"]["host"]["cores"] >= 1
    # where the time went: every gap of the breakdown from the jobs' server stamps and the client's clock
    from specq.bench.serve import GAPS

    b = s["breakdown_ms"]
    assert set(b) == {g for g, _, _ in GAPS} and all(v["n"] == 3 for v in b.values()), b
    assert b["stored_to_claimed"]["p50"] >= 0 and b["engine_start_to_first_token"]["p50"] > 0, b
    # and inside the engine: each part of its time to first token (loop.py `ft_*`)
    from specq.bench.serve import FIRST_TOKEN_PARTS

    assert set(s["first_token_ms"]) == {p[3:] for p in FIRST_TOKEN_PARTS} and s["first_token_ms"]["fill"] > 0, s
    # a job the worker fails (a document past the worker's 8,192-token context) is counted as an error
    # with the server's message, not as a silent zero (as the first H200 run of 2026-12-02 saw it)
    big = run_serve_bench(stack.url, Workload(docs=1, doc_tokens=9000, max_tokens=4, chars_per_token=1.0),
                          kind="specq", timeout=240)["summary"]
    assert big["succeeded"] == 0 and len(big["errors"]) == 1, big
    assert "exceeds the target's context" in big["errors"][0], big
    kill9(stack, "worker-bench")


def test_bench_serve_mixed_workload_same_seed_same_job_list(stack, tmp_path):
    """The mixed workload against this real service (2 slots): document lengths drawn log-uniform,
    output lengths uniform, Poisson arrivals, all from the seed. Two runs with one seed send the same
    job list (lengths, output lengths, offsets; the second run through `specq bench serve` itself); every
    job streams its own planned output length; each
    row carries its planned and measured lengths and the summary its per-band rows."""
    from typer.testing import CliRunner

    from specq.bench.serve import Workload, run_serve_bench
    from specq.cli import app

    _worker(stack, "worker-bench-mixed", 2)
    w = Workload(docs=4, lengths_mix="60:400", max_tokens_mix="2:6", arrival="poisson:20", seed=5,
                 chars_per_token=1.0, length_bands="150")
    runs = [run_serve_bench(stack.url, w, kind="specq", timeout=240)]
    # the second run through the command line (its flags, its printed band rows, its JSON)
    out = tmp_path / "mixed.json"
    got = CliRunner().invoke(app, ["bench", "serve", "--url", stack.url, "--docs", "4", "--lengths-mix", "60:400",
                                   "--max-tokens-mix", "2:6", "--arrival", "poisson:20", "--seed", "5",
                                   "--chars-per-token", "1", "--length-bands", "150", "--out", str(out)])
    assert got.exit_code == 0, got.output
    assert "band <150: 3/3 jobs" in got.output and "band >=150: 1/1 jobs" in got.output, got.output
    runs.append(json.loads(out.read_text()))
    plans = [[(j["planned_doc_tokens"], j["planned_max_tokens"], j["planned_offset_s"]) for j in r["jobs"]] for r in runs]
    assert plans[0] == plans[1] and len(set(plans[0])) == 4, plans
    for r in runs:
        s, jobs = r["summary"], r["jobs"]
        assert s["jobs"] == s["succeeded"] == 4, s
        assert all(j["output_tokens"] == j["planned_max_tokens"] for j in jobs), jobs
        # byte vocabulary: the prompt is the document plus the template and question
        assert all(j["planned_doc_tokens"] < j["prompt_tokens"] < j["planned_doc_tokens"] + 200 for j in jobs), jobs
        # sent at the planned offsets (within the event loop's slack)
        assert all(abs(j["sent_s"] - j["planned_offset_s"]) < 0.5 for j in jobs), jobs
        m = s["mixed"]
        assert sum(b["jobs"] for b in m["bands"].values()) == 4 and list(m["bands"]) == ["<150", ">=150"], m
        assert m["client_ttft_ms_p90"] >= s["client_ttft_ms_p50"] > 0, s
        assert s["output_tokens"] == sum(j["planned_max_tokens"] for j in jobs) and s["output_tok_s_total"] > 0, s
    kill9(stack, "worker-bench-mixed")


def test_bench_serve_documents_path_stores_each_document_once_and_reuses_it(stack):
    """`specq bench serve --documents`: 2 documents x 3 questions against a 2-slot worker, mode auto,
    all sent at t=0, then 2 other documents x 3 questions in the per-document order. Each document is
    stored once (its id on every one of its jobs), every job streams exactly max_tokens tokens, every
    result ran baseline by mode auto's stored-document rule (1b) or a prompt-cache hit, and each
    document's KV is prefilled once: its two later questions restore it from the target's prompt cache
    (4 hits per run of 6 jobs). Whether a question rode a group claim depends on whether it was queued
    when its document's first question was claimed (it is at t=0 only if the POSTs beat the claim), so
    this test does not assert it; it asserts the cache hits, which both ways give. Last, the chat path in
    the per-document order: sent in sequence, and its jobs' spec read back by the job id of its chunks."""
    from specq.bench.serve import Workload, run_serve_bench

    _worker(stack, "worker-bench-docs", 2)
    for arrival, seed in (("t0", 1), ("per-doc", 2)):
        w = Workload(docs=2, doc_tokens=300, questions=3, max_tokens=6, chars_per_token=1.0, mode="auto",
                     arrival=arrival, seed=seed, documents=True)
        report = run_serve_bench(stack.url, w, kind="specq", timeout=240)
        s, jobs = report["summary"], report["jobs"]
        assert report["path"] == s["path"] == "documents" and report["workload"]["documents"] is True
        assert s["jobs"] == s["succeeded"] == 6 and s["output_tokens"] == 36, s
        assert all(j["output_tokens"] == 6 and j["ttft_ms"] and j["ttft_ms"] > 0 for j in jobs), jobs
        firsts = sorted(j["ttft_ms"] for j in jobs if j["question"] == 0)
        assert len(firsts) == 2 and abs(s["client_ttft_ms_first_question_p50"] - sum(firsts) / 2) < 1e-2, (firsts, s)
        assert s["client_ttft_ms_later_questions_p50"] is not None, s
        assert s["upload_s"] > 0 and s["jobs_per_min"] > s["jobs_per_min_with_upload"] > 0, s
        docs = report["documents"]
        assert [d["created"] for d in docs] == [True, True] and len({d["document_id"] for d in docs}) == 2, docs
        assert [j["document_id"] for j in jobs] == [docs[j["doc"]]["document_id"] for j in jobs]
        assert all(j["job_id"].startswith("job_") and j["attempts"] == 1 and j["queue_wait_ms"] is not None
                   for j in jobs), jobs
        assert all(j["engine"]["ttft"] > 0 and "slot_wait" in j["engine"] for j in jobs)
        # mode auto on a stored document: baseline, by rule 1b (the first question) or a cache hit
        assert s["modes"] == {"baseline": 6}, s
        reasons = [j["spec"]["reason"] for j in jobs]
        assert all(r.startswith("auto: stored document") or r.startswith("auto: prompt cache hit") for r in reasons), reasons
        # one full prefill of each document, its two other questions restore it: a cache hit of (nearly)
        # the whole prompt. Not read from the reasons: a question that arrived beside its document's first
        # decided by rule 1b, then waited for that one's save and restored it (serve.reuse's doc). Nor
        # from `hit` alone: a first question can "hit" the chat template's first 16 tokens.
        restored = [j["spec"]["cache"]["target"]["reused_tokens"] >= 0.75 * j["prompt_tokens"] for j in jobs]
        for d in range(2):
            assert sum(r for j, r in zip(jobs, restored) if j["doc"] == d) == 2, (arrival, jobs)
        assert s["target_cache_hits_half"] == 4 and s["target_reused_fraction"] > 0.5, s
        if arrival == "per-doc":  # in sequence: each question sent after the one before it ended
            for d in range(2):
                mine = [j for j in jobs if j["doc"] == d]
                assert all(b["sent_s"] >= a["end_s"] for a, b in zip(mine, mine[1:])), mine
                assert not restored[mine[0]["index"]] and all(restored[j["index"]] for j in mine[1:]), jobs
                assert reasons[mine[0]["index"]].startswith("auto: stored document"), reasons  # rule 1b
                assert all(reasons[j["index"]].startswith("auto: prompt cache hit") for j in mine[1:]), reasons
        assert s["reasons"]["auto: stored document"] >= 2, s
    w = Workload(docs=2, doc_tokens=200, questions=2, max_tokens=4, chars_per_token=1.0, mode="baseline",
                 arrival="per-doc", seed=3)
    report = run_serve_bench(stack.url, w, kind="specq", timeout=240)
    s, jobs = report["summary"], report["jobs"]
    assert report["path"] == "chat" and s["succeeded"] == 4 and "documents" not in report, s
    assert all(j["job_id"].startswith("job_") and j["spec"]["mode"] == "baseline" and not j["document_id"] for j in jobs)
    assert jobs[1]["sent_s"] >= jobs[0]["end_s"] and jobs[3]["sent_s"] >= jobs[2]["end_s"], jobs
    assert s["reasons"] == {"asked for": 4}, s
    kill9(stack, "worker-bench-docs")


def test_questions_on_a_stored_document_share_one_union_prefill_in_a_worker(stack):
    """Three specprefill questions on one stored document, queued before a 3-slot worker starts: its
    group claim takes them together, the engine loop forms one group (engine/serving/groups.py), one
    question prefills head + union, the other two copy it from that slot, and every stored result says
    so; without SPECQ_GROUP_SPARSE=on (the default: off) the same three run without a group."""
    doc = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(40))
    params = {"mode": "specprefill", "min_tokens": 0, "window": 96, "max_tokens": 8, "seed": 1, "ignore_eos": True}
    questions = ["What does f3 return?", "Which function squares?", "What is f10(1)?"]
    for env, grouped in (({"SPECQ_GROUP_SPARSE": "on"}, True), ({}, False)):
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            r = client.post("/v1/documents", json={"text": doc})
            assert r.status_code in (200, 201), r.text
            doc_id = r.json()["id"]
            ids = []
            for q in questions:
                r = client.post("/v1/jobs", json={"document_id": doc_id, "question": q, "params": params})
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            _worker(stack, "worker-group", 3, **env)
            views = _done(client, ids)
        assert [v["status"] for v in views] == ["succeeded"] * 3, views
        log = stack.log("worker-group")
        assert f"group-sparse prefill {'on' if grouped else 'off'}" in log
        groups = [v["result"].get("group") for v in views]
        if grouped:
            assert all(g and g["size"] == 3 and g["layout"] == "slots" for g in groups), groups
            assert sorted(g["union_from"] == "own prefill" for g in groups) == [False, False, True], groups
            assert len({g["union_kept_tokens"] for g in groups}) == 1
            for v, g in zip(views, groups):
                kept = v["result"]["usage"]["kept_tokens"]
                if g["union_from"] == "own prefill":
                    assert g["prefilled_tokens"] == kept, g
                else:  # its tail only: head + union came from the other slot
                    assert g["prefilled_tokens"] < kept - g["union_kept_tokens"], g
            # what `specq bench serve` reports of them
            from specq.bench.serve import _groups

            summary = _groups(groups)
            assert (summary["group_members"], summary["group_union_copies"], summary["group_size_p50"]) == (3, 2, 3.0)
            assert summary["group_prefilled_tokens"] == sum(g["prefilled_tokens"] for g in groups)
        else:
            assert groups == [None] * 3, groups
        kill9(stack, "worker-group")
