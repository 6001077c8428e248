"""The web page (/ui) as everyday use reads it (issue 45, items 1, 4, 5), in Debian's Chromium:

* dates: every batch and job time reads today's date with a time and a time zone (batch objects give
  Unix seconds, jobs ISO 8601: the page read seconds as milliseconds and showed 1/21/1970);
* progress: a running job's target prefill shows tokens i/n, the time since it started and, once
  two reports have come, the time left;
* what ran: the jobs list's `ran` column and the job page say which mode ran and why; a prompt-cache
  hit is not "the target prefilled the whole document"; the target's prefill is labelled "sparse
  prefill" only where specprefill ran (display labels: the API's phase names are unchanged).

Nothing runs a model: `specq api` alone (no worker), the jobs' states and results written through
the storage layer as a worker writes them (claim, progress, result), so each state is exact.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import httpx
import pytest

from browser_helpers import browser, open_page, require_browser
from service_helpers import Stack, base_env, free_port, running

QUESTION = "Which function adds two numbers?"
DOC = "def add(a, b):\n    return a + b\n" * 20


@pytest.fixture(scope="module")
def chromium():
    require_browser()
    with browser() as b:
        yield b


@pytest.fixture(scope="module")
def api(tiny_models, tmp_path_factory):
    home = tmp_path_factory.mktemp("ui_everyday")
    port = free_port()
    st = Stack(env=base_env(home, tiny_models, SPECQ_API_PORT=str(port), SPECQ_THREADS="1"), port=port, logdir=home)
    st.cli("db", "upgrade", check=True)
    with running(st, ("api", "api")):
        yield st


def _submit(st: Stack, params: dict | None = None) -> str:
    r = httpx.post(f"{st.url}/v1/jobs", json={"text": DOC, "question": QUESTION, "params": params or {}}, timeout=30)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _claim(st: Stack, job_id: str) -> str:
    from specq.storage import db, jobs

    with db.session(st.database_url) as s:
        return jobs.mark_running(s, job_id, "ui-test:1")


def _progress(st: Stack, job_id: str, token: str, phase: str, done: int, total: int) -> None:
    from specq.storage import db, jobs

    with db.session(st.database_url) as s:
        assert jobs.update_progress(s, job_id, phase, done, total, token=token)


def _finish(st: Stack, job_id: str, spec: dict, timings: dict, prompt_tokens: int = 1000, kept: int = 1000) -> None:
    from specq.storage import db, results

    token = _claim(st, job_id)
    with db.session(st.database_url) as s:
        assert results.save_result(s, job_id, token=token, result={
            "text": "add", "finish_reason": "stop",
            "usage": {"prompt_tokens": prompt_tokens, "kept_tokens": kept, "completion_tokens": 2},
            "timings_ms": timings, "spec": spec, "engine": {"backend": "cpu"}, "draft": {"method": "none"},
            "warnings": []})


def _today_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def _times(page, selector: str) -> list[tuple[str, str]]:
    return page.eval_on_selector_all(f"{selector} time", "els => els.map(e => [e.textContent, e.getAttribute('datetime')])")


def _assert_today(shown: list[tuple[str, str]]) -> None:
    assert shown, "no <time> drawn"
    now = datetime.now(timezone.utc)
    for text, iso in shown:
        assert text.startswith(_today_utc() + " ") and text.endswith(" UTC"), text  # date, time, zone
        assert "1970" not in text
        when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        assert abs((now - when).total_seconds()) < 600, (text, iso)


def test_batch_and_job_dates_are_today_with_a_time_zone(api, chromium):
    body = "\n".join(f'{{"custom_id": "r{i}", "text": "x = {i}\\n", "question": "q"}}' for i in range(2))
    r = httpx.post(f"{api.url}/v1/batches", content=body.encode(), headers={"content-type": "application/jsonl"}, timeout=30)
    assert r.status_code == 200, r.text
    batch = r.json()
    assert isinstance(batch["created_at"], int)  # Unix seconds, as OpenAI's batch object has them
    job_id = _submit(api)
    p = open_page(chromium, timezone_id="UTC", locale="en-US")
    p.page.goto(f"{api.url}/ui/batches")
    p.wait_ready("batches")
    p.page.wait_for_selector(f"tr[data-id='{batch['id']}'] time")
    _assert_today(_times(p.page, f"tr[data-id='{batch['id']}']"))
    p.page.goto(f"{api.url}/ui/batches/{batch['id']}")
    p.wait_ready("batch")
    _assert_today(_times(p.page, "[data-role=batch]"))
    p.page.goto(f"{api.url}/ui/jobs")
    p.wait_ready("jobs")
    p.page.wait_for_selector(f"tr[data-id='{job_id}'] time")
    _assert_today(_times(p.page, f"tr[data-id='{job_id}']"))
    p.page.goto(f"{api.url}/ui/jobs/{job_id}")
    p.wait_ready("job")
    _assert_today(_times(p.page, "[data-role=status]"))
    p.assert_clean()

    # in another zone the same instant reads that zone's date and name
    q = open_page(chromium, timezone_id="Asia/Tokyo", locale="en-US")
    q.page.goto(f"{api.url}/ui/jobs/{job_id}")
    q.wait_ready("job")
    text, iso = _times(q.page, "[data-role=status]")[0]
    tokyo = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(ZoneInfo("Asia/Tokyo"))
    assert text.startswith(tokyo.strftime("%Y-%m-%d %H:%M:%S")) and text.endswith(("GMT+9", "JST")), text
    q.assert_clean()


def test_running_prefill_shows_tokens_elapsed_and_time_left(api, chromium):
    job_id = _submit(api, {"mode": "baseline"})
    token = _claim(api, job_id)
    _progress(api, job_id, token, "sparse_prefill", 1024, 8192)
    p = open_page(chromium, timezone_id="UTC", locale="en-US")
    p.page.goto(f"{api.url}/ui/jobs")
    p.wait_ready("jobs")
    cell = f"tr[data-id='{job_id}'] [data-role=progress]"
    p.page.wait_for_selector(cell)
    first = p.page.inner_text(cell)
    assert first.startswith("prefill 1,024/8,192 tokens · ") and " elapsed" in first, first
    assert "left" not in first  # one report: no rate yet
    time.sleep(1.0)
    _progress(api, job_id, token, "sparse_prefill", 3072, 8192)
    p.page.wait_for_selector(f"{cell}:has-text('3,072/8,192')", timeout=15_000)
    later = p.page.inner_text(cell)
    assert later.startswith("prefill 3,072/8,192 tokens · ") and " elapsed · ~" in later and later.endswith(" left"), later
    # the job page shows the same
    p.page.goto(f"{api.url}/ui/jobs/{job_id}")
    p.wait_ready("job")
    assert p.page.inner_text("[data-role=status] [data-role=progress]").startswith("prefill 3,072/8,192 tokens")
    p.assert_clean()


def test_what_ran_and_why_in_the_list_and_on_the_job_page(api, chromium):
    cached = _submit(api)  # mode auto (the default) ran baseline on a prompt-cache hit
    reason = "auto: prompt cache hit: 900 of 1000 prompt tokens cached"
    _finish(api, cached, {"mode": "baseline", "reason": reason, "positions": "original", "keep": 1.0,
                          "cache": {"speculator": "off", "bytes_restored": 1000,
                                    "target": {"hit": True, "reused_tokens": 900, "prefilled_tokens": 100,
                                               "bytes_restored": 1000}}},
            {"tokenize": 5.0, "cache_restore": 40.0, "sparse_prefill": 60.0, "ttft": 110.0, "decode": 20.0, "total": 130.0})
    sparse = _submit(api, {"mode": "specprefill", "min_tokens": 0})
    _finish(api, sparse, {"mode": "specprefill", "reason": "asked for", "positions": "original", "keep": 0.3,
                          "windows": 1, "scorer": "windowed", "lookahead": 8},
            {"tokenize": 5.0, "score": 50.0, "select": 1.0, "sparse_prefill": 30.0, "ttft": 90.0, "decode": 20.0,
             "total": 110.0}, kept=300)
    full = _submit(api, {"mode": "baseline"})
    _finish(api, full, {"mode": "baseline", "reason": "asked for", "positions": "original", "keep": 1.0,
                        "cache": {"speculator": "off", "target": "off", "bytes_restored": 0}},
            {"tokenize": 5.0, "sparse_prefill": 80.0, "ttft": 90.0, "decode": 20.0, "total": 110.0})

    listed = {j["id"]: j for j in httpx.get(f"{api.url}/v1/jobs", timeout=30).json()["data"]}
    assert listed[cached]["ran"] == {"mode": "baseline", "reason": reason, "cache_hit": True}
    assert listed[sparse]["ran"] == {"mode": "specprefill", "reason": "asked for", "cache_hit": False}
    assert listed[cached]["params"]["mode"] == "auto"  # what it asked for

    p = open_page(chromium, timezone_id="UTC", locale="en-US")
    page = p.page
    page.goto(f"{api.url}/ui/jobs")
    p.wait_ready("jobs")
    headers = page.eval_on_selector_all("table.list thead th", "els => els.map(e => e.textContent)")
    assert "ran" in headers and "mode" in headers
    row = lambda jid, col: page.inner_text(f"tr[data-id='{jid}'] td:nth-child({headers.index(col) + 1})")  # noqa: E731
    page.wait_for_selector(f"tr[data-id='{cached}'] [data-role=ran] .ran-mode")
    assert row(cached, "mode") == "auto"
    assert row(cached, "ran").startswith("baseline (cache hit)") and reason in row(cached, "ran")
    assert row(sparse, "ran").startswith("specprefill") and "asked for" in row(sparse, "ran")
    assert page.get_attribute(f"tr[data-id='{cached}'] .reason", "title") == reason

    # the cache hit's page: what ran and why, what the cache held, no "prefilled the whole document"
    page.goto(f"{api.url}/ui/jobs/{cached}")
    p.wait_ready("job")
    ran = page.inner_text("[data-role=status] [data-role=ran]")
    assert ran.startswith(f"baseline — {reason}") and "900 of 1,000 prompt tokens restored, 100 prefilled" in ran, ran
    kept = page.inner_text("[data-role=kept]")
    assert "whole" not in kept and "900 of 1,000 prompt tokens were restored from the prompt cache" in kept, kept
    assert "the target prefilled the other 100" in kept
    segs = page.eval_on_selector_all("[data-role=waterfall] .seg", "els => els.map(e => [e.dataset.phase, e.title])")
    titles = dict(segs)
    assert titles["cache_restore"].startswith("cache restore: ") and titles["sparse_prefill"].startswith("prefill: ")

    # a specprefill run's prefill is the sparse one
    page.goto(f"{api.url}/ui/jobs/{sparse}")
    p.wait_ready("job")
    titles = dict(page.eval_on_selector_all("[data-role=waterfall] .seg", "els => els.map(e => [e.dataset.phase, e.title])"))
    assert titles["sparse_prefill"].startswith("sparse prefill: ") and "cache_restore" not in titles
    assert page.inner_text("[data-role=ran]").startswith("specprefill — asked for")

    # a full prefill says so
    page.goto(f"{api.url}/ui/jobs/{full}")
    p.wait_ready("job")
    page.wait_for_selector("[data-role=kept]")
    assert "the target prefilled the whole prompt (1,000 tokens)" in page.inner_text("[data-role=kept]")
    titles = dict(page.eval_on_selector_all("[data-role=waterfall] .seg", "els => els.map(e => [e.dataset.phase, e.title])"))
    assert titles["sparse_prefill"].startswith("prefill: ")
    p.assert_clean()


def test_the_jobs_list_shows_file_question_and_batch_and_fits_1280px(api, chromium):
    """Issue 45 item 8: each row says which file, which question and which batch, and the table fits a
    1,280 px window (it was ten columns of unbreakable text: an error or a reason pushed it past the
    edge) with long file names, questions, batch names, reasons and errors in it."""
    question = "Which function adds two numbers, and where is it defined in this module? " * 4  # 296 characters
    name = "a-rather-long-file-name-for-the-quarterly-report-" + "x" * 40 + ".py"
    batch_name = "nightly-summaries-of-every-quarterly-report-" + "y" * 30
    r = httpx.post(f"{api.url}/v1/batches", files=[("file", (name, DOC.encode()))],
                   data={"question": question, "metadata": '{"name": "%s"}' % batch_name}, timeout=30)
    assert r.status_code == 200, r.text
    batch_id = r.json()["id"]
    single = httpx.post(f"{api.url}/v1/jobs", json={"text": DOC, "question": "What does add return?",
                                                    "filename": "adder.py"}, timeout=30).json()["id"]
    reason = "auto: " + "the speculator's scores did not justify a sparse prefill on this prompt; " * 3
    _finish(api, single, {"mode": "baseline", "reason": reason, "positions": "original", "keep": 1.0},
            {"tokenize": 5.0, "sparse_prefill": 80.0, "ttft": 90.0, "decode": 20.0, "total": 110.0})
    failed = _submit(api)
    from specq.storage import db, jobs

    token = _claim(api, failed)
    with db.session(api.database_url) as s:
        assert jobs.mark_failed(s, failed, "the worker could not load the model: " + "a very long reason " * 20,
                                token=token)
    running = _submit(api)
    _progress(api, running, _claim(api, running), "sparse_prefill", 123_456, 1_234_567)

    # the API's rows: the file name, the question's first 120 characters and the batch's name
    listed = {j["id"]: j for j in httpx.get(f"{api.url}/v1/jobs", timeout=30).json()["data"]}
    in_batch = next(j for j in listed.values() if j["batch_id"] == batch_id)
    assert in_batch["filename"] == name and in_batch["batch_name"] == batch_name
    assert in_batch["question"] == question[:119] + "…"
    assert listed[single]["filename"] == "adder.py" and listed[single]["question"] == "What does add return?"
    assert listed[single]["batch_name"] is None

    p = open_page(chromium, width=1280, height=900, timezone_id="UTC", locale="en-US")
    page = p.page
    page.goto(f"{api.url}/ui/jobs")
    p.wait_ready("jobs")
    for jid in (in_batch["id"], single, failed, running):
        page.wait_for_selector(f"tr[data-id='{jid}']")
    page.wait_for_selector(f"tr[data-id='{single}'] [data-role=ran] .ran-mode")
    headers = page.eval_on_selector_all("table.list thead th", "els => els.map(e => e.textContent)")
    assert {"file", "question", "batch"} <= set(headers), headers

    def cell(jid: str, col: str) -> dict:
        return page.eval_on_selector(f"tr[data-id='{jid}'] td:nth-child({headers.index(col) + 1})",
                                     "e => ({text: e.innerText, width: e.getBoundingClientRect().width})")

    assert cell(in_batch["id"], "file")["text"] == name
    assert cell(in_batch["id"], "question")["text"] == question[:119] + "…"
    assert cell(in_batch["id"], "batch")["text"].startswith(batch_name)
    assert page.get_attribute(f"tr[data-id='{in_batch['id']}'] [data-role=batch]", "title") == batch_name
    assert cell(single, "file")["text"] == "adder.py" and cell(single, "question")["text"] == "What does add return?"
    for col in ("file", "question", "batch"):  # wide enough to read, not squeezed to a sliver
        assert cell(in_batch["id"], col)["width"] >= 100, col

    def overflow() -> dict:
        return page.evaluate("""() => { const t = document.querySelector('table.list'), d = document.documentElement;
            return {doc: [d.scrollWidth, d.clientWidth], table: [t.scrollWidth, t.clientWidth],
                    right: t.getBoundingClientRect().right, main: t.parentElement.getBoundingClientRect().right}; }""")

    o = overflow()
    assert o["doc"][0] <= o["doc"][1] and o["table"][0] <= o["table"][1] and o["right"] <= o["main"] + 0.5, o
    # the batch's page lists its requests in the same table, which fits too
    page.goto(f"{api.url}/ui/batches/{batch_id}")
    p.wait_ready("batch")
    page.wait_for_selector(f"tr[data-id='{in_batch['id']}']")
    o = overflow()
    assert o["doc"][0] <= o["doc"][1] and o["right"] <= o["main"] + 0.5, o
    p.assert_clean()
