"""Issue 48 item 4, end to end: shadow checks in a real worker (Redis + PostgreSQL, tiny models).

The target is a tiny random-weight model whose sparse and full-prefill answers differ (seed 2: its
greedy answers change with the context; seed 0's are one token whatever the prompt, so they always
agree). A passing evidence row posted for the pair makes mode auto run specprefill; with
SPECQ_SHADOW_RATE=1 every such job is answered in baseline too while the worker is idle.

* a shadow check in flight is cancelled the moment the worker claims a real job, which then starts
  without waiting for the shadow's answer;
* after 20 answered checks that disagree, the row is disabled: the next job runs baseline and its
  reason says why; GET /v1/evidence, `specq evidence` and /metrics show the checks.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import httpx
import pytest

from evidence_helpers import DOC, PARAMS, tiny_evidence_key
from service_helpers import Stack, base_env, free_port, pg_database, redis_pg_env, require_servers, running, wait_job
from specq.engine.policy.shadow import MIN_CHECKS

pytestmark = pytest.mark.services

#: the real job's longest wait from submission to its claim while a shadow check runs, as a share of the
#: checked job's own run (the shadow, a full prefill of the same prompt and as many tokens, takes longer:
#: a real job that waited for its answer would wait about that long)
CLAIM_SHARE = 0.5


def _row(key: dict) -> dict:
    docs = {f"{i:064x}": {"n": 5, "baseline_right": 4, "arm_right": 4, "both_right": 4} for i in range(8)}
    return {"key": key, "metric": "answer_right", "arm": "specprefill", "length": 1200, "doc_tokens": [200, 5000],
            "documents": docs, "source": "test: injected", "provenance": {"by": "test"}}


@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    require_servers()
    from specq.testing.synthetic import write_qwen2_gguf

    home = tmp_path_factory.mktemp("shadow")
    models = SimpleNamespace(target=write_qwen2_gguf(home / "target-seed2.gguf", "tiny", seed=2, n_layer=4),
                             speculator=tiny_models.speculator)
    port = free_port()
    with pg_database() as pg_url:
        env = base_env(home, models, SPECQ_API_PORT=str(port), SPECQ_CONCURRENCY="1", SPECQ_THREADS="1", SPECQ_AUTO_MIN_TOKENS="64",
                       SPECQ_CACHE_BYTES="0", SPECQ_WARM_UP="0", SPECQ_SHADOW_RATE="1",
                       **redis_pg_env(pg_url, "specq-shadow"))
        st = Stack(env=env, port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        key = tiny_evidence_key(models)
        with running(st, ("api", "api"), ("worker", "worker")):
            with httpx.Client(base_url=st.url, timeout=30) as c:
                r = c.post("/v1/evidence", json=_row(key))
                assert r.status_code == 201 and r.json()["passes"], r.text
                yield st, c


def _shadow(c: httpx.Client) -> dict:
    """The stored row's shadow checks (GET /v1/evidence)."""
    return next(r for r in c.get("/v1/evidence").json()["data"] if r["origin"] == "store")


def _checks_after(c: httpx.Client, before: int, timeout: float = 60.0) -> dict:
    """Wait until the stored row has more than `before` checks (answered or cancelled); its listing."""
    deadline = time.monotonic() + timeout
    while True:
        row = _shadow(c)
        if row["shadow"]["n"] + row["shadow"]["cancelled"] > before:
            return row
        assert time.monotonic() < deadline, row["shadow"]
        time.sleep(0.05)


def _ask(c: httpx.Client, q: str, **params) -> dict:
    job = c.post("/v1/jobs", json={"text": DOC, "question": q, "params": {**PARAMS, **params}}).json()
    done = wait_job(c, job["id"], timeout=120)
    assert done["status"] == "succeeded", done
    return done


def test_a_shadow_check_gives_way_to_real_work_at_once(stack):
    st, c = stack
    # long enough that its shadow check still runs when the real job arrives on a loaded machine (with 400 tokens
    # the check could end before the real job's claim: one failure in a targeted run at load ~2)
    first = _ask(c, "What is the value of item 3?", max_tokens=1200, ignore_eos=True)
    assert first["result"]["spec"]["mode"] == "specprefill", first["result"]["spec"]
    deadline = time.monotonic() + 30
    while f"job {first['id']}: shadow check started" not in st.log("worker"):
        assert time.monotonic() < deadline, st.log("worker")[-3000:]
        time.sleep(0.02)
    real = _ask(c, "What is the value of item 4?", max_tokens=2)
    row = _checks_after(c, 0)
    assert row["shadow"]["cancelled"] == 1 and row["shadow"]["n"] == 0, row["shadow"]
    assert f"job {real['id']}: claimed; the running shadow check was cancelled" in st.log("worker")
    took = first["result"]["timings_ms"]["total"]
    assert real["queue_wait_ms"] is not None and real["queue_wait_ms"] < CLAIM_SHARE * took, (real["queue_wait_ms"], took)
    _checks_after(c, 1)  # the real job's own check, which ran once the worker was idle again
    metrics = c.get("/metrics").text
    assert re.search(r"^specq_shadow_cancelled_total 1\.0$", metrics, re.M), metrics
    print(f"\nreal job's queue wait while a shadow check ran: {real['queue_wait_ms']:.0f} ms (the checked job ran "
          f"{took:.0f} ms)")


def test_disagreeing_checks_disable_the_row_and_auto_says_so(stack):
    st, c = stack
    row = _shadow(c)
    i = 0
    while row["shadow"]["n"] < MIN_CHECKS:
        i += 1
        assert i <= MIN_CHECKS + 5, row["shadow"]
        done = _ask(c, f"What is the value of item {i % 40}?", max_tokens=4)
        assert done["result"]["spec"]["mode"] == "specprefill", done["result"]["spec"]
        row = _checks_after(c, row["shadow"]["n"] + row["shadow"]["cancelled"])
    sh = row["shadow"]
    assert sh["disables"] and sh["agreed"] <= 2 and not row["passes"], sh  # seed 2: answers change with the context
    assert row["fails"].startswith(f"disabled: shadow checks: {sh['agreed']} of {sh['n']} answers agreed with baseline")
    after = _ask(c, "What is the value of item 11?", max_tokens=4)["result"]["spec"]
    assert after["mode"] == "baseline", after
    # the only passing row is off: the reason names it (with another passing row it would read "... does not
    # pass (1200: disabled: shadow checks: ...)", test_shadow.py)
    assert "1 disabled, 1200: shadow checks:" in after["reason"] and "< 0.8" in after["reason"], after
    metrics = c.get("/metrics").text
    assert re.search(rf"^specq_shadow_jobs_total {sh['n'] + sh['cancelled']}\.0$", metrics, re.M), metrics
    assert re.search(r'^specq_shadow_agreement\{key="all",speculator="",target=""\} ', metrics, re.M), metrics
    secs = re.search(r"^specq_shadow_seconds_total (\S+)$", metrics, re.M)
    assert secs and float(secs.group(1)) > 0.0, metrics  # every check's baseline wall time, summed
    out = st.cli("evidence")
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("store\t"))  # not a terminal: tab-separated
    assert f"\t{sh['n']} (1 cancelled)\t{sh['agreement']:.2f} (>= {sh['bound']:.2f})\t" in line, line
