"""`specq bench worker --union U:K`: the serving benchmark's worker (bench/gpu/serve.sh with
SPECQ_BENCH_UNION), which injects the emulated selection overlap (specq/testing/emulated_selection.py)
into its engine; `specq worker` and `specq up` never read that variable. Real processes, the embedded
job store and broker, tiny random-weight models on the CPU."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import httpx
import pytest

from service_helpers import Stack, base_env, free_port, running, specq_cmd, wait_job

QUESTION = "What does this file define?"
DOC = "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n" for i in range(40))
PARAMS = {"mode": "specprefill", "min_tokens": 0, "keep": 0.3, "chunk": 8, "max_tokens": 2, "draft": "none"}


def test_a_bad_union_is_refused_before_anything_loads(tmp_path):
    env = base_env(tmp_path, SimpleNamespace(target=tmp_path / "none.gguf", speculator=tmp_path / "none.gguf"))
    r = subprocess.run(specq_cmd("bench", "worker", "--union", "2:1"), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "--union" in r.stderr and "K >= 2" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.timeout(600)
def test_the_bench_worker_emulates_and_a_plain_worker_ignores_the_variable(tiny_models, tmp_path):
    results = {}
    for name, worker in (("bench", ("bench", "worker", "--union", "0.5:4")), ("plain", ("worker",))):
        home = tmp_path / name
        home.mkdir()
        port = free_port()
        # the variable set for both: only the benchmark's --union reaches the engine
        st = Stack(env=base_env(home, tiny_models, SPECQ_API_PORT=str(port), SPECQ_BENCH_UNION="0.5:4"),
                   port=port, logdir=home)
        st.cli("db", "upgrade", check=True)
        with running(st, ("api", "api"), ("worker", *worker, "--loglevel", "INFO")):
            with httpx.Client(base_url=st.url, timeout=30) as client:
                r = client.post("/v1/jobs", json={"text": DOC, "question": QUESTION, "params": PARAMS})
                assert r.status_code == 202, r.text
                job = wait_job(client, r.json()["id"], timeout=300)
        assert job["status"] == "succeeded", (job, st.log("worker")[-2000:])
        results[name] = job["result"]
    assert results["bench"]["spec"]["mode"] == "specprefill"
    assert "selection EMULATED for a benchmark: SPECQ_BENCH_UNION=0.5:4" in results["bench"]["spec"]["reason"]
    assert results["plain"]["spec"]["mode"] == "specprefill"
    assert "EMULATED" not in results["plain"]["spec"]["reason"]
